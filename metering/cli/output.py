"""What the command line prints: listings, times, limits, counters and decisions."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime, time, timedelta
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

import click
from rich.table import Table

from metering.cli.context import current_meter
from metering.cli.tables import NUMERIC_COLUMNS, print_table, table
from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.instants import from_us, round_up
from metering.domain.kinds import kind_phrases
from metering.domain.limits import Limit
from metering.domain.money import format_amount

if TYPE_CHECKING:  # the counters module loads the database stack
    from metering.usage.counters import Counter
    from metering.usage.current import LimitUsage

EXIT_DENIED: Final = 2
# `metering result` of an event still on a queue: no worker has decided it yet.
EXIT_PENDING: Final = 3
EXIT_CODES_HELP: Final = (
    "\b\nExit codes (scripts can branch on them):\n"
    "  0  allowed (or overage on a soft limit)\n  2  denied\n  1  error"
)
SECOND: Final = timedelta(seconds=1)
MINUTE: Final = timedelta(minutes=1)
LABEL_COLOURS: Final = {
    "allowed": "green",
    "overage": "yellow",
    "fits": "cyan",
    "would_deny": "magenta",
    "ahead_of_pace": "yellow",
}
# A counter's window in one cell, its times in UTC (`window_span`).
COUNTER_COLUMNS: Final = (
    "subject",
    "limit",
    "window (UTC)",
    "used",
    "denied events",
    "denied cost",
    "first denial",
)
DAY: Final = timedelta(days=1)
# Between a window's ends (an en dash: one column, and not a minus).
DASH: Final = "\u2013"


# -- listings ----------------------------------------------------


class Listed(Protocol):
    """An item of a listing: its JSON form."""

    def to_dict(self) -> Mapping[str, object]: ...


ListedT = TypeVar("ListedT", bound=Listed)


def echo_listing(
    found: Sequence[ListedT],
    fmt: str,
    empty: str,
    columns: Sequence[str],
    row: Callable[[ListedT], Sequence[object]],
    *,
    numeric: Collection[str] = NUMERIC_COLUMNS,
) -> None:
    """A listing on stdout: JSON (each item's ``to_dict``), the line ``empty``
    when there is nothing, else a table of ``columns`` (a ``row`` per item)."""
    if fmt == "json":
        click.echo(json.dumps([item.to_dict() for item in found], indent=2))
    elif not found:
        click.echo(empty)
    else:
        print_table(table(columns, [row(item) for item in found], numeric=numeric))


# -- times -----------------------------------------------------------------------


def when(moment: datetime | None) -> str:
    """``YYYY-MM-DD HH:MM:SS UTC``, rounded up to the second (`round_up`: the
    one rule for every time shown, so a window's end and the reset a decision
    promises read the same, and never earlier than they are)."""
    if moment is None:
        return "-"
    return round_up(moment, SECOND).strftime("%Y-%m-%d %H:%M:%S UTC")


def when_us(at_us: int | None) -> str:
    """`when` of an instant in microseconds since the epoch."""
    return when(None if at_us is None else from_us(at_us))


def iso_us(at_us: int) -> str:
    """An instant in microseconds as ISO 8601, rounded up to the second as `when` does."""
    return round_up(from_us(at_us), SECOND).isoformat(timespec="seconds")


# -- limits, counters and decisions ----------------------------------------------------


def describe_limit(limit: Limit) -> str:
    """One line: ``name: max N per P, algorithm, ... lateness L``
    (``name: max N held at once, concurrent, hard`` for a floating license)."""
    if limit.algorithm == "concurrent":
        return f"{limit.name}: max {limit.maximum} held at once, concurrent, {limit.enforcement}"
    maximum = str(limit.maximum)
    if limit.currency:
        maximum = f"{format_amount(limit.maximum, limit.currency)} {limit.currency}"
    parts = [f"{limit.name}: max {maximum} per {limit.period}", limit.algorithm]
    if limit.algorithm == "fixed_window":
        parts.append(f"{limit.window} window")
    parts += [*kind_phrases(limit), limit.enforcement]
    if limit.thresholds:
        parts.append("thresholds " + "/".join(f"{t}%" for t in limit.thresholds))
    if limit.thresholds_units:
        parts.append("threshold units " + "/".join(str(t) for t in limit.thresholds_units))
    if limit.forecast_lead:
        parts.append(f"forecast lead {limit.forecast_lead}")
    if limit.breaker:
        floor = f" floor {limit.breaker_floor:g}/s" if limit.breaker_floor else ""
        held = f" quarantine max {limit.quarantine_max}" if limit.quarantine_max else ""
        parts.append(f"breaker {limit.breaker}{floor}{held}")
    return ", ".join([*parts, f"lateness {limit.lateness}"])


def spend_currencies(limits: Iterable[Limit]) -> dict[str, str]:
    """Each spend limit's currency, by its name: its figures show as money."""
    return {limit.name: limit.currency for limit in limits if limit.currency}


def money(units: int, limit: str, currencies: Mapping[str, str]) -> str:
    """A figure of ``limit``: ``0.04 USD`` for a spend limit's minor units, else the number."""
    currency = currencies.get(limit)
    return f"{format_amount(units, currency)} {currency}" if currency else str(units)


def counters_table(
    counters: Sequence[Counter], title: str = "", currencies: Mapping[str, str] | None = None
) -> Table:
    """Counters, one row per subject, limit and window (a spend limit's in its currency)."""
    spend = currencies or {}
    rows: list[list[object]] = [
        [
            c.subject,
            c.limit,
            _zoned(window_span(c.window_start, c.window_end), c.local_window),
            money(c.used, c.limit, spend),
            c.denied_count,
            money(c.denied_cost, c.limit, spend),
            _within(c.first_denied_at, c.window_start),
        ]
        for c in counters
    ]
    return table(COUNTER_COLUMNS, rows, title)


def _zoned(span: str | None, local: str | None) -> str | None:
    """A window's UTC span, with its local label for a subject with a time zone."""
    return span if local is None else f"{span} (local {local})"


USAGE_COLUMNS: Final = (
    "limit",
    "used",
    "maximum",
    "remaining",
    "grants left",
    "resets at",
    "runs out at",
)


def usage_table(found: Sequence[LimitUsage]) -> Table:
    """A subject's limits now (`metering.usage.current.LimitUsage`): ``runs out at``
    is the forecast at the recent rate, ``-`` when not before the reset; a
    zoned window's reset is followed by the window's local label."""
    rows: list[list[object]] = [
        [
            u.limit.name,
            u.used,
            u.limit.maximum,
            u.remaining,
            u.grants_left,
            _zoned(when(u.resets_at), u.local_window),
            when(u.exhausts_at) if u.exhausts_at is not None else None,
        ]
        for u in found
    ]
    return table(USAGE_COLUMNS, rows)


def window_span(
    start: datetime | None, end: datetime | None, unit: timedelta = SECOND
) -> str | None:
    """A window in one table cell, in UTC, its ends rounded up to ``unit`` (a
    second, a minute; `round_up`), joined by an en dash: ``2026-11`` for a
    calendar month, ``2026-11-26`` for a day, ``2026-11-23 to 2026-11-29``
    for whole days (the last day included), ``2026-11-26 09:33:40 to
    09:34:40`` within a day, else both ends whole. None (shown ``-``) for a
    token bucket, which has no window."""
    if start is None or end is None:
        return None
    first, last = round_up(start, unit), round_up(end, unit)
    clock = "%H:%M:%S" if unit < MINUTE else "%H:%M"
    if first.time() == last.time() == time(0):
        months = (last.year - first.year) * 12 + last.month - first.month
        if first.day == last.day == 1 and months >= 1:
            final = last - DAY
            return f"{first:%Y-%m}" if months == 1 else f"{first:%Y-%m}{DASH}{final:%Y-%m}"
        if last - first == DAY:
            return f"{first:%Y-%m-%d}"
        return f"{first:%Y-%m-%d}{DASH}{last - DAY:%Y-%m-%d}"
    if first.date() == last.date():
        return f"{first:%Y-%m-%d} {first:{clock}}{DASH}{last:{clock}}"
    return f"{first:%Y-%m-%d} {first:{clock}}{DASH}{last:%Y-%m-%d} {last:{clock}}"


def _within(moment: datetime | None, start: datetime | None) -> str | None:
    """An instant in a window's row: its time (UTC) alone when on the day the
    window starts, else its date too."""
    if moment is None:
        return None
    shown = round_up(moment, SECOND)
    if start is not None and shown.date() == round_up(start, SECOND).date():
        return f"{shown:%H:%M:%S}"
    return f"{shown:%Y-%m-%d %H:%M:%S}"


def _label(text: str) -> str:
    return click.style(text, fg=LABEL_COLOURS.get(text.split()[0], "red"), bold=True)


def _charge_line(charge: ChargeDecision, label: str, currencies: Mapping[str, str]) -> str:
    def shown(units: int) -> str:
        return money(units, charge.limit, currencies)

    used = f"{charge.used}/{shown(charge.maximum)}"
    if charge.limit in currencies:  # 0.04/0.05 USD: the currency once
        used = f"{format_amount(charge.used, currencies[charge.limit])}/{shown(charge.maximum)}"
    line = f"{_label(label)}  {charge.subject} {charge.limit}  used {used}"
    drawn = sum(amount for _, amount in charge.grants)
    if drawn and charge.allowed:
        line += f" ({shown(drawn)} from grants)"
    resets = when(charge.resets_at)
    if not charge.allowed and charge.retry_at is None:
        return f"{line}, cost {shown(charge.cost)} is more than the maximum: never fits"
    if not charge.allowed:
        return f"{line}, retry at {when(charge.retry_at)}"
    if charge.outcome == "would_deny":
        return f"{line}, would be denied (shadow: nothing consumed), resets {resets}"
    if charge.outcome == "ahead_of_pace":
        return f"{line}, ahead of its pace (not billed), resets {resets}"
    if charge.overage:
        return f"{line}, {shown(charge.overage)} over, resets {resets}"
    return f"{line}, {shown(charge.remaining)} left, resets {resets}"


def _verdict_line(decision: Decision) -> str:
    if decision.outcome == "denied":
        line = f"{_label('denied by ' + ', '.join(decision.denied_by))}  nothing consumed"
        retry = decision.retry_at
        return line + (f", retry at {when(retry)}" if retry else "")
    over = [c.limit for c in decision.charges if c.overage]
    note = f", over the maximum of {', '.join(over)}" if decision.outcome == "overage" else ""
    return f"{_label(decision.outcome)}  {len(decision.charges)} charges consumed{note}"


def decision_lines(decision: Decision, currencies: Mapping[str, str] | None = None) -> list[str]:
    """A decision as text: a line per charge, and a verdict for a stacked
    event; the figures of the spend limits in ``currencies`` as money."""
    spend = currencies or {}
    if decision.outcome == "rejected":
        lines = [f"{_label('rejected')}  event {decision.event_id}: {decision.reason}"]
    elif len(decision.charges) == 1:
        lines = [_charge_line(decision.charges[0], decision.outcome, spend)]
    else:
        denied = decision.outcome == "denied"
        lines = [
            _charge_line(c, "fits" if denied and c.allowed else c.outcome, spend)
            for c in decision.charges
        ]
        lines.append(_verdict_line(decision))
    if decision.outcome != "rejected" and decision.reason:
        lines[-1] += f"  ({decision.reason})"  # an import's marker (docs/import.md)
    if decision.duplicate:
        lines[-1] += "  (duplicate)"
    return lines


def report_decision(decision: Decision, fmt: str, *, err: bool = False) -> None:
    """Print a decision (on stderr with ``err``) and exit with its code:
    0 allowed/overage, 2 denied/rejected."""
    if fmt == "json":
        document = {**decision.to_dict(), "duplicate": decision.duplicate}
        click.echo(json.dumps(document, indent=2), err=err)
    else:
        currencies = spend_currencies(current_meter().list_limits())
        for line in decision_lines(decision, currencies):
            click.echo(line, err=err)
    if not decision.allowed:
        click.get_current_context().exit(EXIT_DENIED)
