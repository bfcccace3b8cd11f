"""Reading an import file (`metering import`; docs/import.md), and what its flags change.

Pure: text lines in, `EventRecord`s or `BadLine`s (the reason a line is bad) out, each with
its line number (`parse_lines`). JSON Lines: one object a line, the HTTP API's plain event
(``event_id``, ``subject``, ``limit``, ``cost`` (default 1), ``occurred_at``, ``metadata``,
or ``charges``). CSV: a header starting ``event_id,subject,limit,cost,occurred_at``, each
further column a metadata key (an empty cell leaves it out). ``event_id`` and
``occurred_at`` are required: an import is exactly once by id. Blank lines are skipped.
`ImportPolicy` is what ``--no-enforce`` and ``--allow-late`` change in the rules
(`ImportPolicy.rule`, `ImportPolicy.limit`) and the marker results keep (`.marker`).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, NamedTuple

from metering.domain.events import (
    EventRecord,
    fingerprint_of,
    validate_charges,
    validate_event_id,
    validate_metadata,
)
from metering.domain.instants import parse_instant, to_us
from metering.domain.limits import Limit
from metering.domain.rules import Rule
from metering.errors import InvalidInput, MeteringError

ImportFormat = Literal["jsonl", "csv"]
CSV_COLUMNS: Final = ("event_id", "subject", "limit", "cost", "occurred_at")
_FIELDS: Final = frozenset(
    {"event_id", "subject", "limit", "cost", "occurred_at", "metadata", "charges"}
)
_CHARGE_FIELDS: Final = frozenset({"subject", "limit", "cost"})
# Lateness under ``--allow-late``: every instant since year 1 is in range.
UNLIMITED_LATENESS_SECONDS: Final = 10**12


class BadLine(NamedTuple):
    """A line that is no event: its number (1 is the file's first line) and why."""

    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


Parsed = tuple[int, EventRecord | BadLine]


def format_of(name: str | None, first_line: str) -> ImportFormat:
    """The format by the file's suffix (``.csv``; ``.jsonl``, ``.ndjson``,
    ``.json``), else by its first line (an object starts with ``{``)."""
    lowered = (name or "").lower()
    if lowered.endswith(".csv"):
        return "csv"
    if lowered.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    return "jsonl" if first_line.lstrip().startswith("{") else "csv"


def parse_lines(lines: Iterable[str], fmt: ImportFormat) -> Iterator[Parsed]:
    """Each line's event or `BadLine`, with its line number, in order."""
    if fmt == "csv":
        yield from _csv_lines(lines)
        return
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield number, _json_line(number, line)


def _json_line(number: int, line: str) -> EventRecord | BadLine:
    try:
        item = json.loads(line, parse_constant=_no_constant)
    except ValueError as exc:
        return BadLine(number, f"not JSON: {exc}")
    if not isinstance(item, dict):
        return BadLine(number, "not a JSON object")
    unknown = sorted(set(item) - _FIELDS)
    if unknown:
        return BadLine(number, f"unknown field {unknown[0]!r}")
    try:
        if "charges" in item:
            if "subject" in item or "limit" in item or "cost" in item:
                raise InvalidInput("charges", "give subject and limit, or charges, not both")
            charges = [_charge(c) for c in _list(item["charges"])]
        else:
            charges = [(_required(item, "subject"), _required(item, "limit"), item.get("cost", 1))]
        return _record(item.get("event_id"), charges, item.get("occurred_at"), item.get("metadata"))
    except MeteringError as exc:
        return BadLine(number, str(exc))


def _csv_lines(lines: Iterable[str]) -> Iterator[Parsed]:
    # csv.reader keeps quoted newlines inside a cell: the number is the record's first line.
    numbered = _Numbered(lines)
    reader = csv.reader(numbered)
    header: list[str] | None = None
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # a NUL, a lone carriage return in a cell ...
            if header is None:
                raise InvalidInput("header", f"line {numbered.start}: not CSV: {exc}") from None
            yield numbered.start, BadLine(numbered.start, f"not CSV: {exc}")
            numbered.start = numbered.count + 1
            continue
        number = numbered.start
        numbered.start = numbered.count + 1
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = [cell.strip() for cell in row]
            if tuple(header[:5]) != CSV_COLUMNS or len(set(header)) != len(header):
                expected = ",".join(CSV_COLUMNS)
                raise InvalidInput(
                    "header", f"line {number}: must be {expected}[,metadata columns], unique"
                )
            continue
        yield number, _csv_row(number, header, row)


def _csv_row(number: int, header: list[str], row: list[str]) -> EventRecord | BadLine:
    if len(row) != len(header):
        return BadLine(number, f"has {len(row)} cells, the header {len(header)}")
    event_id, subject, limit, cost, occurred_at = row[:5]
    metadata = {key: value for key, value in zip(header[5:], row[5:], strict=True) if value}
    try:
        if not cost.strip().isdigit():
            raise InvalidInput("cost", f"must be a whole number, got {cost!r}")
        charges = [(subject, limit, int(cost))]
        return _record(event_id, charges, occurred_at, metadata or None)
    except MeteringError as exc:
        return BadLine(number, str(exc))


class _Numbered:
    """The lines given to `csv.reader`, counted (a record may span lines)."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._lines = iter(lines)
        self.count = 0
        self.start = 1

    def __iter__(self) -> _Numbered:
        return self

    def __next__(self) -> str:
        line = next(self._lines)
        self.count += 1
        return line


def _record(
    event_id: object, charges: list[Any], occurred_at: object, metadata: object
) -> EventRecord:
    if event_id is None or event_id == "":
        raise InvalidInput("event_id", "is required (an import is exactly once by id)")
    checked_id = validate_event_id(event_id)
    if occurred_at is None or occurred_at == "":
        raise InvalidInput("occurred_at", "is required")
    at_us = to_us(parse_instant(occurred_at, field_name="occurred_at"))
    checked = validate_charges(charges)
    return EventRecord(
        checked_id, checked, at_us, validate_metadata(metadata), fingerprint_of(checked)
    )


def _required(item: Mapping[str, Any], name: str) -> Any:
    if name not in item:
        raise InvalidInput(name, "is required")
    return item[name]


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInput("charges", "must be a list of {subject, limit, cost}")
    return value


def _charge(item: object) -> tuple[Any, Any, Any]:
    if not isinstance(item, dict) or set(item) - _CHARGE_FIELDS:
        raise InvalidInput("charges", "each charge is an object {subject, limit, cost}")
    return (_required(item, "subject"), _required(item, "limit"), item.get("cost", 1))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


@dataclass(frozen=True, slots=True)
class ImportPolicy:
    """What an import's flags change; the default changes nothing.

    ``enforce=False`` (``--no-enforce``, history that happened): every
    fixed-window limit (hard, shadow or soft) is decided as a soft one, so
    every charge is allowed and usage beyond the maximum is recorded as
    overage (outcome ``overage``), exactly as a soft limit records it; a
    token bucket, whose tokens never go below zero, is decided as a shadow
    one: never denied, a charge it could not hold is recorded as
    ``would_deny`` and consumes nothing. No notification is written
    (history is recorded, not announced).

    ``allow_late`` (``--allow-late``): no lateness limit; events more than
    5 minutes in the future are still rejected.

    Either flag marks the results it writes: `marker` is their ``reason``.
    """

    enforce: bool = True
    allow_late: bool = False
    _rules: dict[int, tuple[Rule, Rule]] = field(
        default_factory=dict, repr=False, compare=False, hash=False
    )

    @property
    def changes(self) -> bool:
        return not self.enforce or self.allow_late

    @property
    def marker(self) -> str | None:
        """The ``reason`` kept on each result the import writes, or None."""
        parts = [
            *(["not enforced"] if not self.enforce else []),
            *(["lateness not checked"] if self.allow_late else []),
        ]
        return f"imported: {', '.join(parts)}" if parts else None

    def limit(self, limit: Limit) -> Limit:
        """``limit`` as this import applies it."""
        changed = limit
        if not self.enforce and changed.algorithm != "concurrent":
            bucket = changed.algorithm == "token_bucket"
            changed = replace(changed, enforcement="shadow" if bucket else "soft")
        if self.allow_late:
            # Beyond what a limit may declare (10 years): set as `Limit` sets it.
            changed = replace(changed) if changed is limit else changed
            object.__setattr__(changed, "lateness_seconds", UNLIMITED_LATENESS_SECONDS)
        return changed

    def rule(self, rule: Rule) -> Rule:
        """``rule`` as this import applies it (remembered per rule object)."""
        found = self._rules.get(id(rule))
        if found is not None and found[0] is rule:
            return found[1]
        limit = self.limit(rule.limit)
        changed = replace(
            rule,
            limit=limit,
            soft=limit.enforcement == "soft",
            shadow=limit.enforcement == "shadow",
            lateness_us=limit.lateness_seconds * 1_000_000,
            notifies=rule.notifies and self.enforce,
        )
        self._rules[id(rule)] = (rule, changed)
        return changed
