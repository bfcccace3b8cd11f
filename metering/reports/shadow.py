"""The shadow report: whom a shadow limit would have denied, had it been hard (docs/reports.md).

A shadow limit decides like a hard one but never denies: a charge that would not fit
consumes nothing and counts as a would-deny in its window's counter (``denied_count``,
``denied_cost``). Per subject, over the windows that start in the period: the would-deny
events and cost summed, the ``windows`` with at least one, and the peak window (the largest
would-deny cost, ties the earliest) with its usage against the maximum that applied then.
Subjects never denied are not listed; rows by would-deny cost, largest first (then count,
then subject). Only windows that ended while the limit was shadow count (its enforcement
at a window's end); a limit never shadow is refused: its denials are in the overage report.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Final

from metering.domain.events import validate_subject
from metering.domain.instants import from_us
from metering.domain.jsonable import fields_dict
from metering.domain.limits import validate_limit_name
from metering.errors import InvalidInput, UnknownLimit
from metering.reports.overage import BaseReport, ReportRange, TimeBound, checked_top, listed
from metering.storage.database import Database, DatabaseSource, database_of
from metering.storage.reports import ReportStore, shadow_count_statement, shadow_statement


@dataclass(slots=True)
class ShadowRow:
    """What one shadow limit would have denied one subject, over a period."""

    subject: str
    limit: str
    would_deny_events: int
    would_deny_cost: int
    windows: int
    first_would_deny_at: datetime | None
    peak_window_start: datetime
    peak_window_end: datetime
    peak_used: int
    peak_maximum: int
    peak_would_deny_cost: int

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values: instants as ISO 8601 strings (UTC)."""
        return fields_dict(self)


SHADOW_COLUMNS: Final = tuple(f.name for f in fields(ShadowRow))


def _shadow_row(record: Any) -> ShadowRow:
    subject, limit, events, cost, windows, first_us, start_us, end_us = record[:8]
    used, maximum, peak_cost = record[8:]
    return ShadowRow(
        subject,
        limit,
        int(events),
        int(cost),
        int(windows),
        None if first_us is None else from_us(first_us),
        from_us(start_us),
        from_us(end_us),
        used,
        int(maximum),
        peak_cost,
    )


class ShadowReport(BaseReport[ShadowRow]):
    """The shadow report: one `ShadowRow` per subject."""

    def decode(self, record: Any) -> ShadowRow:
        return _shadow_row(record)


def _checked_shadow_limit(database: Database, limit: object) -> str:
    name = validate_limit_name(limit)
    kind = database.run(lambda c: ReportStore(c).limit_kind(name))
    if kind is None:
        raise UnknownLimit(name)
    if not kind.ever_shadow:
        raise InvalidInput(
            "limit",
            f"{name} is a {kind.enforcement} limit, not shadow: its denials and overage "
            "are in the overage report (metering report overage)",
        )
    if kind.algorithm != "fixed_window":
        raise InvalidInput(
            "limit",
            f"{name} is a token bucket: it has no windows to report "
            "(its would-denies are in the events' results)",
        )
    return name


def select_shadow(
    meter: DatabaseSource,
    limit: str,
    *,
    period: str | None = None,
    since: TimeBound = None,
    until: TimeBound = None,
    subject: str | None = None,
    top: int | None = None,
) -> ShadowReport:
    """The shadow report of ``limit`` (see the module docstring), validated;
    ``rows()`` streams it. Raises `UnknownLimit`, or `InvalidInput` (field
    ``limit``) for a limit that is not a shadow fixed-window limit, and for
    a malformed period, subject or top, before anything is read."""
    checked_top(top)
    database = database_of(meter)
    chosen = ReportRange.of(period, since, until)
    if subject is not None:
        validate_subject(subject)
    name = _checked_shadow_limit(database, limit)
    query = chosen.query(subject=subject, limit=name, top=top)
    return ShadowReport(
        database, "shadow", chosen, query, shadow_statement(query), shadow_count_statement(query)
    )


shadow_report = listed(
    select_shadow, ShadowRow, "shadow_report", "`select_shadow`'s rows as a list."
)
