"""Tables that fit the terminal without breaking a name.

A subject, limit or id never wraps while the table can fit otherwise.
Numeric columns zero in every row fold away (named in a caption). To fit, a
table then gives up, in order: its rules, its headers' width (wrapped
between words, then abbreviated), the other cells' (wrapped between words,
times before free text), the space between columns, the numbers' digits
(``1.2M``) and amounts' currency; only then do names fold. Piped, a table
is plain text laid out for `PIPE_WIDTH` columns (no rules, no colour) whose
cells never wrap: it grows wider instead."""

from __future__ import annotations

import re
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Final

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

# Piped output is laid out as in a terminal this wide.
PIPE_WIDTH: Final = 100
# Right-aligned numbers, unless a command names its own.
NUMERIC_COLUMNS: Final = frozenset({"maximum", "used", "denied events", "denied cost"})
# Names: never wrapped while the table can fit otherwise.
KEY_COLUMNS: Final = frozenset({"id", "event id", "subject", "limit", "name", "endpoint"})
# Long values that fold anywhere (a URL, a metadata value) before a name does.
FOLDING_COLUMNS: Final = frozenset({"url", "value"})
# Free text: wraps between its words before the times do.
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
        "still rejected because",
    }
)
# What a folding column keeps at least.
FOLDED_MIN_WIDTH: Final = 8
# Where a cell may break: at spaces, and after a dash between a window's ends.
DASHES: Final = ("\u2013",)
BREAKS: Final = re.compile(r"(?<=\u2013)|\s+")
# A spend limit's amount: ``0.05 USD``.
AMOUNT: Final = re.compile(r"([0-9.]+) [A-Z]{3}")
# Numbers from this one on shown compact (``12k``) as the last thing before names fold.
COMPACT_FROM: Final = 10_000
# What a name keeps at least when, as a last resort, names fold.
SQUEEZED_KEY_WIDTH: Final = 4
# Header words shortened when they are wider than every cell below them.
ABBREVIATIONS: Final = {
    "maximum": "max",
    "granted": "grant",
    "overage": "over",
    "overdraft": "ovdr",
    "denied": "deny",
    "events": "ev",
    "algorithm": "algo",
    "enforcement": "enf",
    "lateness": "late",
    "effective": "eff",
    "recorded": "rec",
    "window": "win",
    "first": "1st",
    "would-deny": "w-deny",
    "currency": "cur",
    "created": "made",
    "expires": "exp",
    "settled": "done",
    "windows": "wins",
    "attempts": "tries",
    "thresholds": "thresh",
    "dimensions": "dims",
    "period": "per",
}


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def console() -> Console:
    """The console for stdout: the terminal's, or plain and unlimited when
    piped (the tables are laid out for `PIPE_WIDTH` columns: `table`)."""
    if stdout_is_terminal():
        return Console()
    return Console(width=1_000_000, color_system=None, highlight=False)


def print_table(shown: Table) -> None:
    """Print a table on stdout (piped: without trailing spaces)."""
    out = console()
    if stdout_is_terminal():
        out.print(shown)
        return
    with out.capture() as captured:
        out.print(shown)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


@dataclass(frozen=True, slots=True)
class _Layout:
    """A table's columns as laid out: headers, widths, which may wrap, the
    gap between columns (0: ruled), and whether the numbers are compact."""

    headers: list[str]
    widths: list[int | None]
    wrap: list[bool]
    gap: int = 2
    compact: bool = False


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    title: str = "",
    *,
    numeric: Collection[str] = NUMERIC_COLUMNS,
    width: int | None = None,
) -> Table:
    """A table of ``rows`` fitting ``width`` (default: the terminal's, or
    `PIPE_WIDTH` when piped); None shows as ``-``; ``numeric`` columns are
    right-aligned and fold away when zero in every row."""
    piped = width is None and not stdout_is_terminal()
    width = (PIPE_WIDTH if piped else console().width) if width is None else width
    cells = [["-" if value is None else str(value) for value in row] for row in rows]
    zero = [
        index
        for index, column in enumerate(columns)
        if column in numeric and cells and all(_is_zero(row[index]) for row in cells)
    ]
    kept = [index for index in range(len(columns)) if index not in zero]
    names = [columns[index] for index in kept]
    body = [[row[index] for index in kept] for row in cells]
    numbers = [name in numeric for name in names]
    laid = _fit(names, body, width, numbers, never_fold=piped)
    if laid.compact:
        body = [
            [_compact(cell) if number else cell for cell, number in zip(row, numbers, strict=True)]
            for row in body
        ]
    caption = "zero in every row: " + ", ".join(columns[index] for index in zero) if zero else ""
    shown = _frame(laid, title, caption, piped=piped)
    for number, header, chosen, wrap in zip(
        numbers, laid.headers, laid.widths, laid.wrap, strict=True
    ):
        shown.add_column(
            Text(header, no_wrap=False, overflow="fold"),
            justify="right" if number else "left",
            overflow="fold",
            no_wrap=not wrap,
            width=chosen,
        )
    for row in body:
        shown.add_row(
            *(
                Text(_wrap(cell, chosen) if wrap and chosen else cell)
                for cell, chosen, wrap in zip(row, laid.widths, laid.wrap, strict=True)
            )
        )
    return shown


def _frame(laid: _Layout, title: str, caption: str, *, piped: bool) -> Table:
    """The empty table: ruled, or columns ``laid.gap`` apart (no rules at all when piped)."""
    shown = Table(
        title=title or None, title_justify="left", caption=caption or None, caption_justify="left"
    )
    if piped:
        shown.box = None
        shown.padding = (0, laid.gap or 2, 0, 0)
    elif laid.gap:
        shown.box = box.SIMPLE_HEAD
        shown.padding = (0, laid.gap - 1, 0, 0)
    if piped or laid.gap:
        shown.show_edge = False
        shown.pad_edge = False
    return shown


def _is_zero(cell: str) -> bool:
    number = cell.replace(",", "").split(" ")[0]
    try:
        return float(number) == 0
    except ValueError:
        return False


def _compact(cell: str) -> str:
    """A number in at most four columns: ``1.2M``, ``235k``; a percentage
    without its decimals; an amount without its currency; anything else as it is."""
    plain = cell.replace(",", "")
    if plain.isdigit() and int(plain) >= COMPACT_FROM:
        value = int(plain)
        for unit, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
            if value >= scale:
                tenths = value * 10 // scale  # rounded down, as a whole number is
                shown = f"{tenths // 10}.{tenths % 10}" if value < 10 * scale else f"{tenths // 10}"
                return shown.removesuffix(".0") + unit
    amount = AMOUNT.fullmatch(plain)
    if amount is not None:  # the limit's name says it is money
        return amount.group(1)
    whole, dot, decimals = plain.partition(".")
    if dot and whole.isdigit() and decimals.isdigit():
        return whole
    return cell


def _fit(
    names: Sequence[str],
    body: Sequence[Sequence[str]],
    width: int,
    numbers: Sequence[bool],
    *,
    never_fold: bool,
) -> _Layout:
    """The first layout that fits ``width``, in the order of the module docstring."""
    count = len(names)
    longest = [max([0, *(len(row[index]) for row in body)]) for index in range(count)]
    whole = [max(len(name), cell) for name, cell in zip(names, longest, strict=True)]
    if sum(whole) + 3 * count + 1 <= width:
        return _Layout(list(names), list[int | None](whole), [False] * count, gap=0)
    room = width - 2 * (count - 1)
    short = [_abbreviate(name, cell) for name, cell in zip(names, longest, strict=True)]
    for headers in (list(names), short):
        for heads in ([len(h) for h in headers], [_longest_word(h) for h in headers]):
            widths = [max(cell, head) for cell, head in zip(longest, heads, strict=True)]
            if sum(widths) <= room:
                return _Layout(headers, list[int | None](widths), [False] * count)
    if never_fold:  # piped: every cell whole on one line, wider than the page if need be
        widths = [max(cell, _longest_word(h)) for cell, h in zip(longest, short, strict=True)]
        return _Layout(short, list[int | None](widths), [False] * count, gap=1)
    plain = [number or name in KEY_COLUMNS for name, number in zip(names, numbers, strict=True)]
    for gap, compact in ((2, False), (1, False), (1, True)):
        shown = [
            [_compact(c) if compact and n else c for c, n in zip(row, numbers, strict=True)]
            for row in body
        ]
        laid = _wrapped(names, shown, width - gap * (count - 1), plain)
        if laid is not None:
            return replace(laid, gap=gap, compact=compact)
    return replace(_folded(names, shown, width - count + 1, plain), gap=1, compact=True)


def _wrapped(
    names: Sequence[str], body: Sequence[Sequence[str]], room: int, plain: Sequence[bool]
) -> _Layout | None:
    """The cells other than names and numbers wrap between their words (free
    text first), under headers abbreviated to them; None if that does not fit."""
    count = len(names)
    longest = [max([0, *(len(row[index]) for row in body)]) for index in range(count)]
    headers, least = _least(names, body, plain)
    if sum(least) > room:
        return None
    widths = list(least)
    spare = room - sum(least)
    texts = TEXT_COLUMNS | FOLDING_COLUMNS
    for index in sorted(range(count), key=lambda index: names[index] in texts):
        extra = min(spare, max(longest[index], least[index]) - widths[index])
        widths[index] += extra
        spare -= extra
    return _Layout(headers, list[int | None](widths), [not whole for whole in plain])


def _folded(
    names: Sequence[str], body: Sequence[Sequence[str]], room: int, plain: Sequence[bool]
) -> _Layout:
    """A last resort: the names fold too, sharing evenly what the others
    leave (a short one kept whole); every column folds when not even that fits."""
    count = len(names)
    headers, least = _least(names, body, plain)
    keys = [index for index in range(count) if names[index] in KEY_COLUMNS]
    left = room - sum(least[index] for index in range(count) if index not in keys)
    if not keys or left < SQUEEZED_KEY_WIDTH * len(keys):
        return _Layout(headers, [None] * count, [True] * count)
    widths = list[int | None](least)
    for place, index in enumerate(sorted(keys, key=lambda index: least[index])):
        share = min(least[index], left // (len(keys) - place))
        widths[index] = share
        left -= share
    return _Layout(headers, widths, [index in keys or not plain[index] for index in range(count)])


def _least(
    names: Sequence[str], body: Sequence[Sequence[str]], plain: Sequence[bool]
) -> tuple[list[str], list[int]]:
    """Headers abbreviated to their cells, and what each column needs at
    least: a name or a number its longest value, a folding column
    `FOLDED_MIN_WIDTH` (or less), any other its longest word."""
    least = []
    for index, name in enumerate(names):
        values = [row[index] for row in body]
        if plain[index]:
            least.append(max([1, *(len(value) for value in values)]))
        elif name in FOLDING_COLUMNS:
            least.append(min(FOLDED_MIN_WIDTH, max([1, *(len(value) for value in values)])))
        else:
            least.append(max([1, *(_longest_word(value) for value in values)]))
    headers = [_abbreviate(name, cell) for name, cell in zip(names, least, strict=True)]
    return headers, [max(c, _longest_word(h)) for c, h in zip(least, headers, strict=True)]


def _abbreviate(header: str, cell_width: int) -> str:
    """``header`` with the words wider than its cells shortened (`ABBREVIATIONS`)."""
    return " ".join(
        ABBREVIATIONS.get(word, word) if len(word) > cell_width else word for word in header.split()
    )


def _words(text: str) -> list[str]:
    """A cell's words: split at spaces and after a dash (a window's ends)."""
    return [word for word in BREAKS.split(text) if word and not word.isspace()]


def _wrap(text: str, width: int) -> str:
    """``text`` in lines of at most ``width`` columns, broken between its
    words (`_words`); a longer word stays whole for the table to fold."""
    lines: list[str] = []
    for word in _words(text):
        if not lines:
            lines.append(word)
            continue
        joined = lines[-1] + ("" if lines[-1].endswith(DASHES) else " ") + word
        if len(joined) <= width:
            lines[-1] = joined
        else:
            lines.append(word)
    return "\n".join(lines)


def _longest_word(text: str) -> int:
    return max((len(word) for word in _words(text)), default=0)
