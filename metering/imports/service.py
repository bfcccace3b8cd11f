"""Importing a file of events through the batch path, exactly once by id.

The lines are read and parsed (`metering.domain.imports`) as they come and
applied ``batch_size`` at a time by `Engine.apply`, the worker's batch apply
(the fast path, with ``invalid="reject"``): each batch is one transaction,
so an import killed at any point has applied whole batches, each exactly
once, and the same file run again finds those ids decided (``duplicates``)
and applies the rest. A line that is no event is reported with its number
(`BadLine`) and the others go on; ``strict`` reads the whole input first and
applies nothing when a line is bad.
"""

from __future__ import annotations

import gc
import io
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from metering.domain.events import EventRecord
from metering.domain.imports import BadLine, ImportFormat, ImportPolicy, format_of, parse_lines
from metering.domain.jsonable import fields_dict
from metering.engine import Engine
from metering.engine.answers import CONFLICT, DUPLICATE, NEW, Answer
from metering.errors import InputRefused, InvalidInput

BATCH_SIZE: Final = 1000
# Bad lines kept in a summary; more are counted (``bad``), not listed.
MAX_LISTED: Final = 1000
Source = str | Path | IO[str] | IO[bytes] | Iterable[str]
Progress = Callable[[int], None]


@dataclass(slots=True)
class ImportSummary:
    """What an import did. ``applied``: new results that are not denials or
    rejections (allowed, overage); ``denied``: new denials; ``rejected``: new
    results the limits rejected (unknown limit, too late) with their reason;
    ``duplicates``: ids already decided with the same charges (nothing
    changed); ``conflicts``: ids decided with other charges (not applied);
    ``bad_lines``: lines that are no event, with their numbers."""

    events: int = 0
    applied: int = 0
    denied: int = 0
    rejected: int = 0
    duplicates: int = 0
    conflicts: int = 0
    bad: int = 0
    bad_lines: list[BadLine] = field(default_factory=list)

    def add(self, answers: Sequence[Answer]) -> None:
        self.events += len(answers)
        for answer in answers:
            record = answer.record
            if answer.kind == DUPLICATE:
                self.duplicates += 1
            elif answer.kind == CONFLICT:
                self.conflicts += 1
            elif answer.kind == NEW and record is not None:
                if record.outcome == "denied":
                    self.denied += 1
                elif record.outcome == "rejected":
                    self.rejected += 1
                else:
                    self.applied += 1

    def bad_line(self, line: BadLine) -> None:
        self.bad += 1
        if len(self.bad_lines) < MAX_LISTED:
            self.bad_lines.append(line)

    def to_dict(self) -> dict[str, Any]:
        return {**fields_dict(self), "bad_lines": [fields_dict(b) for b in self.bad_lines]}


def import_events(
    engine: Engine,
    source: Source,
    *,
    fmt: ImportFormat | None = None,
    enforce: bool = True,
    allow_late: bool = False,
    strict: bool = False,
    batch_size: int = BATCH_SIZE,
    progress: Progress | None = None,
) -> ImportSummary:
    """Apply the events of ``source`` (a path, ``"-"`` for standard input, a
    text or binary file, or lines) exactly once by id; see the module."""
    if not 1 <= batch_size <= 10_000:
        raise InvalidInput("batch_size", "must be 1 to 10000")
    policy = ImportPolicy(enforce, allow_late)
    chosen = policy if policy.changes else None
    summary = ImportSummary()
    with _lines_of(source) as (name, lines):
        try:
            first, lines = _peek(lines)
        except UnicodeDecodeError as exc:
            raise InvalidInput("file", f"is not UTF-8 text: {exc.reason}") from None
        parsed = parse_lines(lines, fmt or format_of(name, first))
        if strict:
            parsed = iter(_checked(list(parsed)))
        try:
            _apply_all(engine, parsed, chosen, summary, batch_size, progress)
        except UnicodeDecodeError as exc:
            raise InvalidInput("file", f"is not UTF-8 text: {exc.reason}") from None
    return summary


def _apply_all(
    engine: Engine,
    parsed: Iterator[tuple[int, EventRecord | BadLine]],
    policy: ImportPolicy | None,
    summary: ImportSummary,
    batch_size: int,
    progress: Progress | None,
) -> None:
    batch: list[tuple[int, EventRecord]] = []
    for number, found in parsed:
        if isinstance(found, BadLine):
            summary.bad_line(found)
            continue
        batch.append((number, found))
        if len(batch) >= batch_size:
            _apply(engine, batch, policy, summary, progress)
            batch = []
    if batch:
        _apply(engine, batch, policy, summary, progress)


def _apply(
    engine: Engine,
    batch: list[tuple[int, EventRecord]],
    policy: ImportPolicy | None,
    summary: ImportSummary,
    progress: Progress | None,
) -> None:
    # As the worker does (`metering.pipeline.batches`): no cyclic collection mid-batch.
    enabled = gc.isenabled()
    gc.disable()
    try:
        _apply_around_refusals(engine, batch, policy, summary)
    finally:
        if enabled:
            gc.enable()
    if progress is not None:
        progress(len(batch))


def _apply_around_refusals(
    engine: Engine,
    batch: list[tuple[int, EventRecord]],
    policy: ImportPolicy | None,
    summary: ImportSummary,
) -> None:
    """Apply ``batch``; where the database refuses an event (`InputRefused`: a
    value it cannot store), halve around it, as the worker does, and report
    it as a bad line: every other event is applied."""
    try:
        answers = engine.apply([record for _, record in batch], invalid="reject", policy=policy)
    except InputRefused as exc:
        if len(batch) == 1:
            summary.bad_line(BadLine(batch[0][0], f"refused by the database: {exc}"))
            return
        middle = len(batch) // 2
        _apply_around_refusals(engine, batch[:middle], policy, summary)
        _apply_around_refusals(engine, batch[middle:], policy, summary)
        return
    summary.add(answers)


def _checked(parsed: list[tuple[int, EventRecord | BadLine]]) -> list[tuple[int, EventRecord]]:
    """``--strict``: every line is an event, or nothing is applied."""
    bad = [found for _, found in parsed if isinstance(found, BadLine)]
    if bad:
        more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
        raise InvalidInput("file", f"{bad[0]}{more}; nothing was imported")
    return [(number, found) for number, found in parsed if not isinstance(found, BadLine)]


def _peek(lines: Iterator[str]) -> tuple[str, Iterator[str]]:
    """The first non-blank line (to tell the format), and every line still."""
    head: list[str] = []
    for line in lines:
        head.append(line)
        if line.strip():
            break
    first = head[-1] if head else ""
    return first, _chain(head, lines)


def _chain(head: list[str], rest: Iterator[str]) -> Iterator[str]:
    yield from head
    yield from rest


class _lines_of:
    """The name (for the format) and the lines of a source, closed after."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.opened: IO[str] | None = None

    def __enter__(self) -> tuple[str | None, Iterator[str]]:
        source = self.source
        if isinstance(source, str | Path):
            if str(source) == "-":
                stream = sys.stdin.buffer
                return None, iter(io.TextIOWrapper(stream, encoding="utf-8", newline=""))
            try:
                self.opened = open(source, encoding="utf-8", newline="")
            except OSError as exc:
                raise InvalidInput("file", f"cannot read {str(source)!r}: {exc.strerror}") from None
            return str(source), iter(self.opened)
        if isinstance(source, io.TextIOBase):
            return getattr(source, "name", None), iter(source)
        if isinstance(source, io.IOBase):
            text = io.TextIOWrapper(source, encoding="utf-8", newline="")
            return getattr(source, "name", None), iter(text)
        return None, iter(source)  # type: ignore[arg-type]

    def __exit__(self, *_exc: object) -> None:
        if self.opened is not None:
            self.opened.close()
