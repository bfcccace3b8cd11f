"""``metering consume|check|result|counters|reset``: decisions and counters."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Any

import click

from metering.cli.context import CliError, current_meter
from metering.cli.options import ChargeTuple, chosen_charges, decision_options, format_option
from metering.cli.output import EXIT_CODES_HELP, counters_table, print_table, report_decision
from metering.meter import Counter


@click.command(epilog=EXIT_CODES_HELP)
@decision_options
@click.option("--event-id", help="Idempotency key; a repeated id returns the stored result.")
def consume(
    subject: str | None,
    limit: str | None,
    cost: int | None,
    charges: list[ChargeTuple],
    occurred_at: datetime | None,
    fmt: str,
    event_id: str | None,
) -> None:
    """Decide and record a usage event: SUBJECT LIMIT, or several --charge."""
    wanted = chosen_charges(subject, limit, cost, charges)
    decision = current_meter().consume(charges=wanted, event_id=event_id, occurred_at=occurred_at)
    report_decision(decision, fmt)


@click.command(epilog=EXIT_CODES_HELP)
@decision_options
def check(
    subject: str | None,
    limit: str | None,
    cost: int | None,
    charges: list[ChargeTuple],
    occurred_at: datetime | None,
    fmt: str,
) -> None:
    """What consume would decide now; consumes and records nothing."""
    wanted = chosen_charges(subject, limit, cost, charges)
    report_decision(current_meter().check(charges=wanted, occurred_at=occurred_at), fmt)


@click.command(epilog=EXIT_CODES_HELP.replace("  2  denied", "  2  denied or rejected"))
@click.argument("event_id")
@format_option
def result(event_id: str, fmt: str) -> None:
    """Show the stored result of the event EVENT_ID."""
    found = current_meter().result(event_id)
    if found is None:
        raise CliError(f"no result for event {event_id}")
    report_decision(found, fmt)


@click.command()
@click.option("--subject", help="Clear this subject's counters.")
@click.option("--limit", help="Clear this limit's counters.")
def reset(subject: str | None, limit: str | None) -> None:
    """Clear current counters of a subject and/or a limit (past windows stay)."""
    if subject is None and limit is None:
        raise click.UsageError("give --subject, --limit or both")
    cleared = current_meter().reset(subject=subject, limit=limit)
    click.echo(f"cleared {cleared} counter{'' if cleared == 1 else 's'}")


def _counter_json(counter: Counter) -> dict[str, Any]:
    fields = asdict(counter).items()
    return {key: v.isoformat() if isinstance(v, datetime) else v for key, v in fields}


@click.command()
@click.option("--subject", help="Only this subject.")
@click.option("--limit", help="Only this limit.")
@format_option
def counters(subject: str | None, limit: str | None, fmt: str) -> None:
    """Show counters, every window, oldest first."""
    found = current_meter().counters(subject=subject, limit=limit)
    if fmt == "json":
        click.echo(json.dumps([_counter_json(c) for c in found], indent=2))
    elif not found:
        click.echo("no counters")
    else:
        print_table(counters_table(found))
