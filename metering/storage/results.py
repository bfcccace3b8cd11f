"""The results table (one row per decided event): `ResultRecord`, the row
codecs every path shares (`result_row`, `record_from_row`), and `ResultStore`,
which fetches, inserts and counts results, and reads a window's results
back (a gauge's reports, `window_results`; a seat's values, `window_metadata`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

from sqlalchemy import and_, exists, func, literal_column, not_, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

from metering.domain.events import FUTURE_TOLERANCE_US
from metering.domain.jsonable import encoder
from metering.domain.state import CounterKey
from metering.storage.on_connection import OnConnection, chunks
from metering.storage.tables import corrections, counter_resets, results


class ResultRecord(NamedTuple):
    """One row of the results ledger; ``charges`` holds `ChargeDecision.to_row()` lists.

    A named tuple: a batch builds one per event, and a tuple costs a third
    of a frozen dataclass to make."""

    event_id: str
    outcome: str
    fingerprint: str
    occurred_at_us: int
    decided_at_us: int
    denied_by: tuple[str, ...]
    reason: str | None
    charges: Sequence[Sequence[Any]]
    metadata: Mapping[str, Any] | None


ResultRow = tuple[str, str, str, int, int, str | None, str | None, str, str | None]


# The charge rows (lists, text, whole numbers, booleans and None) and the
# metadata (validated JSON) as `json.dumps` writes them, without its encoder per call.
_compact = encoder(",", ":")
_dumps = encoder()


def result_row(record: ResultRecord) -> ResultRow:
    """The one row builder of the results table, in column order, for every path."""
    return (
        record.event_id,
        record.outcome,
        record.fingerprint,
        record.occurred_at_us,
        record.decided_at_us,
        ",".join(record.denied_by) or None,
        record.reason,
        _compact(record.charges),
        _dumps(record.metadata) if record.metadata is not None else None,
    )


RESULT_COLUMNS: Final = (
    "event_id",
    "outcome",
    "fingerprint",
    "occurred_at_us",
    "decided_at_us",
    "denied_by",
    "reason",
    "charges",
    "metadata",
)


def _plain(text: str) -> bool:
    """Whether ``text`` is printable ASCII with no quote or backslash: the
    same in JSON text whatever the encoder (no escape, no ``\\u``)."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def _like(text: str) -> str:
    """``text`` as a LIKE pattern matching itself (escape character ``\\``)."""
    return text.replace("%", "\\%").replace("_", "\\_")


def _naming(text: str) -> Any:
    """Results whose charges' JSON has ``text`` (plain, `_plain`) as a string."""
    return results.c.charges.like(f'%"{_like(text)}"%', escape="\\")


def occurred_since(since_us: int) -> ColumnElement[bool]:
    """Results of events that occurred at ``since_us`` or later. No event is
    decided before it occurred less the future's tolerance, so the decided
    time's index narrows the scan to them, not every result kept."""
    return and_(
        results.c.decided_at_us >= since_us - FUTURE_TOLERANCE_US,
        results.c.occurred_at_us >= since_us,
    )


def record_from_row(row: Sequence[Any]) -> ResultRecord:
    """A results row (columns in `RESULT_COLUMNS` order) as a `ResultRecord`."""
    event_id, outcome, fingerprint, occurred_at_us, decided_at_us, denied_by = row[:6]
    return ResultRecord(
        event_id=event_id,
        outcome=outcome,
        fingerprint=fingerprint,
        occurred_at_us=occurred_at_us,
        decided_at_us=decided_at_us,
        denied_by=tuple(denied_by.split(",")) if denied_by else (),
        reason=row[6],
        charges=json.loads(row[7]),
        metadata=json.loads(row[8]) if row[8] else None,
    )


# The reset clock's tick, read by every insert of results after the event's
# counters are locked (`metering.storage.tables.reset_clock`). On PostgreSQL
# the column's default reads it too (for the one-trip function).
RESET_TICK: Final = "coalesce((SELECT tick FROM reset_clock WHERE id = 1), 0)"

# The hot-path insert, built once per dialect so SQLAlchemy compiles it once
# and psycopg can prepare it. It runs as an executemany: with RETURNING,
# SQLAlchemy sends it as multi-row VALUES ("insertmanyvalues").
_INSERT_RESULTS: Final = {
    name: module.insert(results)
    .values(reset_tick=literal_column(RESET_TICK))
    .on_conflict_do_nothing(index_elements=["event_id"])
    .returning(results.c.event_id)
    for name, module in (("postgresql", postgresql), ("sqlite", sqlite))
}

# PostgreSQL's bulk forms (see `metering.storage.counters`): one array per column.
PG_INSERT_RESULTS: Final = f"""
INSERT INTO results (event_id, outcome, fingerprint, occurred_at_us, decided_at_us, denied_by,
                     reason, charges, metadata, reset_tick)
SELECT *, {RESET_TICK}
FROM unnest(%(id)s::text[], %(outcome)s::text[], %(fp)s::text[], %(at)s::bigint[],
            %(decided)s::bigint[], %(denied_by)s::text[], %(reason)s::text[],
            %(charges)s::text[], %(meta)s::text[])
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id
"""

PG_FETCH_RESULTS: Final = """
SELECT event_id, outcome, fingerprint, occurred_at_us, decided_at_us, denied_by, reason,
       charges, metadata
FROM results WHERE event_id = ANY(%(ids)s::text[])
"""


class ResultStore(OnConnection):
    """Results on one connection; the caller owns the transaction."""

    def reset_tick_of(self, event_id: str) -> int | None:
        """The reset clock's tick ``event_id``'s result was written at (None: no result)."""
        query = select(results.c.reset_tick).where(results.c.event_id == event_id)
        found = self.connection.execute(query).scalar_one_or_none()
        return None if found is None else int(found)

    def fetch_results(self, event_ids: Iterable[str]) -> dict[str, ResultRecord]:
        wanted = sorted(set(event_ids))
        if not wanted:
            return {}
        if self._bulk(len(wanted)):
            rows: list[Any] = list(
                self.connection.exec_driver_sql(PG_FETCH_RESULTS, {"ids": wanted})
            )
        else:
            rows = []
            for chunk in chunks(wanted):
                query = select(results).where(results.c.event_id.in_(chunk))
                rows.extend(self.connection.execute(query))
        return {row.event_id: record_from_row(row) for row in rows}

    def lock_result(self, event_id: str) -> None:
        """Lock ``event_id``'s result row, if there is one, until the
        transaction ends (PostgreSQL; SQLite's BEGIN IMMEDIATE already
        serialises writers)."""
        query = select(results.c.event_id).where(results.c.event_id == event_id)
        self.connection.execute(query.with_for_update())

    def window_results(self, key: CounterKey, except_id: str) -> list[tuple[str, int, int, str]]:
        """The allowed results but ``except_id`` that may hold a charge on
        ``key``'s window (event id, occurred_at_us, decided_at_us, charge
        rows as JSON), leaving out the voided ones and those a later reset
        of the counter cleared (as `metering.domain.corrections.Reset` says).
        A subject and limit of plain characters narrow the rows by their
        text first, as `window_metadata` does.

        A first-use window takes late events from up to one period (at most
        a month) before its start: they are looked for that far back.
        """
        columns = (results.c.occurred_at_us, results.c.decided_at_us, results.c.charges)
        query = self._in_window(key, except_id, *columns)
        if _plain(key.subject) and _plain(key.limit):  # (a superset: the caller checks them)
            query = query.where(_naming(key.subject), _naming(key.limit))
        return [(row[0], row[1], row[2], row[3]) for row in self.connection.execute(query)]

    def window_metadata(
        self, key: CounterKey, except_id: str, value: str
    ) -> list[tuple[str, str, str | None]]:
        """`window_results`' results as (event id, charge rows as JSON,
        metadata as JSON) that may carry ``value``: a seat's void looks for
        its value's other live events (`metering.engine.seats.free_seats`).
        A subject and value of plain characters (`_plain`) are written as
        they are in every JSON encoder's text, so the text is searched for
        them first (a superset: the caller checks the rows)."""
        query = self._in_window(key, except_id, results.c.charges, results.c.metadata)
        if _plain(key.subject) and _plain(value):
            query = query.where(
                _naming(key.subject), results.c.metadata.like(f"%{_like(value)}%", escape="\\")
            )
        return [(row[0], row[1], row[2]) for row in self.connection.execute(query)]

    def _in_window(self, key: CounterKey, except_id: str, *columns: Any) -> Any:
        start, end = key.window_start_us, key.window_end_us
        r = counter_resets.c
        cleared = exists().where(
            or_(r.subject.is_(None), r.subject == key.subject),
            or_(r.limit_name.is_(None), r.limit_name == key.limit),
            or_(
                and_(r.tick.is_not(None), r.tick > results.c.reset_tick),
                and_(r.tick.is_(None), r.reset_at_us >= results.c.decided_at_us),
            ),
            or_(
                r.window_start_us == start,
                and_(r.window_start_us.is_(None), r.reset_at_us < end),
            ),
        )
        voided = exists().where(corrections.c.event_id == results.c.event_id)
        return select(results.c.event_id, *columns).where(
            occurred_since(start - 2 * (end - start)),
            results.c.occurred_at_us < end,
            results.c.outcome.in_(("allowed", "overage")),
            results.c.event_id != except_id,
            not_(voided),
            not_(cleared),
        )

    def rewrite_charges(self, event_id: str, charges: Sequence[Sequence[Any]]) -> None:
        """Replace a result's charges (ledger rows): a commit of more than was
        reserved records the real cost, its grant draws and its overdraft."""
        self.connection.execute(
            update(results)
            .where(results.c.event_id == event_id)
            .values(charges=_compact([list(row) for row in charges]))
        )

    def insert_results(self, records: Sequence[ResultRecord]) -> set[str]:
        """Insert results; an id already present is skipped. Returns the ids inserted."""
        if not records:
            return set()
        params = [
            dict(zip(RESULT_COLUMNS, result_row(r), strict=True))
            for r in sorted(records, key=lambda r: r.event_id)
        ]
        if self._bulk(len(params)):
            arrays = {
                "id": [p["event_id"] for p in params],
                "outcome": [p["outcome"] for p in params],
                "fp": [p["fingerprint"] for p in params],
                "at": [p["occurred_at_us"] for p in params],
                "decided": [p["decided_at_us"] for p in params],
                "denied_by": [p["denied_by"] for p in params],
                "reason": [p["reason"] for p in params],
                "charges": [p["charges"] for p in params],
                "meta": [p["metadata"] for p in params],
            }
            rows = self.connection.exec_driver_sql(PG_INSERT_RESULTS, arrays)
            return {row.event_id for row in rows}
        found = self.connection.execute(_INSERT_RESULTS[self._dialect], params)
        return {row.event_id for row in found}

    def decided_ids(self, event_ids: Iterable[str]) -> set[str]:
        """Which of these event ids have a result."""
        found: set[str] = set()
        for chunk in chunks(sorted(set(event_ids))):
            query = select(results.c.event_id).where(results.c.event_id.in_(chunk))
            found.update(self.connection.execute(query).scalars())
        return found

    def outcome_counts(self) -> dict[str, int]:
        query = select(results.c.outcome, func.count()).group_by(results.c.outcome)
        return {outcome: int(n) for outcome, n in self.connection.execute(query)}

    def count_results(self) -> int:
        return int(self.connection.execute(select(func.count()).select_from(results)).scalar_one())
