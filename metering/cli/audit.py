"""``metering audit``: check that the ledger proves itself (`metering.upkeep.audit`).

One line per violation (invariant, subject, limit, window or item, what the
ledger says and what was found), then a table of the invariants and their
violations; exit 1 when there is one, 0 when the ledger is clean.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import click

from metering.cli.context import current_meter
from metering.cli.options import format_option
from metering.cli.output import when_us
from metering.cli.tables import print_table, table
from metering.domain.audit import Violation
from metering.errors import InvalidInput
from metering.pipeline.routing import worker_queues
from metering.settings import Settings
from metering.simulation import Since, parse_since
from metering.upkeep.audit import AuditOptions, AuditReport, run_audit


def _since(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Since | None:
    if value is None:
        return None
    try:
        return parse_since(value)
    except InvalidInput as exc:
        raise click.BadParameter(exc.message) from None


@click.command()
@click.option(
    "--since",
    callback=_since,
    help="Check the windows touched since: 1d, 12h ... before now, or an RFC 3339 time "
    "(from the whole ledger; nothing kept for the next run).",
)
@click.option("--full", is_flag=True, help="Check every window, from the whole ledger.")
@click.option(
    "--queues",
    is_flag=True,
    help="Also look for queued events with no result (the broker of METERING_BROKER_URL).",
)
@format_option
def audit(since: Since | None, full: bool, queues: bool, fmt: str) -> None:
    """Check the ledger: counters equal their results, hard limits within
    bounds, grants not below zero, spend equal to prices, nothing left held.

    Without --full or --since, only the windows touched since the last run
    (the first run checks everything). Exit 1 when a check fails.
    """
    meter = current_meter()
    settings = Settings.from_env()
    options = AuditOptions(
        sweep_seconds=settings.reservation_sweep_seconds,
        broker_url=settings.broker_url if queues else None,
        queues=worker_queues(settings.queues),
    )
    if isinstance(since, timedelta):
        since = meter.database.now() - since
    report = run_audit(meter, full=full, since=since, options=options)
    if fmt == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _show(report)
    if not report.ok:
        raise SystemExit(1)


def _show(report: AuditReport) -> None:
    for violation in report.violations:
        click.echo(violation_line(violation))
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    start = report.checked_from
    scope = "every window" if start is None else f"windows touched since {_when(start)}"
    windows = _counted(report.windows, "window")
    click.echo(f"{windows} checked ({scope}, up to {_when(report.checked_to)})")
    counts = report.counts()
    rows = [[name, str(n)] for name, n in counts.items()]
    print_table(table(["invariant", "violations"], rows, numeric={"violations"}))
    found = _counted(len(report.violations), "violation")
    click.echo("ok: the ledger proves itself" if report.ok else found)


def violation_line(violation: Violation) -> str:
    """One line: invariant, subject and limit, window or item, expected and found."""
    parts = [violation.invariant.value]
    if violation.subject is not None:
        parts.append(f"{violation.subject} {violation.limit}")
    if violation.window_start_us:
        parts.append(f"window {when_us(violation.window_start_us)}")
    if violation.item is not None:
        parts.append(violation.item)
    parts.append(f"expected {violation.expected}, found {violation.found}")
    return "  ".join(parts)


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
