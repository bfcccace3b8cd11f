"""What the command line prints: the console, tables, times and decisions."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, time, timedelta
from typing import Final, Protocol, TypeVar

import click
from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from metering.counters import Counter
from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.instants import from_us, round_up
from metering.domain.limits import Limit
from metering.domain.money import format_amount

EXIT_DENIED: Final = 2
# `metering result` of an event still on a queue: no worker has decided it yet.
EXIT_PENDING: Final = 3
EXIT_CODES_HELP: Final = (
    "\b\nExit codes (scripts can branch on them):\n"
    "  0  allowed (or overage on a soft limit)\n  2  denied\n  1  error"
)
SECOND: Final = timedelta(seconds=1)
MINUTE: Final = timedelta(minutes=1)
# Wider than any table: piped output is never wrapped or cut.
PIPE_WIDTH: Final = 1_000_000
# Columns of names (ids, subjects, limits, URLs): in a narrow terminal they
# fold onto the next lines, never the numbers and times beside them.
KEY_COLUMNS: Final = frozenset(
    {"id", "event id", "subject", "limit", "name", "endpoint", "url", "value"}
)
# Of those, the identifiers one copies: kept on one line while the others fold.
IDENTIFIERS: Final = frozenset({"id", "event id", "endpoint"})
# Columns of free text: they wrap between their words, as names fold.
TEXT_COLUMNS: Final = frozenset(
    {
        "reason",
        "charges",
        "types",
        "detail",
        "input",
        "last result",
        "dimension",
        "thresholds",
        "dimensions",
    }
)
# What a key column keeps at least when the keys must fold to fit the console.
KEY_COLUMN_MIN_WIDTH: Final = 8
# ... and in a terminal too narrow for that.
SQUEEZED_KEY_WIDTH: Final = 4
LABEL_COLOURS: Final = {
    "allowed": "green",
    "overage": "yellow",
    "fits": "cyan",
    "would_deny": "magenta",
    "ahead_of_pace": "yellow",
}
NUMERIC_COLUMNS: Final = frozenset({"maximum", "used", "denied events", "denied cost"})
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


# -- the console and tables ----------------------------------------------------


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def console() -> Console:
    """The console for stdout: the terminal's width, or unlimited when piped.

    Piped output is never wrapped or cut, so scripts see every value whole.
    """
    return Console() if stdout_is_terminal() else Console(width=PIPE_WIDTH)


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


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    title: str = "",
    *,
    numeric: Collection[str] = NUMERIC_COLUMNS,
    width: int | None = None,
) -> Table:
    """A table of ``rows``; None shows as ``-``; ``numeric`` columns are right-aligned.

    It fits ``width`` (default: the console's), and nothing is ever cut
    short: a long name folds onto the next lines, never a number or a time.
    Every other column keeps the width of its longest value (a header wraps
    between its words); the names (`KEY_COLUMNS`) and free text
    (`TEXT_COLUMNS`) share what is left, keeping their longest value when it
    fits. A table
    too wide for ruled columns drops the outer border and the rules between
    columns. Where the other columns cannot keep their longest value, they
    wrap between their words (a time's date above its clock), then their
    headers fold, and keys narrow to four columns; only a table that fits in
    none of these ways (a very narrow terminal) folds every column.
    """
    width = console().width if width is None else width
    cells = [[Text("-" if value is None else str(value)) for value in row] for row in rows]
    headers = [_longest_word(column) for column in columns]
    natural = [
        max([headers[index], *(row[index].cell_len for row in cells)])
        for index in range(len(columns))
    ]
    keys = [index for index, column in enumerate(columns) if column in KEY_COLUMNS | TEXT_COLUMNS]
    identifiers = [index for index, column in enumerate(columns) if column in IDENTIFIERS]
    whole = [max(n, len(column)) for n, column in zip(natural, columns, strict=True)]
    ruled = sum(whole) + _overhead(len(columns), ruled=True) <= width
    widths: list[int | None] = list(whole)
    wrapped = False  # the other columns wrap between words
    if not ruled:
        room = width - _overhead(len(columns), ruled=False)
        fitted = _layout(room, natural, keys, identifiers)
        if fitted is None:
            words = [
                max([1, *(_longest_word(row[index].plain) for row in cells)])
                for index in range(len(columns))
            ]
            # Cells wrap between their words: headers too, else they fold.
            headed = [max(w, h) for w, h in zip(words, headers, strict=True)]
            fitted = _layout(room, headed, keys, identifiers, wanted=natural)
            if fitted is None:
                fitted = _squeezed(room, words, headed, natural, keys, identifiers)
            wrapped = fitted is not None
        widths = [None] * len(columns) if fitted is None else fitted
    shown = Table(title=title or None, title_justify="left")
    if not ruled:
        shown.box = box.SIMPLE_HEAD
        shown.show_edge = False
        shown.pad_edge = False
        shown.padding = (0, 1, 0, 0)
    for index, column in enumerate(columns):
        justify: JustifyMethod = "right" if column in numeric else "left"
        chosen = widths[index]
        fold = chosen is None or wrapped or index in keys
        # A header wraps between its words even where the cells below do not.
        header = Text(column, no_wrap=False, overflow="fold")
        shown.add_column(header, justify=justify, overflow="fold", no_wrap=not fold, width=chosen)
    for row in cells:
        shown.add_row(*row)
    return shown


def _layout(
    room: int,
    least: Sequence[int],
    keys: Sequence[int],
    identifiers: Collection[int],
    wanted: Sequence[int] | None = None,
    floor: int = KEY_COLUMN_MIN_WIDTH,
) -> list[int | None] | None:
    """Widths within ``room``: every column but the keys ``least`` wide, or as
    ``wanted`` as the room allows; the keys share the rest (`_share`). None
    when it does not fit."""
    others = [index for index in range(len(least)) if index not in keys]
    fixed = sum(least[index] for index in others)
    first = [place for place, index in enumerate(keys) if index in identifiers]
    shared = _share(room - fixed, [(wanted or least)[index] for index in keys], first, floor)
    if shared is None:
        return None
    widths: list[int | None] = list(least)
    for index, key_width in zip(keys, shared, strict=True):
        widths[index] = key_width
    if wanted is not None:  # what the keys left over widens the others, in order
        spare = room - fixed - sum(shared)
        for index in others:
            extra = min(spare, wanted[index] - least[index])
            widths[index] = least[index] + extra
            spare -= extra
    return widths


def _longest_word(text: str) -> int:
    return max((len(word) for word in text.split()), default=0)


def _overhead(count: int, *, ruled: bool) -> int:
    """Columns a table of ``count`` columns spends besides its cells: ``│ a │ b │``
    when ruled; else one space of padding and one between columns."""
    return 3 * count + 1 if ruled else 2 * (count - 1)


def _squeezed(
    room: int,
    words: Sequence[int],
    headed: Sequence[int],
    natural: Sequence[int],
    keys: Sequence[int],
    identifiers: Collection[int],
) -> list[int | None] | None:
    """Widths for a very narrow terminal: the other columns their longest
    word, then their header's as the room allows; the keys share what is left
    (at least `SQUEEZED_KEY_WIDTH`); the rest widens the others. None when
    not even that fits."""
    others = [index for index in range(len(words)) if index not in keys]
    floors = {index: min(natural[index], SQUEEZED_KEY_WIDTH) for index in keys}
    spare = room - sum(words[index] for index in others) - sum(floors.values())
    if spare < 0:
        return None
    widths: list[int | None] = list(words)
    for index in others:
        extra = min(spare, headed[index] - words[index])
        widths[index] = words[index] + extra
        spare -= extra
    first = [place for place, index in enumerate(keys) if index in identifiers]
    wanted = [natural[index] for index in keys]
    shared = _share(spare + sum(floors.values()), wanted, first, SQUEEZED_KEY_WIDTH)
    if shared is None:
        return None
    for index, key_width in zip(keys, shared, strict=True):
        widths[index] = key_width
    spare += sum(floors.values()) - sum(shared)
    for index in others:
        now = widths[index] or 0
        extra = min(spare, natural[index] - now)
        widths[index] = now + extra
        spare -= extra
    return widths


def _share(
    room: int, wanted: Sequence[int], first: Collection[int] = (), floor: int = KEY_COLUMN_MIN_WIDTH
) -> list[int] | None:
    """Widths for the key columns within ``room``: each its ``wanted`` width
    when all fit; else the ``first`` (identifiers, to copy whole) theirs when
    the others keep their least, and the others the narrow ones whole and the
    rest an even share (at least ``floor``, or what one wants when less);
    None when not even that fits."""
    floors = [min(want, floor) for want in wanted]
    if room < sum(floors):
        return None
    given = dict.fromkeys(range(len(wanted)), 0)
    left = room
    rest = [index for index in range(len(wanted)) if index not in first]
    ids = [index for index in range(len(wanted)) if index in first]
    if room - sum(wanted[index] for index in ids) >= sum(floors[index] for index in rest):
        for index in ids:
            given[index] = wanted[index]
            left -= wanted[index]
    else:
        rest = list(range(len(wanted)))
    order = sorted(rest, key=lambda index: wanted[index])
    for place, index in enumerate(order):
        share = left // (len(order) - place)
        given[index] = max(floors[index], min(wanted[index], share))
        left -= given[index]
    return [given[index] for index in range(len(wanted))]


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
    if limit.distinct is not None:
        parts.append(f"distinct {limit.distinct}")
    if limit.is_gauge:
        parts.append(f"gauge {limit.aggregation}")
    if limit.pacing:
        parts.append(f"paced, burst {limit.burst}")
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
            window_span(c.window_start, c.window_end),
            c.used,
            c.denied_count,
            c.denied_cost,
            _within(c.first_denied_at, c.window_start),
        ]
        for c in counters
    ]
    return table(COUNTER_COLUMNS, rows, title)


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
    if charge.outcome == "ahead_of_pace":
        return f"{line}, ahead of its pace (not billed), resets {resets}"
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
        for line in decision_lines(decision):
            click.echo(line, err=err)
    if not decision.allowed:
        click.get_current_context().exit(EXIT_DENIED)
