"""Helpers for the table tests: the tables the command line prints, a table
as a terminal shows it, and its columns as a reader sees them."""

from __future__ import annotations

import importlib
import io
import sys

import pytest
from rich import box
from rich.console import Console
from rich.table import Table

from metering.cli import COMMANDS, tables

WIDTH = 100


def capture_tables(monkeypatch: pytest.MonkeyPatch, width: int = WIDTH) -> list[Table]:
    """The list the command line's tables go to instead of stdout, as rich
    built them for a terminal ``width`` columns wide."""
    printed: list[Table] = []
    monkeypatch.setattr(tables, "stdout_is_terminal", lambda: True)
    monkeypatch.setenv("COLUMNS", str(width))
    # Every command's module first: the CLI imports one when it runs, and a
    # module imported while print_table is patched would keep the patch.
    for target in COMMANDS.values():
        importlib.import_module(target.partition(":")[0])
    for name, module in list(sys.modules.items()):
        if name.startswith("metering.cli") and hasattr(module, "print_table"):
            monkeypatch.setattr(module, "print_table", printed.append)
    return printed


def render(shown: Table, width: int = WIDTH) -> list[str]:
    console = Console(width=width, file=io.StringIO(), color_system=None, record=True)
    console.print(shown)
    return console.export_text().splitlines()


def columns_of(shown: Table, lines: list[str]) -> list[list[str]]:
    """Each column's text, line by line of the body (blank where a row has
    fewer lines): ruled tables split at their rules, the others by width
    (their columns all have one: only a table folding every column has not)."""
    rule = next(n for n, line in enumerate(lines) if line.lstrip().startswith(("┡", "─")))
    body = []
    for line in lines[rule + 1 :]:
        if line.startswith(("└", "zero in every row")):  # the end, and the caption
            break
        if line.strip():
            body.append(line)
    if shown.box is not box.SIMPLE_HEAD:
        return [[cell.strip() for cell in line.strip("│").split("│")] for line in body]
    widths = [column.width or 0 for column in shown.columns]
    assert all(widths), "every column of an unruled table has its width"
    gap = shown.padding[1] + 1
    starts = [sum(w + gap for w in widths[:index]) for index in range(len(widths))]
    return [
        [line[start : start + width].strip() for start, width in zip(starts, widths, strict=True)]
        for line in body
    ]
