"""The report queries: every statement `metering.reports` runs.

Reports read ``counters`` joined to the current ``limits``. Filtering,
overage and ordering happen in the database, so a report over a large ledger
returns only the rows asked for, already sorted:

* the period is a range on ``window_start_us`` (index
  ``ix_counters_window_start_us``; with a subject, ``ix_counters_subject``);
* the maximum is the one that *applied* to the subject in the window: its
  entitlement in force at the window's end (the latest ``entitlements`` row
  starting before ``window_end_us``, a NULL maximum meaning the default),
  else the limit's default. A correlated scalar subquery reads it backwards
  on the entitlements' primary key, one index probe per row;
* ``granted`` is the usage grants paid in the window: the sum of its
  ``grant_draws`` (their primary key leads with the counter's key);
* overage is a ``CASE`` on the enforcement: soft, the window's own usage
  (used less granted) beyond the applied maximum; hard, the cost of denied
  events; shadow, none (its denials are would-denies, never billed);
* ``ORDER BY overage DESC`` and ``LIMIT`` for ``--top``.

The shadow report groups a shadow limit's windows with would-denies by
subject with window functions (SQLite 3.25 and later, PostgreSQL): the
totals over each subject's windows, and its peak window (the largest
would-deny cost) picked by ``row_number``.

Rows are streamed: on PostgreSQL through a server-side cursor
(``stream_results``), ``yield_per`` rows at a time, so memory stays flat
however many rows a report has.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Select,
    and_,
    case,
    cast,
    func,
    literal,
    select,
)

from metering.domain.state import NO_WINDOW
from metering.storage.tables import counters, entitlements, grant_draws, limits

# Rows fetched per round trip from the server-side cursor.
STREAM_BATCH: Final = 10_000


@dataclass(frozen=True, slots=True)
class ReportQuery:
    """What a report selects. Instants are microseconds; None means unbounded."""

    since_us: int | None = None
    until_us: int | None = None
    subject: str | None = None
    limit: str | None = None
    top: int | None = None


def applied_maximum(
    subject: ColumnElement[Any], limit: ColumnElement[Any], window_end_us: ColumnElement[Any]
) -> ColumnElement[Any]:
    """The maximum in force for ``subject`` at the end of a window: its latest
    entitlement starting before ``window_end_us`` (exclusive end: the
    window's last instant), else, or when that entitlement is NULL (back to
    the default), the limit's default. Needs ``limits`` in the FROM."""
    latest = (
        select(entitlements.c.maximum)
        .where(
            entitlements.c.subject == subject,
            entitlements.c.limit_name == limit,
            entitlements.c.effective_from_us < window_end_us,
        )
        .order_by(entitlements.c.effective_from_us.desc())
        .limit(1)
        .scalar_subquery()
    )
    return func.coalesce(latest, limits.c.maximum)


def _granted() -> ColumnElement[Any]:
    drawn = (
        select(func.coalesce(func.sum(grant_draws.c.amount), 0))
        .where(
            grant_draws.c.subject == counters.c.subject,
            grant_draws.c.limit_name == counters.c.limit_name,
            grant_draws.c.window_start_us == counters.c.window_start_us,
        )
        .scalar_subquery()
    )
    return drawn


def _window_conditions(query: ReportQuery) -> list[ColumnElement[bool]]:
    # Token buckets have a single row with no window (start = end = 0): they
    # are not reported (see metering.reports).
    conditions: list[ColumnElement[bool]] = [counters.c.window_end_us != NO_WINDOW]
    if query.since_us is not None:
        conditions.append(counters.c.window_start_us >= query.since_us)
    if query.until_us is not None:
        conditions.append(counters.c.window_start_us < query.until_us)
    if query.subject is not None:
        conditions.append(counters.c.subject == query.subject)
    if query.limit is not None:
        conditions.append(counters.c.limit_name == query.limit)
    return conditions


def _filtered(query: ReportQuery, statement: Select[Any]) -> Select[Any]:
    # Inner join: counters of deleted limits have no maximum to report against.
    joined = counters.join(limits, limits.c.name == counters.c.limit_name)
    return statement.select_from(joined).where(and_(*_window_conditions(query)))


def _windows(query: ReportQuery) -> Any:
    """The selected counters with their applied maximum and grant-paid usage,
    as a derived table: the overage, ordering and utilisation read its
    columns, so each subquery is written once."""
    return _filtered(
        query,
        select(
            counters.c.subject,
            counters.c.limit_name,
            limits.c.enforcement,
            counters.c.window_start_us,
            counters.c.window_end_us,
            applied_maximum(
                counters.c.subject, counters.c.limit_name, counters.c.window_end_us
            ).label("maximum"),
            counters.c.used,
            _granted().label("granted"),
            counters.c.denied_count,
            counters.c.denied_cost,
            counters.c.first_denied_at_us,
        ),
    ).subquery("windows")


def _overage(w: Any) -> ColumnElement[Any]:
    own = w.c.used - w.c.granted
    soft_overage = case((own > w.c.maximum, own - w.c.maximum), else_=literal(0))
    return case(
        (w.c.enforcement == "soft", soft_overage),
        (w.c.enforcement == "shadow", literal(0)),
        else_=w.c.denied_cost,
    )


def _rows_statement(query: ReportQuery) -> tuple[Select[Any], Any, Any]:
    w = _windows(query)
    overage = _overage(w).label("overage")
    statement = select(
        w.c.subject,
        w.c.limit_name,
        w.c.enforcement,
        w.c.window_start_us,
        w.c.window_end_us,
        w.c.maximum,
        w.c.used,
        w.c.granted,
        overage,
        w.c.denied_count,
        w.c.denied_cost,
        w.c.first_denied_at_us,
    )
    return statement, w, overage


def overage_statement(query: ReportQuery) -> Select[Any]:
    """Rows by overage, largest first; ties by utilisation, then by key."""
    statement, w, overage = _rows_statement(query)
    # Float only for ordering; the utilisation reported is computed from integers.
    utilisation = cast(w.c.used, Float) / w.c.maximum
    statement = statement.order_by(
        overage.desc(),
        utilisation.desc(),
        w.c.subject,
        w.c.limit_name,
        w.c.window_start_us,
    )
    return statement if query.top is None else statement.limit(query.top)


def usage_statement(query: ReportQuery) -> Select[Any]:
    """One subject's windows in time order, limit by limit."""
    statement, w, _ = _rows_statement(query)
    return statement.order_by(w.c.limit_name, w.c.window_start_us)


def _shadow_windows(query: ReportQuery) -> Any:
    """A limit's windows with would-denies, each with its subject's totals
    and its rank among the subject's windows (1: the peak)."""
    by_subject = counters.c.subject
    conditions = [*_window_conditions(query), counters.c.denied_count > 0]
    return (
        select(
            counters.c.subject,
            counters.c.limit_name,
            counters.c.window_start_us,
            counters.c.window_end_us,
            counters.c.used,
            counters.c.denied_cost,
            func.sum(counters.c.denied_count).over(partition_by=by_subject).label("events"),
            func.sum(counters.c.denied_cost).over(partition_by=by_subject).label("cost"),
            func.count().over(partition_by=by_subject).label("windows"),
            func.min(counters.c.first_denied_at_us).over(partition_by=by_subject).label("first_us"),
            func.row_number()
            .over(
                partition_by=by_subject,
                order_by=(counters.c.denied_cost.desc(), counters.c.window_start_us),
            )
            .label("rank"),
        )
        .where(and_(*conditions))
        .subquery("shadow_windows")
    )


def shadow_statement(query: ReportQuery) -> Select[Any]:
    """One row per subject a shadow limit would have denied, by would-deny
    cost, largest first; ties by would-deny count, then subject."""
    w = _shadow_windows(query)
    statement = (
        select(
            w.c.subject,
            w.c.limit_name,
            w.c.events,
            w.c.cost,
            w.c.windows,
            w.c.first_us,
            w.c.window_start_us,
            w.c.window_end_us,
            w.c.used,
            applied_maximum(w.c.subject, w.c.limit_name, w.c.window_end_us),
            w.c.denied_cost,
        )
        .select_from(w.join(limits, limits.c.name == w.c.limit_name))
        .where(w.c.rank == 1)
        .order_by(w.c.cost.desc(), w.c.events.desc(), w.c.subject)
    )
    return statement if query.top is None else statement.limit(query.top)


def shadow_count_statement(query: ReportQuery) -> Select[Any]:
    """How many subjects `shadow_statement` has (before ``top``)."""
    conditions = [*_window_conditions(query), counters.c.denied_count > 0]
    return select(func.count(func.distinct(counters.c.subject))).where(and_(*conditions))


def count_statement(query: ReportQuery) -> Select[Any]:
    """How many rows `overage_statement` and `usage_statement` have (before ``top``)."""
    return _filtered(query, select(func.count()))


@dataclass(frozen=True, slots=True)
class LimitKind:
    """What a report needs to know of a limit beyond its name."""

    enforcement: str
    algorithm: str


class ReportStore:
    """Report queries on one connection; the caller owns the transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def limit_exists(self, name: str) -> bool:
        return self.limit_kind(name) is not None

    def limit_kind(self, name: str) -> LimitKind | None:
        found = self.connection.execute(
            select(limits.c.enforcement, limits.c.algorithm).where(limits.c.name == name)
        ).first()
        return None if found is None else LimitKind(found[0], found[1])

    def count(self, statement: Select[Any], top: int | None) -> int:
        total = int(self.connection.execute(statement).scalar_one())
        return total if top is None else min(total, top)

    def stream(self, statement: Select[Any]) -> Iterator[Any]:
        """Rows of ``statement``, fetched ``STREAM_BATCH`` at a time.

        On PostgreSQL this is a server-side cursor; SQLite's cursor steps
        through the result as it is read anyway.
        """
        streaming = self.connection.execution_options(stream_results=True, yield_per=STREAM_BATCH)
        # Closed however the reader stops: read to the end, or closed midway (a
        # client that left); PostgreSQL's server-side cursor then closes at once.
        with streaming.execute(statement) as result:
            yield from result
