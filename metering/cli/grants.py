"""``metering grants add|list|recurring``, ``metering void`` and ``metering corrections list``.

A grant tops up a subject's allowance for a fixed-window limit; a void
reverses an allowed event's charges after the fact. Both are idempotent by
their id (``--id``, ``--correction-id``): running the same command again
changes nothing and says so, which makes them safe to retry from scripts.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Final

import click

from metering.allowances import Correction, Grant, RecurringGrant
from metering.cli.context import SentenceGroup, current_meter
from metering.cli.entitlements import from_option, limit_argument, listing_filters
from metering.cli.options import format_option, parse_datetime
from metering.cli.output import echo_listing, when
from metering.domain.grants import DEFAULT_PRIORITY
from metering.domain.limits import parse_period
from metering.errors import InvalidInput

GRANT_COLUMNS: Final = (
    "id",
    "subject",
    "limit",
    "amount",
    "used",
    "left",
    "from",
    "expires",
    "reason",
)
CORRECTION_COLUMNS: Final = ("id", "event id", "voided at", "reason", "charges")
GRANT_NUMBERS: Final = frozenset({"amount", "used", "left"})
DEFAULT_CORRECTIONS: Final = 1000
MAX_CORRECTIONS: Final = 100_000


def describe_grant(grant: Grant) -> str:
    """``g-1: org-42 api_calls 500 (0 used, 500 left), from ..., expires ...``."""
    expires = when(grant.expires_at) if grant.expires_at else "never"
    line = (
        f"{grant.grant_id}: {grant.subject} {grant.limit} {grant.amount} "
        f"({grant.used} used, {grant.left} left), from {when(grant.effective_from)}, "
        f"expires {expires}"
    )
    if grant.recurring_grant_id is not None:
        line += f", issue {grant.issue} of recurring grant {grant.recurring_grant_id}"
    return f"{line}, reason: {grant.reason}" if grant.reason else line


def describe_recurring(found: RecurringGrant) -> str:
    """``monthly: org-42 api_calls 500 every 1mo, rollover up to 200, next issue ...``."""
    line = f"{found.grant_id}: {found.subject} {found.limit} {found.amount} every {found.every}"
    if found.rollover_max:
        line += f", rollover up to {found.rollover_max}"
    line += f", priority {found.priority}"
    if found.low is not None:
        line += f", low at {found.low}"
    if found.next_issue_at is not None:
        line += f", issue {found.last_issue + 1} at {when(found.next_issue_at)}"
    else:
        line += f", {found.last_issue} issued, no more"
    return line


@click.group(cls=SentenceGroup)
def grants() -> None:
    """Top up a subject's allowance for a limit (a fixed window)."""


@grants.command("add")
@click.argument("subject")
@limit_argument
@click.argument("amount", type=int)
@click.option(
    "--expires",
    "expires_at",
    metavar="TIME",
    callback=parse_datetime,
    help="When what is left is gone (default never); RFC 3339, naive: UTC.",
)
@click.option("--id", "grant_id", help="Its id: the same grant again changes nothing.")
@from_option("the grant")
@click.option("--reason", help="Why it was given (kept with it).")
@click.option(
    "--every",
    metavar="PERIOD",
    help="Recurring: a new issue every PERIOD (1mo, 7d ...), the first now.",
)
@click.option(
    "--rollover-max",
    type=int,
    metavar="N",
    help="With --every: carry up to N unused to the next issue (default 0).",
)
@click.option(
    "--priority",
    type=int,
    default=DEFAULT_PRIORITY,
    show_default=True,
    help="Drawn lowest number first, then earliest expiring.",
)
@click.option(
    "--until",
    metavar="TIME",
    callback=parse_datetime,
    help="With --every: no issue from TIME on; RFC 3339, naive: UTC.",
)
@click.option(
    "--low", metavar="N|P%", help="grant.low when N units or P% are left (once per issue)."
)
@format_option
def grants_add(
    subject: str,
    limit: str,
    amount: int,
    expires_at: datetime | None,
    grant_id: str | None,
    effective_from: datetime | None,
    reason: str | None,
    every: str | None,
    rollover_max: int | None,
    priority: int,
    until: datetime | None,
    low: str | None,
    fmt: str,
) -> None:
    """Give SUBJECT AMOUNT more of LIMIT, on top of its maximum.

    A charge draws on the window's own allowance first, then on grants, by
    priority, then the earliest expiring first. A new window does not renew
    a grant; a recurring one (--every) is issued again each period, with up
    to --rollover-max of what the last issue left.
    """
    grant = current_meter().grant(
        subject,
        limit,
        amount,
        expires_at,
        grant_id=grant_id,
        effective_from=effective_from,
        reason=reason,
        every=every,
        rollover_max=rollover_max,
        priority=priority,
        until=until,
        low=low,
    )
    if fmt == "json":
        click.echo(json.dumps({**grant.to_dict(), "duplicate": grant.duplicate}, indent=2))
    elif grant.duplicate:
        click.echo(f"already granted, nothing changed: {describe_grant(grant)}")
    else:
        click.echo(f"granted {describe_grant(grant)}")


@grants.command("list")
@listing_filters
def grants_list(subject: str | None, limit: str | None, fmt: str) -> None:
    """Grants, with what is used and left of each (at most 1,000)."""
    found = current_meter().grants(subject, limit)
    echo_listing(found, fmt, "no grants", GRANT_COLUMNS, _grant_row, numeric=GRANT_NUMBERS)


def _grant_row(g: Grant) -> list[object]:
    return [
        g.grant_id,
        g.subject,
        g.limit,
        g.amount,
        g.used,
        g.left,
        when(g.effective_from),
        when(g.expires_at) if g.expires_at else "never",
        g.reason,
    ]


@grants.command("recurring")
@listing_filters
def grants_recurring(subject: str | None, limit: str | None, fmt: str) -> None:
    """Recurring grants: their terms, last issue and when the next is due."""
    found = current_meter().recurring_grants(subject, limit)
    if fmt == "json":
        click.echo(json.dumps([r.to_dict() for r in found], indent=2))
    elif not found:
        click.echo("no recurring grants")
    else:
        for recurring in found:
            click.echo(describe_recurring(recurring))


def parse_horizon(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    """``--horizon 35d``: a period in seconds, minutes, hours, days or weeks."""
    if value is None:
        return None
    try:
        period = parse_period(value, field_name="horizon")
    except InvalidInput as exc:
        raise click.BadParameter(exc.message) from None
    if period.is_calendar_months:
        raise click.BadParameter("use seconds, minutes, hours, days or weeks (35d)")
    return period.seconds


def _charge_lines(correction: Correction) -> list[str]:
    lines = []
    for subject, limit, cost, window_start, given in correction.charges:
        window = f"in the window from {when(window_start)}" if window_start else "to the bucket"
        line = f"  {subject} {limit}: {cost} given back {window}"
        if given:
            line += ", grants restored: " + ", ".join(f"{g} {a}" for g, a in given)
        lines.append(line)
    return lines


@click.command("void")
@click.argument("event_id")
@click.option("--reason", required=True, help="Why (kept with the correction).")
@click.option("--correction-id", help="Its id: voiding again with it changes nothing.")
@click.option(
    "--horizon",
    "horizon_seconds",
    metavar="PERIOD",
    callback=parse_horizon,
    help="How old an event may be voided (default 35d).",
)
@format_option
def void(
    event_id: str, reason: str, correction_id: str | None, horizon_seconds: int | None, fmt: str
) -> None:
    """Reverse an allowed event's charges, in their own windows.

    The event's result stays as it was decided; a correction records the
    void and what it gave back (grants still active get their amounts
    back). Voiding an event again changes nothing. A denied or rejected
    event consumed nothing and cannot be voided.
    """
    correction = current_meter().void(
        event_id, reason, correction_id=correction_id, horizon_seconds=horizon_seconds
    )
    if fmt == "json":
        document = {**correction.to_dict(), "duplicate": correction.duplicate}
        click.echo(json.dumps(document, indent=2))
    elif correction.duplicate:
        click.echo(
            f"event {correction.event_id} was already voided "
            f"(correction {correction.correction_id}); nothing changed"
        )
    else:
        click.echo(f"voided {correction.event_id} (correction {correction.correction_id})")
        for line in _charge_lines(correction):
            click.echo(line)


@click.group(cls=SentenceGroup)
def corrections() -> None:
    """Voided events."""


@corrections.command("list")
@click.option(
    "--count",
    type=click.IntRange(1, MAX_CORRECTIONS),
    default=DEFAULT_CORRECTIONS,
    show_default=True,
    help="How many, oldest first.",
)
@format_option
def corrections_list(count: int, fmt: str) -> None:
    """Voided events, oldest first, with what each gave back."""
    found = current_meter().corrections(count)
    echo_listing(found, fmt, "no corrections", CORRECTION_COLUMNS, _correction_row)


def _correction_row(c: Correction) -> list[object]:
    return [
        c.correction_id,
        c.event_id,
        when(c.created_at),
        c.reason,
        "; ".join(f"{s} {lim} {cost}" for s, lim, cost, _, _ in c.charges),
    ]
