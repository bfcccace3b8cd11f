"""What the command line prints: the console, tables, times and decisions."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Final

import click
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.instants import from_us, round_up
from metering.domain.limits import Limit
from metering.meter import Counter

EXIT_DENIED: Final = 2
# `metering result` of an event still on a queue: no worker has decided it yet.
EXIT_PENDING: Final = 3
EXIT_CODES_HELP: Final = (
    "\b\nExit codes (scripts can branch on them):\n"
    "  0  allowed (or overage on a soft limit)\n  2  denied\n  1  error"
)
SECOND: Final = timedelta(seconds=1)
# Wider than any table: piped output is never wrapped or cut.
PIPE_WIDTH: Final = 1_000_000
# Columns whose values must read whole: ids, subjects and names.
KEY_COLUMNS: Final = frozenset({"id", "event id", "subject", "limit", "name", "endpoint"})
# What another column keeps at least beside the keys (its words fold below that).
OTHER_COLUMN_MIN_WIDTH: Final = 4
LABEL_COLOURS: Final = {
    "allowed": "green",
    "overage": "yellow",
    "fits": "cyan",
    "would_deny": "magenta",
}
NUMERIC_COLUMNS: Final = frozenset({"maximum", "used", "denied events", "denied cost"})
COUNTER_COLUMNS: Final = (
    "subject",
    "limit",
    "window start",
    "window end",
    "used",
    "denied events",
    "denied cost",
    "first denial",
)


# -- the console and tables ----------------------------------------------------


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def console() -> Console:
    """The console for stdout: the terminal's width, or unlimited when piped.

    Piped output is never wrapped or cut, so scripts see every value whole.
    """
    return Console() if stdout_is_terminal() else Console(width=PIPE_WIDTH)


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    title: str = "",
    *,
    numeric: Collection[str] = NUMERIC_COLUMNS,
) -> Table:
    """A table of ``rows``; None shows as ``-``; ``numeric`` columns are right-aligned.

    Nothing is ever cut short: a value too long for its column folds onto the
    next line. Key columns (ids, subjects, names: `KEY_COLUMNS`) keep the
    width of their longest value while the other columns wrap, unless even
    the keys cannot fit side by side on the console: then they fold too.
    """
    cells = [[Text("-" if value is None else str(value)) for value in row] for row in rows]
    widths = {
        index: max([len(column), *(row[index].cell_len for row in cells)])
        for index, column in enumerate(columns)
        if column in KEY_COLUMNS
    }
    others = len(columns) - len(widths)
    borders = 3 * len(columns) + 1
    needed = sum(widths.values()) + borders + OTHER_COLUMN_MIN_WIDTH * others
    keys_fit = needed <= console().width
    shown = Table(title=title or None, title_justify="left")
    for index, column in enumerate(columns):
        justify: JustifyMethod = "right" if column in numeric else "left"
        width = widths.get(index) if keys_fit else None
        shown.add_column(column, justify=justify, overflow="fold", width=width)
    for row in cells:
        shown.add_row(*row)
    return shown


def print_table(shown: Table) -> None:
    """Print a table on stdout."""
    console().print(shown)


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
    """One line: ``name: max N per P, algorithm, ... lateness L``."""
    parts = [f"{limit.name}: max {limit.maximum} per {limit.period}", limit.algorithm]
    if limit.algorithm == "fixed_window":
        parts.append(f"{limit.window} window")
    parts.append(limit.enforcement)
    if limit.thresholds:
        parts.append("thresholds " + "/".join(f"{t}%" for t in limit.thresholds))
    if limit.thresholds_units:
        parts.append("threshold units " + "/".join(str(t) for t in limit.thresholds_units))
    return ", ".join([*parts, f"lateness {limit.lateness}"])


def counters_table(counters: Sequence[Counter], title: str = "") -> Table:
    """Counters, one row per subject, limit and window."""
    rows: list[list[object]] = [
        [
            c.subject,
            c.limit,
            when(c.window_start),
            when(c.window_end),
            c.used,
            c.denied_count,
            c.denied_cost,
            when(c.first_denied_at),
        ]
        for c in counters
    ]
    return table(COUNTER_COLUMNS, rows, title)


def _label(text: str) -> str:
    return click.style(text, fg=LABEL_COLOURS.get(text.split()[0], "red"), bold=True)


def _charge_line(charge: ChargeDecision, label: str) -> str:
    line = f"{_label(label)}  {charge.subject} {charge.limit}  used {charge.used}/{charge.maximum}"
    drawn = sum(amount for _, amount in charge.grants)
    if drawn and charge.allowed:
        line += f" ({drawn} from grants)"
    resets = when(charge.resets_at)
    if not charge.allowed and charge.retry_at is None:
        return f"{line}, cost {charge.cost} is more than the maximum: never fits"
    if not charge.allowed:
        return f"{line}, retry at {when(charge.retry_at)}"
    if charge.outcome == "would_deny":
        return f"{line}, would be denied (shadow: nothing consumed), resets {resets}"
    if charge.overage:
        return f"{line}, {charge.overage} over, resets {resets}"
    return f"{line}, {charge.remaining} left, resets {resets}"


def _verdict_line(decision: Decision) -> str:
    if decision.outcome == "denied":
        line = f"{_label('denied by ' + ', '.join(decision.denied_by))}  nothing consumed"
        retry = decision.retry_at
        return line + (f", retry at {when(retry)}" if retry else "")
    over = [c.limit for c in decision.charges if c.overage]
    note = f", over the maximum of {', '.join(over)}" if decision.outcome == "overage" else ""
    return f"{_label(decision.outcome)}  {len(decision.charges)} charges consumed{note}"


def decision_lines(decision: Decision) -> list[str]:
    """A decision as text: a line per charge, and a verdict for a stacked event."""
    if decision.outcome == "rejected":
        lines = [f"{_label('rejected')}  event {decision.event_id}: {decision.reason}"]
    elif len(decision.charges) == 1:
        lines = [_charge_line(decision.charges[0], decision.outcome)]
    else:
        denied = decision.outcome == "denied"
        lines = [
            _charge_line(c, "fits" if denied and c.allowed else c.outcome) for c in decision.charges
        ]
        lines.append(_verdict_line(decision))
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
        for line in decision_lines(decision):
            click.echo(line, err=err)
    if not decision.allowed:
        click.get_current_context().exit(EXIT_DENIED)
