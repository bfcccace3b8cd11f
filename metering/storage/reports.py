"""The report queries: every statement `metering.reports` runs.

Reports read ``counters`` joined to the current ``limits``. Filtering,
overage and ordering happen in the database, so a report over a large ledger
returns only the rows asked for, already sorted:

* the period is a range on ``window_start_us`` (index
  ``ix_counters_window_start_us``; with a subject, ``ix_counters_subject``);
* overage is a ``CASE`` on the limit's enforcement: soft, used beyond the
  maximum; hard, the cost of denied events;
* ``ORDER BY overage DESC`` and ``LIMIT`` for ``--top``.

Rows are streamed: on PostgreSQL through a server-side cursor
(``stream_results``), ``yield_per`` rows at a time, so memory stays flat
however many rows a report has.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, Float, Select, and_, case, cast, func, literal, select

from metering.domain.state import NO_WINDOW
from metering.storage.tables import counters, limits

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


def _overage() -> Any:
    soft_overage = case(
        (counters.c.used > limits.c.maximum, counters.c.used - limits.c.maximum),
        else_=literal(0),
    )
    return case((limits.c.enforcement == "soft", soft_overage), else_=counters.c.denied_cost)


OVERAGE: Final = _overage().label("overage")
# Float only for ordering; the utilisation reported is computed from integers.
UTILISATION: Final = cast(counters.c.used, Float) / limits.c.maximum


def _filtered(query: ReportQuery, statement: Select[Any]) -> Select[Any]:
    # Token buckets have a single row with no window (start = end = 0): they
    # are not reported (see metering.reports).
    conditions = [counters.c.window_end_us != NO_WINDOW]
    if query.since_us is not None:
        conditions.append(counters.c.window_start_us >= query.since_us)
    if query.until_us is not None:
        conditions.append(counters.c.window_start_us < query.until_us)
    if query.subject is not None:
        conditions.append(counters.c.subject == query.subject)
    if query.limit is not None:
        conditions.append(counters.c.limit_name == query.limit)
    # Inner join: counters of deleted limits have no maximum to report against.
    joined = counters.join(limits, limits.c.name == counters.c.limit_name)
    return statement.select_from(joined).where(and_(*conditions))


def _rows_statement(query: ReportQuery) -> Select[Any]:
    return _filtered(
        query,
        select(
            counters.c.subject,
            counters.c.limit_name,
            limits.c.enforcement,
            counters.c.window_start_us,
            counters.c.window_end_us,
            limits.c.maximum,
            counters.c.used,
            OVERAGE,
            counters.c.denied_count,
            counters.c.denied_cost,
            counters.c.first_denied_at_us,
        ),
    )


def overage_statement(query: ReportQuery) -> Select[Any]:
    """Rows by overage, largest first; ties by utilisation, then by key."""
    statement = _rows_statement(query).order_by(
        OVERAGE.desc(),
        UTILISATION.desc(),
        counters.c.subject,
        counters.c.limit_name,
        counters.c.window_start_us,
    )
    return statement if query.top is None else statement.limit(query.top)


def usage_statement(query: ReportQuery) -> Select[Any]:
    """One subject's windows in time order, limit by limit."""
    return _rows_statement(query).order_by(counters.c.limit_name, counters.c.window_start_us)


class ReportStore:
    """Report queries on one connection; the caller owns the transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def limit_exists(self, name: str) -> bool:
        found = self.connection.execute(select(limits.c.name).where(limits.c.name == name))
        return found.first() is not None

    def count(self, query: ReportQuery) -> int:
        statement = _filtered(query, select(func.count()))
        total = int(self.connection.execute(statement).scalar_one())
        return total if query.top is None else min(total, query.top)

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
