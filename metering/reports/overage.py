"""Billing reports: usage, overage and denials per subject, limit and window (docs/reports.md).

A `ReportRow` is one counter, selected when its window *starts* in the period, or for a
billing month by the local month it starts in (``counters.billing_month``): each window
belongs to one billing period. Its ``maximum`` is the subject's entitlement in force at
the window's end, else the limit's default now. ``overage`` is a soft limit's allowed
usage beyond it (``used - granted - maximum``: grants are not overage); a hard limit's is
0 and what it refused is ``denied``, never billed. Shadow limits bill nothing
(`metering.reports.shadow`). Counters of deleted limits and token buckets are left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache, update_wrapper
from inspect import signature
from typing import Any, Final, Generic, ParamSpec, Protocol, TypeVar

from sqlalchemy import Select

from metering.domain.bounds import MAX_LISTING, shown
from metering.domain.events import validate_subject
from metering.domain.instants import as_utc, clock_text, from_us, parse_instant, to_us
from metering.domain.jsonable import fields_dict
from metering.domain.limits import validate_limit_name
from metering.domain.zones import window_label
from metering.errors import InvalidInput, UnknownLimit
from metering.storage.allowances import AllowanceStore
from metering.storage.database import Database, DatabaseSource, database_of
from metering.storage.limits import LimitStore
from metering.storage.reports import (
    ReportQuery,
    ReportStore,
    count_statement,
    overage_statement,
    usage_statement,
)

PERIOD_PATTERN: Final = re.compile(r"([0-9]{4})-([0-9]{2})")
FIRST_YEAR: Final = 1970
LAST_YEAR: Final = 9998  # the month after December 9999 is past what a datetime holds
TimeBound = datetime | date | str | None
RowT = TypeVar("RowT")
RowT_co = TypeVar("RowT_co", covariant=True)
P = ParamSpec("P")


@dataclass(slots=True)
class ReportRow:
    """One subject's use of one limit in one window.

    ``maximum`` is the one that applied to the subject in the window (its
    entitlement at the window's end, else the limit's default); ``granted``
    the part of ``used`` that grants paid. ``overage`` is the billable usage
    beyond the maximum: for a soft limit the window's own usage (``used -
    granted``) beyond ``maximum``; 0 for hard and shadow limits. ``overdraft``
    is the usage a commit of more than was reserved took past a hard limit:
    it happened, and is billed like overage, but never more than ``used -
    granted - maximum - overage`` (a maximum raised since bills less of it,
    one lowered since no more than the commit recorded). ``denied``
    is the cost of the demand refused (a shadow limit's would-denies), never
    billed, and ``denied_events`` how many events asked for it.
    ``utilisation_percent`` is ``100 * used / maximum``, rounded to 2 places.
    ``time_zone`` and ``local_window``: a window aligned at a subject's local
    midnight (`metering.domain.zones`), its zone and local label; else None.
    """

    subject: str
    limit: str
    enforcement: str
    window_start: datetime
    window_end: datetime
    maximum: int
    used: int
    granted: int
    overage: int
    overdraft: int
    denied: int
    denied_events: int
    utilisation_percent: float
    first_denied_at: datetime | None
    # A window at a zoned subject's local midnight: its zone and local label.
    time_zone: str | None = None
    local_window: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values: instants as ISO 8601 strings (UTC)."""
        return fields_dict(self)


COLUMNS: Final = tuple(f.name for f in fields(ReportRow))


@lru_cache(maxsize=4096)
def _window_instant(us: int) -> datetime:
    # Many rows share a window edge (a calendar month, a day): convert each once.
    return from_us(us)


def _row(record: Any) -> ReportRow:
    # Unpacked by position: a large export builds hundreds of thousands of rows.
    subject, limit, enforcement, start_us, end_us, maximum, used, granted = record[:8]
    overage, overdraft, denied_cost, denied_count, first_us = record[8:]
    return ReportRow(
        subject,
        limit,
        enforcement,
        _window_instant(start_us),
        _window_instant(end_us),
        maximum,
        used,
        int(granted),
        int(overage),
        int(overdraft),
        denied_cost,
        denied_count,
        round(used * 100 / maximum, 2),
        from_us(first_us) if first_us is not None else None,
    )


# -- the period -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReportRange:
    """The instants a report covers: windows starting in ``[since, until)``, or
    those of a ``billing_month`` (its local month: `metering.domain.zones.billing_month`;
    ``since`` and ``until`` are then that month in UTC, for hourly rollups)."""

    since: datetime | None = None
    until: datetime | None = None
    label: str = "all time"
    billing_month: str | None = None

    @classmethod
    def of(
        cls, period: str | None = None, since: TimeBound = None, until: TimeBound = None
    ) -> ReportRange:
        """A range from a billing month (``"2026-11"``) or from since/until.

        ``since`` and ``until`` are datetimes, dates or RFC 3339 strings
        (``2026-11-15``, ``2026-11-15T12:00:00Z``: `parse_instant`); naive
        means UTC, and a date is its midnight. ``until`` is exclusive.
        """
        if period is not None:
            if since is not None or until is not None:
                raise InvalidInput("period", "give a period, or since/until, not both")
            return cls.month(period)
        start = _instant("since", since)
        end = _instant("until", until)
        if start is not None and end is not None and start >= end:
            raise InvalidInput(
                "since", f"{start.isoformat()} is not before until {end.isoformat()}"
            )
        return cls(start, end, _range_label(start, end))

    @classmethod
    def month(cls, period: str) -> ReportRange:
        """The billing month ``YYYY-MM``: each subject's windows that start in it, locally."""
        match = PERIOD_PATTERN.fullmatch(period) if isinstance(period, str) else None
        if match is None or not 1 <= int(match.group(2)) <= 12:
            raise InvalidInput("period", f"{period!r} is not a month like 2026-11")
        year, month = int(match.group(1)), int(match.group(2))
        if not FIRST_YEAR <= year <= LAST_YEAR:
            raise InvalidInput("period", f"{period!r} is not a month from 1970 to {LAST_YEAR}")
        start = datetime(year, month, 1, tzinfo=UTC)
        end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
        return cls(start, end, period, period)

    def query(self, **filters: Any) -> ReportQuery:
        since_us = to_us(self.since, field_name="since") if self.since is not None else None
        until_us = to_us(self.until, field_name="until") if self.until is not None else None
        return ReportQuery(
            since_us=since_us, until_us=until_us, month=self.billing_month, **filters
        )


def _instant(name: str, value: TimeBound) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        return parse_instant(value, field_name=name)
    if not isinstance(value, datetime):
        if not isinstance(value, date):
            raise InvalidInput(name, f"expected a datetime, got {type(value).__name__}")
        value = datetime(value.year, value.month, value.day)
    return as_utc(value, field_name=name)


def _range_label(start: datetime | None, end: datetime | None) -> str:
    def text(moment: datetime) -> str:
        midnight = moment == moment.replace(hour=0, minute=0, second=0, microsecond=0)
        return f"{moment:%Y-%m-%d}" if midnight else f"{clock_text(moment)} UTC"

    if start is None and end is None:
        return "all time"
    if start is None:
        return f"until {text(end)}" if end is not None else "all time"
    if end is None:
        return f"since {text(start)}"
    # A date range ending at midnight reads inclusively: 2026-11-01 to 2026-11-15.
    midnight = end == end.replace(hour=0, minute=0, second=0, microsecond=0)
    last = end - timedelta(days=1) if midnight else end
    return f"{text(start)} to {text(last)}" if last > start else text(start)


# -- reports --------------------------------------------------------------------


@dataclass(frozen=True)
class BaseReport(Generic[RowT]):
    """A validated report, ready to read: `rows` streams, `count` counts.

    Build one with `select_overage`, `select_usage` or
    `metering.reports.shadow.select_shadow`; invalid filters raise there,
    before any row is read. A subclass makes its rows of database records
    (`decode`).
    """

    database: Database
    kind: str
    range: ReportRange
    query: ReportQuery
    statement: Select[Any]
    counting: Select[Any]

    def decode(self, record: Any) -> RowT:
        raise NotImplementedError

    def count(self) -> int:
        """How many rows `rows` yields."""
        return self.database.run(lambda c: ReportStore(c).count(self.counting, self.query.top))

    def rows(self) -> Iterator[RowT]:
        """The rows, streamed from the database (read them all, or close the iterator)."""
        decode = self.decode
        with self.database.reading() as connection:
            for record in ReportStore(connection).stream(self.statement):
                yield decode(record)


class Rows(Protocol[RowT_co]):
    """A validated report: its ``rows()`` stream."""

    def rows(self) -> Iterator[RowT_co]: ...


def listed(
    select: Callable[P, Rows[RowT]], row: type[RowT], name: str, doc: str
) -> Callable[P, list[RowT]]:
    """A function of ``select``'s arguments that returns its report's rows as a list."""

    def rows(*args: P.args, **kwargs: P.kwargs) -> list[RowT]:
        return list(select(*args, **kwargs).rows())

    update_wrapper(rows, select)
    rows.__name__ = rows.__qualname__ = name
    rows.__doc__ = doc
    # help() shows select's parameters and what this returns.
    described = signature(select).replace(return_annotation=f"list[{row.__name__}]")
    rows.__signature__ = described  # type: ignore[attr-defined]
    return rows


class Report(BaseReport[ReportRow]):
    """The overage or the usage report: one `ReportRow` per counter."""

    def decode(self, record: Any) -> ReportRow:
        return _row(record)

    def rows(self) -> Iterator[ReportRow]:
        """The rows, streamed, a zoned subject's window with its local label."""
        with self.database.reading() as connection:
            zones = AllowanceStore(connection).time_zones()
            periods = {
                limit.name: limit.parsed_period
                for limit in LimitStore(connection).list_limits()
                if limit.window == "calendar" and limit.algorithm != "token_bucket"
            }
            for record in ReportStore(connection).stream(self.statement):
                row = _row(record)
                history, period = zones.get(row.subject), periods.get(row.limit)
                if history is not None and period is not None:
                    window = (to_us(row.window_start), to_us(row.window_end))
                    label = window_label(period, history, window)
                    if label is not None:
                        row.time_zone, row.local_window = label
                yield row


def checked_top(top: object) -> None:
    """Raise `InvalidInput` unless ``top`` is None or a whole number in range."""
    if top is not None and (
        isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_LISTING
    ):
        raise InvalidInput(
            "top",
            f"must be a whole number of at least 1 and at most {MAX_LISTING:,}, got {shown(top)}",
        )


def _checked_limit(database: Database, limit: str | None) -> str | None:
    if limit is None:
        return None
    validate_limit_name(limit)
    if not database.run(lambda c: ReportStore(c).limit_exists(limit)):
        raise UnknownLimit(limit)
    return limit


def select_overage(
    meter: DatabaseSource,
    *,
    period: str | None = None,
    since: TimeBound = None,
    until: TimeBound = None,
    subject: str | None = None,
    limit: str | None = None,
    top: int | None = None,
) -> Report:
    """The overage report: every window of the period, by overage, largest first
    (then by denied cost).

    ``period`` is a month (``"2026-11"``); or give ``since``/``until``; with
    neither, all time. ``top`` keeps the first N rows. Raises `InvalidInput`
    for a malformed filter and `UnknownLimit` for a limit that is not defined.
    """
    checked_top(top)
    database = database_of(meter)
    chosen = ReportRange.of(period, since, until)
    if subject is not None:
        validate_subject(subject)
    query = chosen.query(subject=subject, limit=_checked_limit(database, limit), top=top)
    return Report(
        database, "overage", chosen, query, overage_statement(query), count_statement(query)
    )


def select_usage(
    meter: DatabaseSource,
    subject: str,
    *,
    period: str | None = None,
    since: TimeBound = None,
    until: TimeBound = None,
    limit: str | None = None,
) -> Report:
    """One subject's usage per window over time, limit by limit, oldest first."""
    database = database_of(meter)
    validate_subject(subject)
    chosen = ReportRange.of(period, since, until)
    query = chosen.query(subject=subject, limit=_checked_limit(database, limit))
    return Report(database, "usage", chosen, query, usage_statement(query), count_statement(query))


overage_report = listed(
    select_overage,
    ReportRow,
    "overage_report",
    "`select_overage`'s rows as a list (use `select_overage(...).rows()` to stream).",
)
usage_report = listed(select_usage, ReportRow, "usage_report", "`select_usage`'s rows as a list.")
