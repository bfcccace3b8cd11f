"""The report queries: every statement `metering.reports` runs (`ReportQuery` selects).

Reports read ``counters`` joined to the current ``limits``; filtering, overage and ordering
happen in the database. The period is a billing month (``counters.billing_month``) or a
range on ``window_start_us``. The maximum is the one that applied (`with_applied_maximum`):
the entitlement span holding the window's last instant, else the default of the definition
span holding it, with the enforcement (`with_definition`). Overage: soft, used less granted
beyond the maximum; hard and shadow, none. Overdraft: the one recorded (summed per window,
outer-joined), capped at that usage past the maximum less the overage. The shadow report
ranks windows with window functions; rows stream (PostgreSQL: `STREAM_BATCH` a round trip).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Float,
    Select,
    Table,
    and_,
    case,
    cast,
    exists,
    func,
    literal,
    null,
    or_,
    select,
)

from metering.domain.state import NO_WINDOW
from metering.storage.tables import (
    corrections,
    counters,
    entitlements,
    limit_definitions,
    limits,
    overdrafts,
)

# Rows fetched per round trip from the server-side cursor.
STREAM_BATCH: Final = 10_000


@dataclass(frozen=True, slots=True)
class ReportQuery:
    """What a report selects. Instants are microseconds; None means unbounded."""

    since_us: int | None = None
    until_us: int | None = None
    # A billing month (``2026-11``): counters by their ``billing_month``
    # instead of the range (the range is then that month in UTC, for hours).
    month: str | None = None
    subject: str | None = None
    limit: str | None = None
    top: int | None = None


def _entitlement_spans() -> Any:
    """Each entitlement change with the start of the next one for the same
    subject and limit (NULL for the latest): the span in which it applies."""
    following = func.lead(entitlements.c.effective_from_us).over(
        partition_by=(entitlements.c.subject, entitlements.c.limit_name),
        order_by=entitlements.c.effective_from_us,
    )
    return select(
        entitlements.c.subject,
        entitlements.c.limit_name,
        entitlements.c.effective_from_us,
        following.label("next_from_us"),
        entitlements.c.maximum,
    ).subquery("entitled")


def _definition_spans() -> Any:
    """Each change of a limit's default maximum and enforcement with the span
    in which it applies: from its start (NULL for the first: from the
    beginning) to the next change's (NULL for the latest)."""
    d = limit_definitions.c
    previous = func.lag(d.effective_from_us).over(
        partition_by=d.limit_name, order_by=d.effective_from_us
    )
    following = func.lead(d.effective_from_us).over(
        partition_by=d.limit_name, order_by=d.effective_from_us
    )
    return select(
        d.limit_name,
        case((previous.is_(None), null()), else_=d.effective_from_us).label("opens_us"),
        following.label("next_from_us"),
        d.maximum,
        d.enforcement,
    ).subquery("defined")


def with_definition(
    joined: Any, limit: Any, window_end_us: Any
) -> tuple[Any, ColumnElement[Any], ColumnElement[Any]]:
    """``joined`` (which has ``limits``) with the limit's definition in force at
    the end of a window outer-joined (its span holds the window's last instant;
    the first holds every instant before it), and the default maximum and
    enforcement that applied: that definition's, else (none recorded) the
    limit's now."""
    spans = _definition_spans()
    covers = and_(
        spans.c.limit_name == limit,
        or_(spans.c.opens_us.is_(None), spans.c.opens_us < window_end_us),
        or_(spans.c.next_from_us.is_(None), spans.c.next_from_us >= window_end_us),
    )
    default = func.coalesce(spans.c.maximum, limits.c.maximum)
    enforcement = func.coalesce(spans.c.enforcement, limits.c.enforcement)
    return joined.outerjoin(spans, covers), default, enforcement


def with_entitled_maximum(
    joined: Any, subject: Any, limit: Any, window_end_us: Any, default: ColumnElement[Any]
) -> tuple[Any, ColumnElement[Any]]:
    """``joined`` with the subject's entitlement in force at the end of a window
    outer-joined, and the maximum that applied: that entitlement's, else, or
    when it is NULL (back to the default), ``default``. In force at the end
    means the span holds the window's last instant (the end is exclusive): it
    starts before ``window_end_us`` and the next change, if any, starts at or
    after it."""
    spans = _entitlement_spans()
    covers = and_(
        spans.c.subject == subject,
        spans.c.limit_name == limit,
        spans.c.effective_from_us < window_end_us,
        or_(spans.c.next_from_us.is_(None), spans.c.next_from_us >= window_end_us),
    )
    return joined.outerjoin(spans, covers), func.coalesce(spans.c.maximum, default)


def with_applied_maximum(
    joined: Any, subject: Any, limit: Any, window_end_us: Any
) -> tuple[Any, ColumnElement[Any], ColumnElement[Any]]:
    """``joined`` (which has ``limits``) with what applied to a window: the
    maximum (the subject's entitlement in force at the window's end, else the
    limit's default in force then, `with_definition`) and the enforcement in
    force then. A change back to the default takes the default of the
    window's end, not the one of the change."""
    joined, default, enforcement = with_definition(joined, limit, window_end_us)
    joined, maximum = with_entitled_maximum(joined, subject, limit, window_end_us, default)
    return joined, maximum, enforcement


def _with_window_sum(
    joined: Any, table: Table, column: str, name: str, *where: ColumnElement[bool]
) -> tuple[Any, ColumnElement[Any]]:
    """``joined`` (which has ``counters``) with ``table``'s ``column`` summed per
    window (rows matching ``where``), outer-joined as ``name``; and that sum
    (0 without rows)."""
    # PostgreSQL sums bigints as numeric: back to bigint, for integer arithmetic.
    key = (table.c.subject, table.c.limit_name, table.c.window_start_us)
    summed = (
        select(*key, cast(func.sum(table.c[column]), BigInteger).label(column))
        .where(*where)
        .group_by(*key)
        .subquery(name)
    )
    same_window = and_(
        summed.c.subject == counters.c.subject,
        summed.c.limit_name == counters.c.limit_name,
        summed.c.window_start_us == counters.c.window_start_us,
    )
    return joined.outerjoin(summed, same_window), func.coalesce(summed.c[column], 0)


def _with_overdraft(joined: Any) -> tuple[Any, ColumnElement[Any]]:
    """``joined`` with each window's overdraft, over the events not voided since."""
    voided = exists().where(corrections.c.event_id == overdrafts.c.event_id)
    return _with_window_sum(joined, overdrafts, "units", "overdrawn", ~voided)


def _window_conditions(query: ReportQuery) -> list[ColumnElement[bool]]:
    # Token buckets have a single row with no window (start = end = 0): they
    # are not reported (see metering.reports).
    conditions: list[ColumnElement[bool]] = [counters.c.window_end_us != NO_WINDOW]
    if query.month is not None:
        conditions.append(counters.c.billing_month == query.month)
    else:
        if query.since_us is not None:
            conditions.append(counters.c.window_start_us >= query.since_us)
        if query.until_us is not None:
            conditions.append(counters.c.window_start_us < query.until_us)
    if query.subject is not None:
        conditions.append(counters.c.subject == query.subject)
    if query.limit is not None:
        conditions.append(counters.c.limit_name == query.limit)
    return conditions


def _counted() -> Any:
    # Inner join: counters of deleted limits have no maximum to report against.
    return counters.join(limits, limits.c.name == counters.c.limit_name)


def _filtered(query: ReportQuery, statement: Select[Any]) -> Select[Any]:
    return statement.select_from(_counted()).where(and_(*_window_conditions(query)))


def _windows(query: ReportQuery) -> Any:
    """The selected counters with their applied maximum and grant-paid usage,
    as a derived table: the overage, ordering and utilisation read its
    columns, so each expression is written once."""
    joined, maximum, enforcement = with_applied_maximum(
        _counted(), counters.c.subject, counters.c.limit_name, counters.c.window_end_us
    )
    granted = counters.c.granted  # the grant-paid usage
    joined, recorded = _with_overdraft(joined)
    statement = select(
        counters.c.subject,
        counters.c.limit_name,
        enforcement.label("enforcement"),
        counters.c.window_start_us,
        counters.c.window_end_us,
        maximum.label("maximum"),
        counters.c.used,
        granted.label("granted"),
        recorded.label("recorded_overdraft"),
        counters.c.denied_count,
        counters.c.denied_cost,
        counters.c.first_denied_at_us,
    )
    filtered = statement.select_from(joined).where(and_(*_window_conditions(query)))
    return filtered.subquery("windows")


def _overage(w: Any) -> ColumnElement[Any]:
    """Billable usage: a soft limit's own usage (used less granted) beyond the
    maximum; 0 for hard and shadow limits (denied cost is never overage)."""
    own = w.c.used - w.c.granted
    soft_overage = case((own > w.c.maximum, own - w.c.maximum), else_=literal(0))
    return case((w.c.enforcement == "soft", soft_overage), else_=literal(0))


def _overdraft(w: Any, overage: ColumnElement[Any]) -> ColumnElement[Any]:
    """Billable overdraft: what commits of more than was reserved recorded past
    a hard limit (`_with_overdraft`), but never more than the window's own usage
    (used less granted) past the maximum shown, less the overage billed of it.
    A commit measured its overdraft against the maximum of its decision; an
    entitlement set since, raising the maximum shown, bills less of it, and
    one lowering it bills no more than was recorded."""
    room = w.c.used - w.c.granted - w.c.maximum - overage
    billed = case((w.c.recorded_overdraft < room, w.c.recorded_overdraft), else_=room)
    return case((billed > 0, billed), else_=literal(0))


def _rows_statement(query: ReportQuery) -> tuple[Select[Any], Any, Any, Any]:
    w = _windows(query)
    overage = _overage(w)
    overdraft = _overdraft(w, overage).label("overdraft")
    overage = overage.label("overage")
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
        overdraft,
        w.c.denied_cost,
        w.c.denied_count,
        w.c.first_denied_at_us,
    )
    return statement, w, overage, overdraft


def overage_statement(query: ReportQuery) -> Select[Any]:
    """Rows by overage, largest first; ties by denied cost, utilisation, then by key."""
    statement, w, overage, overdraft = _rows_statement(query)
    # Float only for ordering; the utilisation reported is computed from integers.
    utilisation = cast(w.c.used, Float) / w.c.maximum
    statement = statement.order_by(
        overage.desc(),
        overdraft.desc(),
        w.c.denied_cost.desc(),
        utilisation.desc(),
        w.c.subject,
        w.c.limit_name,
        w.c.window_start_us,
    )
    return statement if query.top is None else statement.limit(query.top)


def usage_statement(query: ReportQuery) -> Select[Any]:
    """One subject's windows in time order, limit by limit."""
    statement, w, _, _ = _rows_statement(query)
    return statement.order_by(w.c.limit_name, w.c.window_start_us)


def _shadow_windows(query: ReportQuery) -> Any:
    """A limit's windows with would-denies while it was shadow (its
    enforcement in force at the window's end), each with the default maximum
    then, its subject's totals and its rank among the subject's windows (1:
    the peak)."""
    by_subject = counters.c.subject
    joined, default, enforcement = with_definition(
        _counted(), counters.c.limit_name, counters.c.window_end_us
    )
    conditions = [*_window_conditions(query), counters.c.denied_count > 0, enforcement == "shadow"]
    return (
        select(
            counters.c.subject,
            counters.c.limit_name,
            counters.c.window_start_us,
            counters.c.window_end_us,
            counters.c.used,
            counters.c.denied_cost,
            default.label("default_maximum"),
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
        .select_from(joined)
        .where(and_(*conditions))
        .subquery("shadow_windows")
    )


def shadow_statement(query: ReportQuery) -> Select[Any]:
    """One row per subject a shadow limit would have denied, by would-deny
    cost, largest first; ties by would-deny count, then subject."""
    w = _shadow_windows(query)
    joined, maximum = with_entitled_maximum(
        w, w.c.subject, w.c.limit_name, w.c.window_end_us, w.c.default_maximum
    )
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
            maximum,
            w.c.denied_cost,
        )
        .select_from(joined)
        .where(w.c.rank == 1)
        .order_by(w.c.cost.desc(), w.c.events.desc(), w.c.subject)
    )
    return statement if query.top is None else statement.limit(query.top)


def shadow_count_statement(query: ReportQuery) -> Select[Any]:
    """How many subjects `shadow_statement` has (before ``top``)."""
    joined, _, enforcement = with_definition(
        _counted(), counters.c.limit_name, counters.c.window_end_us
    )
    conditions = [*_window_conditions(query), counters.c.denied_count > 0, enforcement == "shadow"]
    subjects = func.count(func.distinct(counters.c.subject))
    return select(subjects).select_from(joined).where(and_(*conditions))


def count_statement(query: ReportQuery) -> Select[Any]:
    """How many rows `overage_statement` and `usage_statement` have (before ``top``)."""
    return _filtered(query, select(func.count()))


@dataclass(frozen=True, slots=True)
class LimitKind:
    """What a report needs to know of a limit beyond its name."""

    enforcement: str
    algorithm: str
    # Whether it was a shadow limit in some definition (now, or before a change).
    ever_shadow: bool = False


class ReportStore:
    """Report queries on one connection; the caller owns the transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def limit_exists(self, name: str) -> bool:
        return self.limit_kind(name) is not None

    def limit_kind(self, name: str) -> LimitKind | None:
        d = limit_definitions.c
        shadow = exists().where(d.limit_name == name, d.enforcement == "shadow")
        found = self.connection.execute(
            select(limits.c.enforcement, limits.c.algorithm, shadow).where(limits.c.name == name)
        ).first()
        if found is None:
            return None
        return LimitKind(found[0], found[1], found[0] == "shadow" or bool(found[2]))

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
