"""``metering consume|check|result|counters|seats|reset``: decisions and counters."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Any, Final

import click

from metering.cli.context import CliError, current_meter
from metering.cli.options import (
    EventOptions,
    decision_options,
    format_option,
    parse_datetime,
)
from metering.cli.output import (
    EXIT_CODES_HELP,
    EXIT_PENDING,
    counters_table,
    report_decision,
    spend_currencies,
    usage_table,
)
from metering.cli.tables import print_table
from metering.errors import BrokerUnavailable
from metering.settings import broker_url
from metering.storage.queue_state import is_queued
from metering.usage.counters import Counter
from metering.usage.current import usage_dict


@click.command(epilog=EXIT_CODES_HELP)
@decision_options
@click.option("--event-id", help="Idempotency key; a repeated id returns the stored result.")
def consume(event: EventOptions, event_id: str | None) -> None:
    """Decide and record a usage event: SUBJECT LIMIT, or several --charge."""
    decision = current_meter().consume(
        charges=event.charges,
        event_id=event_id,
        occurred_at=event.occurred_at,
        metadata=event.metadata,
    )
    report_decision(decision, event.fmt)


@click.command(epilog=EXIT_CODES_HELP)
@decision_options
def check(event: EventOptions) -> None:
    """What consume would decide now; consumes and records nothing."""
    meter = current_meter()
    decision = meter.check(
        charges=event.charges, occurred_at=event.occurred_at, metadata=event.metadata
    )
    report_decision(decision, event.fmt)


RESULT_EXIT_CODES_HELP: Final = EXIT_CODES_HELP.replace(
    "  2  denied", "  2  denied or rejected\n  3  pending: still queued, not decided yet"
).replace("  1  error", "  1  error, or no result and not queued")


@click.command(epilog=RESULT_EXIT_CODES_HELP)
@click.argument("event_id")
@click.option(
    "--broker",
    envvar="METERING_BROKER_URL",
    help="Where a queued event waits. Default: the embedded broker.",
)
@format_option
def result(event_id: str, broker: str | None, fmt: str) -> None:
    """Show the stored result of the event EVENT_ID, or that it is pending.

    An event without a result that is still on a queue (waiting, or taken by
    a worker and not yet applied) is pending: exit 3.
    """
    meter = current_meter()
    found = meter.result(event_id)
    if found is None:
        try:
            queued = is_queued(broker_url(broker), event_id)
        except BrokerUnavailable as exc:
            raise CliError(f"no result for event {event_id}; {exc}") from None
        if queued:
            report_pending(event_id, fmt)
            return
        # Not queued: a worker may have applied it since the first look.
        found = meter.result(event_id)
    if found is None:
        raise CliError(f"no result for event {event_id}")
    report_decision(found, fmt)


def report_pending(event_id: str, fmt: str) -> None:
    """Say the event is still queued, and exit `EXIT_PENDING`."""
    if fmt == "json":
        click.echo(json.dumps({"event_id": event_id, "outcome": "pending"}, indent=2))
    else:
        label = click.style("pending", fg="cyan", bold=True)
        click.echo(f"{label}  event {event_id} is queued: no worker has decided it yet")
    click.get_current_context().exit(EXIT_PENDING)


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
    meter = current_meter()
    found = meter.counters(subject=subject, limit=limit)
    if fmt == "json":
        click.echo(json.dumps([_counter_json(c) for c in found], indent=2))
    elif not found:
        click.echo("no counters")
    else:
        print_table(counters_table(found, currencies=spend_currencies(meter.list_limits())))


@click.command()
@click.argument("subject")
@format_option
def usage(subject: str, fmt: str) -> None:
    """SUBJECT's limits now: used, left, and when they run out at its recent rate."""
    found = current_meter().usage(subject)
    if fmt == "json":
        click.echo(json.dumps([usage_dict(u) for u in found], indent=2))
    elif not found:
        click.echo("no usage")
    else:
        print_table(usage_table(found))


@click.command()
@click.argument("subject")
@click.argument("limit")
@click.option(
    "--at", "at", metavar="TIME", callback=parse_datetime, help="Default now: RFC 3339, naive UTC."
)
@format_option
def seats(subject: str, limit: str, at: datetime | None, fmt: str) -> None:
    """The values holding a seat of a distinct LIMIT in SUBJECT's window, in order."""
    found = current_meter().seats(subject, limit, at)
    if fmt == "json":
        click.echo(json.dumps(found))
    else:
        click.echo("\n".join(found) if found else "no seats held")
