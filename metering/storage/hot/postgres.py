"""The hot path on PostgreSQL: psycopg directly, JSON arrays, pipeline mode.

Each statement takes its rows as one JSON array parameter, encoded by the
standard library's C encoder in one call and unpacked on the server by
``jsonb_array_elements``. That is several times cheaper in the client than
psycopg's per-element adaptation of array parameters (measured: 24 against
36 µs of client CPU per event), and the statement text is fixed whatever
the batch size, so it is prepared and planned once. ``jsonb`` rather than
``json``: its elements are parsed once, not once per field (a 1,000-row
results insert took 6.5 ms against 15). Results come back in binary.

`read` sends its statements in one pipeline (one round trip); `write` sends
its own with the COMMIT in another, which a batch's results may open while
it is decided (`PostgresHotStore.sending`). A batch's ids may be sent ahead
(`PostgresHotStore.looking_up`), before it is planned: `read` then goes on
in that pipeline, and the server looks them up while the client plans. On
a connection in autocommit (those of `DirectPostgres`) the store begins
the transaction itself: its first pipeline opens with a ``BEGIN``
statement and `write` ends with a ``COMMIT`` statement, so that each
pipeline waits for the server once (psycopg's own ``BEGIN``, and its
`commit` inside a pipeline, would each wait again).
Results are fetched after a pipeline's sync, not before.

Locking writes nothing: ``SELECT ... FOR UPDATE`` locks the counters and
first-use windows that exist; missing ones are inserted by `write` with a
plain ``INSERT``, so a concurrent creator makes it fail (unique violation)
and the transaction runs again. Every counter is written once per batch.
Rows are locked sorted ``COLLATE "C"`` (UTF-8 byte order is code point
order, the order of Python's ``sorted``), and inserted sorted; a transaction
takes all its locks before its first insert, so waits never form a cycle
(for the results a batch sends while it is decided, see `PostgresHotStore.sending`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, StatementError

from metering.domain.breaker import Breaker, breaker_of
from metering.domain.distinct import SeatKey, Seen
from metering.domain.recurring import Issue, next_due_us
from metering.domain.rollups import appended_rows
from metering.domain.rules import Key
from metering.domain.windows import Window
from metering.storage.allowances import drawn_by_window, grant_deltas, pots_of
from metering.storage.connections import RetryTransaction
from metering.storage.counters import Pair
from metering.storage.hot import Changes, ReadRequest, Snapshot, WantedSeat
from metering.storage.hot.extras import (
    BREAKER_SECRET,
    INSERT_MESSAGES,
    INSERT_SECRET,
    LOCK_BREAKERS,
    MARK_LOW,
    READ_SECRET,
    RECORD_NOTICES,
    UPDATE_BREAKERS,
    UPSERT_BREAKERS,
    low_documents,
    pg_breaker_params,
    pg_breaker_updates,
    pg_low_params,
    pg_message_params,
    pg_notice_params,
)
from metering.storage.hot.statements import (
    RESULT_COLUMNS,
    VERSION,
    Statements,
    counter_insert,
    counter_update,
    seat_rows,
)
from metering.storage.rates import created_rate, rate_set
from metering.storage.recurring import (
    ISSUE_COLUMNS,
    SCHEDULE_COLUMNS,
    ScheduleRecord,
    issue_row,
    schedule_of_values,
)
from metering.storage.rejected import rejected_rows
from metering.storage.reservations import ReservationRecord, record_of_row
from metering.storage.results import RESET_TICK, ResultRecord, record_from_row, result_row
from metering.storage.rollups import PG_APPEND

FETCH_RESULTS: Final = f"""
SELECT {RESULT_COLUMNS}
FROM results WHERE event_id IN (SELECT jsonb_array_elements_text(%(ids)s::jsonb))
"""

_PAIRS: Final = "(SELECT r->>0 AS l, r->>1 AS s FROM jsonb_array_elements(%(pairs)s::jsonb) AS r)"

# Each row is found through its primary key (a LATERAL lookup per element):
# a join would let the planner scan the whole table for a single event. The
# elements are locked in the order given, sorted.
LOCK_WINDOWS: Final = f"""
SELECT w.limit_name, w.subject, w.window_start_us, w.window_end_us, w.tid::text
FROM {_PAIRS} AS p
CROSS JOIN LATERAL (
    SELECT *, ctid AS tid FROM current_windows AS w
    WHERE w.limit_name = p.l AND w.subject = p.s FOR UPDATE
) AS w
"""

# The counters a batch needs: its calendar and bucket keys, and the current
# counter of each first-use window (locked by the statement before), each
# with its seat window's stamp (`metering.engine.seats.HeldCache`).
LOCK_COUNTERS: Final = f"""
SELECT c.limit_name, c.subject, c.window_start_us, c.used, c.denied_count, c.denied_cost,
       c.first_denied_at_us, c.tat_us, c.tat_rem, c.tat_scale, c.tid::text, c.rate, c.rate_at_us,
       c.granted, c.seats_stamp
FROM (
    SELECT * FROM (
        SELECT r->>0 AS l, r->>1 AS s, (r->>2)::bigint AS ws
        FROM jsonb_array_elements(%(keys)s::jsonb) AS r
        UNION ALL
        SELECT w.limit_name, w.subject, w.window_start_us
        FROM {_PAIRS} AS p
        CROSS JOIN LATERAL (
            SELECT * FROM current_windows AS w WHERE w.limit_name = p.l AND w.subject = p.s
        ) AS w
        WHERE w.window_start_us IS NOT NULL
    ) AS u
    ORDER BY u.l COLLATE "C", u.s COLLATE "C", u.ws
) AS k
CROSS JOIN LATERAL (
    SELECT *, ctid AS tid FROM counters AS c
    WHERE c.limit_name = k.l AND c.subject = k.s AND c.window_start_us = k.ws
    FOR UPDATE
) AS c
"""

# A few rows (a single event) are written one statement each, through the
# primary key; more go through one jsonb array.
FEW_ROWS: Final = 16
SQL: Final = Statements.of("%s")

# Many rows are updated through the tuple ids their lock returned: a join on
# the key lets the planner hash a sequential scan of the whole table when its
# statistics lag behind (measured: 4.7 ms against 0.13 for 32 rows of
# 20,000). A locked row cannot move before this transaction ends, and the
# transaction writes each row once.
UPDATE_COUNTERS: Final = f"""
UPDATE counters AS c
SET used = v.used, denied_count = v.dc, denied_cost = v.dcost, first_denied_at_us = v.fd,
    tat_us = v.tat, tat_rem = v.rem, tat_scale = v.scale, updated_at_us = %(now)s,
    granted = c.granted + v.granted,
    {rate_set(now="%(now)s", new_used="v.used", row="c.")}
FROM (
    SELECT (r->>0)::tid, (r->>1)::bigint, (r->>2)::bigint, (r->>3)::bigint, (r->>4)::bigint,
           (r->>5)::bigint, (r->>6)::bigint, (r->>7)::bigint, (r->>8)::bigint
    FROM jsonb_array_elements(%(rows)s::jsonb) AS r
) AS v(tid, used, dc, dcost, fd, tat, rem, scale, granted)
WHERE c.ctid = v.tid
"""

INSERT_COUNTERS: Final = """
INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used, denied_count,
                      denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale, updated_at_us,
                      rate, rate_at_us, billing_month, granted)
SELECT r->>0, r->>1, (r->>2)::bigint, (r->>3)::bigint, (r->>4)::bigint, (r->>5)::bigint,
       (r->>6)::bigint, (r->>7)::bigint, (r->>8)::bigint, (r->>9)::bigint, (r->>10)::bigint,
       %(now)s, (r->>11)::float8, %(now)s, r->>12, (r->>13)::bigint
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
"""

INSERT_WINDOWS: Final = """
INSERT INTO current_windows (limit_name, subject, window_start_us, window_end_us)
SELECT r->>0, r->>1, (r->>2)::bigint, (r->>3)::bigint FROM jsonb_array_elements(%(rows)s::jsonb) r
"""

UPDATE_WINDOW: Final = """
UPDATE current_windows SET window_start_us = %s, window_end_us = %s
WHERE limit_name = %s AND subject = %s
"""
UPDATE_WINDOWS: Final = """
UPDATE current_windows AS w SET window_start_us = v.ws, window_end_us = v.we
FROM (
    SELECT (r->>0)::tid, (r->>1)::bigint, (r->>2)::bigint
    FROM jsonb_array_elements(%(rows)s::jsonb) AS r
) AS v(tid, ws, we)
WHERE w.ctid = v.tid
"""

# No ON CONFLICT: an id decided meanwhile by another transaction fails the
# whole transaction, which is then retried with its ids looked up first.
INSERT_RESULTS: Final = f"""
INSERT INTO results ({RESULT_COLUMNS}, reset_tick)
SELECT r->>0, r->>1, r->>2, (r->>3)::bigint, (r->>4)::bigint, r->>5, r->>6, r->>7, r->>8,
       {RESET_TICK}
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
"""

# A batch's subjects that have grants: their balances, read in `read`'s
# pipeline after the counters are locked, without a lock of their own (what
# each window drew is its counter's ``granted``, read under its lock). A
# balance may be spent by a transaction on another window of the same
# subject (a late event), and the grants' check constraint (used <= amount)
# then refuses the write. Only the grants a batch can draw on or count: not
# used up, and not expired at ``since`` (`ReadRequest.grants_since_us`).
READ_GRANTS: Final = """
SELECT g.limit_name, g.subject, g.grant_id, g.amount, g.used, g.effective_from_us, g.expires_at_us,
    g.priority, g.low_at, g.low_sent
FROM jsonb_array_elements(%(grant_pairs)s::jsonb) AS r
CROSS JOIN LATERAL (
    SELECT * FROM grants AS g
    WHERE g.limit_name = r->>0 AND g.subject = r->>1 AND g.used < g.amount
      AND (g.expires_at_us IS NULL OR g.expires_at_us > %(since)s)
) AS g
"""
# A batch's seat values (`metering.domain.distinct`): their live events,
# read in `read`'s pipeline after the counters are locked (the counter's
# lock serialises every writer of its window's values,
# `metering.storage.distinct`). A start of null is the pair's current
# first-use window, locked by then. Found through the primary key, a probe
# per element: the ``LIMIT`` keeps the planner from joining the elements to
# the whole table, which it did on a small one, hashing all its rows after
# a sequential scan (10,000 rows, 949 values: 27 ms against 21.5).
READ_SEATS: Final = """
SELECT d.limit_name, d.subject, d.window_start_us, d.value, d.live_events
FROM jsonb_array_elements(%(seats)s::jsonb) AS r
CROSS JOIN LATERAL (
    SELECT * FROM distinct_values AS d
    WHERE d.subject = r->>1 AND d.limit_name = r->>0 AND d.value = r->>3
      AND d.window_start_us = coalesce((r->>2)::bigint, (
          SELECT w.window_start_us FROM current_windows AS w
          WHERE w.limit_name = r->>0 AND w.subject = r->>1
      ))
    LIMIT 1
) AS d
"""
ADD_SEATS: Final = """
INSERT INTO distinct_values AS d (subject, limit_name, window_start_us, value, live_events)
SELECT r->>0, r->>1, (r->>2)::bigint, r->>3, (r->>4)::bigint
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
ON CONFLICT (subject, limit_name, window_start_us, value)
DO UPDATE SET live_events = d.live_events + excluded.live_events
"""
# The values `read` looked for under the counters' locks and did not find:
# their first rows, without the upsert's check for one (a row written
# meanwhile would fail the key, 23505, and the transaction run again).
INSERT_SEATS: Final = """
INSERT INTO distinct_values (subject, limit_name, window_start_us, value, live_events)
SELECT r->>0, r->>1, (r->>2)::bigint, r->>3, (r->>4)::bigint
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
"""
# The held values of seat windows (limit, subject, start): a range of the
# primary key each.
READ_HELD: Final = """
SELECT d.limit_name, d.subject, d.window_start_us, d.value
FROM jsonb_array_elements(%(windows)s::jsonb) AS r
CROSS JOIN LATERAL (
    SELECT * FROM distinct_values AS d
    WHERE d.subject = r->>1 AND d.limit_name = r->>0 AND d.window_start_us = (r->>2)::bigint
      AND d.live_events > 0
    OFFSET 0
) AS d
"""
# A grant with an expected ``used`` (`Changes.expected`) that another
# transaction drew on meanwhile is set past its amount: the check constraint
# refuses it, and the transaction runs again (`write`).
UPDATE_GRANTS: Final = """
UPDATE grants AS g
SET used = CASE WHEN v.expected IS NULL OR g.used = v.expected THEN g.used + v.delta
                ELSE g.amount + 1 END
FROM (
    SELECT r->>0, (r->>1)::bigint, (r->>2)::bigint FROM jsonb_array_elements(%(rows)s::jsonb) AS r
) AS v(id, delta, expected)
WHERE g.grant_id = v.id
"""

# The recurring grants of the pairs the cache has due, locked in the general
# engine's order (`metering.storage.recurring.ScheduleStore.lock_due`), before
# anything else; those not due any more tell the cache their next issue.
LOCK_SCHEDULES: Final = f"""
SELECT {SCHEDULE_COLUMNS} FROM grant_schedules
WHERE (limit_name, subject) IN (
    SELECT r->>0, r->>1 FROM jsonb_array_elements(%(due_pairs)s::jsonb) AS r
)
ORDER BY schedule_id COLLATE "C"
FOR UPDATE
"""
# Their last issues (`issue_id`), read after the lock.
LAST_ISSUES: Final = """
SELECT s.schedule_id, g.amount, g.used, g.effective_from_us, g.expires_at_us
FROM grant_schedules AS s
JOIN grants AS g ON g.grant_id = CASE WHEN s.last_issue = 1 THEN s.schedule_id
                                      ELSE s.schedule_id || '/' || s.last_issue::text END
WHERE (s.limit_name, s.subject) IN (
    SELECT r->>0, r->>1 FROM jsonb_array_elements(%(due_pairs)s::jsonb) AS r
)
"""
# An issue made already fails the insert (a unique violation): run again.
INSERT_ISSUES: Final = f"""
INSERT INTO grants ({", ".join(ISSUE_COLUMNS)})
SELECT r->>0, r->>1, r->>2, (r->>3)::bigint, (r->>4)::bigint, (r->>5)::bigint, (r->>6)::bigint,
       r->>7, (r->>8)::bigint, (r->>9)::int, r->>10, (r->>11)::int, (r->>12)::bigint,
       (r->>13)::boolean
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
"""
MOVE_SCHEDULES: Final = """
UPDATE grant_schedules AS s SET last_issue = v.last, next_issue_us = v.next
FROM (
    SELECT r->>0, (r->>1)::int, (r->>2)::int, (r->>3)::bigint
    FROM jsonb_array_elements(%(rows)s::jsonb) AS r
) AS v(id, was, last, next)
WHERE s.schedule_id = v.id AND s.last_issue = v.was
"""


# Dead letters (`metering.storage.rejected.rejected_rows`), in their order; one already
# kept is not again.
INSERT_REJECTED: Final = """
INSERT INTO rejected_messages (digest, event_id, reason, raw, received_at_us)
SELECT r->>0, r->>1, r->>2, r->>3, (r->>4)::bigint
FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS e(r, n)
ORDER BY n
ON CONFLICT (digest) DO NOTHING
"""

LOCK_RESERVATION: Final = SQL.select_reservation + " FOR UPDATE"

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(slots=True)
class ReadRows:
    """The rows `PostgresHotStore.read`'s statements return, before they
    become a `Snapshot` (`snapshot_of`)."""

    version: int
    # (limit, subject, window start, window end[, tuple id]).
    windows: Sequence[Sequence[Any]]
    # (limit, subject, window start, the 7 fields of a `State`[, tuple id]).
    counters: Sequence[Sequence[Any]]
    # `READ_GRANTS`'s, and each locked counter's ``granted`` (limit, subject, start, granted).
    grants: Sequence[Sequence[Any]] = ()
    draws: Sequence[Sequence[Any]] = ()
    # (limit, subject, window start, value, live events).
    seats: Sequence[Sequence[Any]] = ()
    stored: Sequence[Sequence[Any]] = ()
    schedules: Sequence[Sequence[Any]] = ()
    lasts: Sequence[Sequence[Any]] = ()
    breakers: Sequence[Sequence[Any]] = ()
    secret: str | None = None
    # The pairs whose grants were asked: each has a pot, its grants read or not.
    grant_pairs: Sequence[Pair] = ()


def snapshot_of(rows: ReadRows) -> Snapshot:
    """The `Snapshot` of ``rows``: what the fast path decides on."""
    grant_rows = rows.grants
    lasts = {r[0]: tuple(r[1:]) for r in rows.lasts}
    return Snapshot(
        version=rows.version,
        stored={r[0]: record_from_row(r) for r in rows.stored},
        windows=_windows(rows.windows),
        states={(r[0], r[1], r[2]): list(r[3:10]) for r in rows.counters},
        rates={(r[0], r[1], r[2]): (r[11], r[12]) for r in rows.counters if len(r) > _RATE},
        stamps={
            (r[0], r[1], r[2]): r[_STAMP]
            for r in rows.counters
            if len(r) > _STAMP and r[_STAMP] is not None
        },
        pots=pots_of(grant_rows, rows.draws, rows.grant_pairs),
        seen={(r[0], r[1], r[2], r[3]): r[4] for r in rows.seats},
        watched={r[2]: (r[8], r[4]) for r in grant_rows if r[8] is not None and not r[9]},
        schedules=[
            (schedule, lasts.get(schedule.schedule_id))
            for schedule in map(schedule_of_values, rows.schedules)
        ],
        breakers={(r[0], r[1]): breaker_of(r[2:8]) for r in rows.breakers},
        secret=rows.secret,
    )


_RATE: Final = 11  # a locked counter row's rate (after its tuple id; cached rows have none)
_STAMP: Final = 14  # and its seat window's stamp


@dataclass(slots=True)
class _Ahead:
    """A lookup `PostgresHotStore.looking_up` sent: its open pipeline and cursors."""

    stack: ExitStack
    ids: list[str]
    version: psycopg.Cursor[Any]
    stored: psycopg.Cursor[Any]


class PostgresHotStore:
    """`HotStore` on a psycopg connection in a transaction: one of
    `DirectPostgres`, or the one under a SQLAlchemy transaction
    (`PostgresHotStore.of`)."""

    # `write` keeps the dead letters too, in its round trip.
    takes_rejected = True
    keeps_stamps = True
    folds_one_seat = False

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw
        # Tuple ids of the rows `read` locked, for `write`'s bulk updates.
        self.counter_tids: dict[Key, str] = {}
        self.window_tids: dict[Pair, str] = {}
        self.breaker_tids: dict[Pair, str] = {}
        # The seat values of a known window start `read` found no row of, for
        # `write`'s inserts; `write` uses them once.
        self.absent_seats: set[SeatKey] = set()
        self._ahead: _Ahead | None = None  # `looking_up`'s, until `read` takes it
        self._sending: ExitStack | None = None  # `sending`'s pipeline, until `write` takes it

    @classmethod
    def of(cls, connection: Connection) -> PostgresHotStore:
        """On the psycopg connection under ``connection``'s transaction."""
        raw = connection.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        return cls(raw)

    def read(self, request: ReadRequest) -> Snapshot:
        return snapshot_of(self.read_locked(request))

    def read_locked(self, request: ReadRequest) -> ReadRows:
        """`read_rows`, remembering where the rows it locked are for `write`."""
        rows = self.read_rows(request)
        seats = request.seats
        self.window_tids = {(r[0], r[1]): r[4] for r in rows.windows}
        self.counter_tids = {(r[0], r[1], r[2]): r[10] for r in rows.counters}
        self.breaker_tids = {(r[0], r[1]): r[8] for r in rows.breakers}
        if len(seats) > FEW_ROWS:
            found = {(r[0], r[1], r[2], r[3]) for r in rows.seats}
            self.absent_seats = {
                (n, s, w, v) for n, s, w, v in seats if w is not None and (n, s, w, v) not in found
            }
        return rows

    @contextmanager
    def looking_up(self, ids: Sequence[str] | None) -> Iterator[None]:
        """Send the lookup of ``ids`` now (with the ``BEGIN`` and the limits'
        version) in a pipeline that `read`, if called inside, goes on with and
        syncs: the server looks the ids up while the caller plans. Its ``ids``
        must be these, or none. None: nothing is sent."""
        if not ids:
            yield
            return
        raw = self.raw
        begin = self.begins()
        with ExitStack() as stack:
            stack.enter_context(pipeline(raw))
            if begin:
                raw.execute("BEGIN")
            version = raw.cursor(binary=True).execute(VERSION)
            stored = raw.cursor(binary=True).execute(FETCH_RESULTS, {"ids": _encode(ids)})
            self._ahead = _Ahead(stack, list(ids), version, stored)
            try:
                yield
            finally:
                self._ahead = None

    @contextmanager
    def sending(self) -> Iterator[Callable[[Sequence[ResultRecord]], None] | None]:
        """Around deciding and `write`: yields a function that sends the
        results rows of events decided, in a pipeline that `write`, if called
        inside, goes on with and syncs, so that the server inserts them while
        the rest are decided. Anything but a driver error leaving the block
        after rows were sent rolls the transaction back (a decline writes
        nothing); a driver error (a key written meanwhile) is raised as
        SQLAlchemy's, once the pipeline is synced.

        They are inserted before the write's other rows, in chunks the
        caller sorts by id, as `write`'s: it sends them only when every counter of the batch
        has a row, locked, so that a transaction inserting one of their ids
        for the same charges waits for those locks before it does. One that
        reuses an id with other charges while it draws on the same grant, or
        two such batches with their ids in other orders, may wait in a
        cycle: PostgreSQL breaks it (a deadlock, run again)."""
        raw = self.raw
        begin = self.begins()
        sent = False

        def send(records: Sequence[ResultRecord]) -> None:
            nonlocal sent
            sent = True
            _insert_results(raw.cursor(), records)

        try:
            with ExitStack() as stack:
                stack.enter_context(pipeline(raw))
                if begin:
                    raw.execute("BEGIN")
                self._sending = stack
                try:
                    yield send
                finally:
                    self._sending = None
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        except BaseException:
            if sent and raw.info.transaction_status != TransactionStatus.IDLE:
                raw.rollback()
            raise

    def read_rows(self, request: ReadRequest) -> ReadRows:
        """What `read` finds, as the rows its statements return (each
        window and counter row with its tuple id last)."""
        ids, pairs, keys, seats = request.ids, request.pairs, request.keys, request.seats
        grant_pairs, grants_since_us = request.grant_pairs, request.grants_since_us
        due_pairs, breaker_pairs = request.due_pairs, request.breaker_pairs
        params = {"pairs": _encode(pairs), "keys": _encode(keys)}
        ahead, self._ahead = self._ahead, None
        if ahead is not None and list(ids or ()) != ahead.ids:
            raise ValueError("read asks for other ids than were sent ahead")
        begin = ahead is None and self.begins()
        try:
            # Sent ahead: the lookup's pipeline, closed (synced) here.
            with pipeline(self.raw) if ahead is None else ahead.stack:
                if begin:
                    self.raw.execute("BEGIN")
                schedules = last_issues = None
                if due_pairs:  # first of the locks: the general engine's order
                    due = {"due_pairs": _encode(due_pairs)}
                    schedules = self.raw.cursor(binary=True).execute(LOCK_SCHEDULES, due)
                    last_issues = self.raw.cursor(binary=True).execute(LAST_ISSUES, due)
                if ahead is not None:
                    version, stored = ahead.version, ahead.stored
                else:
                    version = self.raw.cursor(binary=True).execute(VERSION)
                    stored = None
                    if ids:
                        stored = self.raw.cursor(binary=True)
                        stored.execute(FETCH_RESULTS, {"ids": _encode(ids)})
                windows = None
                if pairs:
                    windows = self.raw.cursor(binary=True).execute(LOCK_WINDOWS, params)
                counters = self.raw.cursor(binary=True).execute(LOCK_COUNTERS, params)
                granted = None
                if grant_pairs:
                    asked = {"grant_pairs": _encode(grant_pairs), "since": grants_since_us}
                    granted = self.raw.cursor(binary=True).execute(READ_GRANTS, asked)
                valued = None
                if seats:
                    asked = {"seats": _encode(seats)}
                    valued = self.raw.cursor(binary=True).execute(READ_SEATS, asked)
                locked = secret = None
                if breaker_pairs:  # after the counters: the general engine's order
                    asked = {"breaker_pairs": _encode(breaker_pairs)}
                    locked = self.raw.cursor(binary=True).execute(LOCK_BREAKERS, asked)
                    named = {"secret": BREAKER_SECRET}
                    secret = self.raw.cursor(binary=True).execute(READ_SECRET, named)
            # After the sync: a fetch inside the pipeline would wait for its own reply.
            row = version.fetchone()
            assert row is not None
            window_rows = windows.fetchall() if windows else []
            counter_rows = counters.fetchall()
            stored_rows = stored.fetchall() if stored else []
            grant_rows = granted.fetchall() if granted else []
            draw_rows = [r[:3] + r[13:14] for r in counter_rows if r[13]] if grant_pairs else []
            value_rows = valued.fetchall() if valued else []
            schedule_rows = schedules.fetchall() if schedules else []
            last_rows = last_issues.fetchall() if last_issues else []
            breaker_rows = locked.fetchall() if locked else []
            secret_row = secret.fetchone() if secret else None
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        return ReadRows(
            row[0],
            window_rows,
            counter_rows,
            grant_rows,
            draw_rows,
            value_rows,
            stored_rows,
            schedule_rows,
            last_rows,
            breaker_rows,
            None if secret_row is None else str(secret_row[0]),
            grant_pairs,
        )

    def read_seats(self, seats: Sequence[WantedSeat]) -> Seen:
        """The live events of ``seats`` (each with its window start) that have
        a row, read in `read`'s transaction, under its locks; those of none
        are inserted by `write` as `read`'s (``absent_seats``)."""
        try:
            cursor = self.raw.cursor(binary=True)
            rows = cursor.execute(READ_SEATS, {"seats": _encode(seats)}).fetchall()
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        found: Seen = {(r[0], r[1], r[2], r[3]): r[4] for r in rows}
        self.absent_seats |= {
            (n, s, w, v) for n, s, w, v in seats if w is not None and (n, s, w, v) not in found
        }
        return found

    def read_held(self, keys: Sequence[Key]) -> dict[Key, set[str]]:
        """`READ_HELD`'s rows, by window."""
        try:
            cursor = self.raw.cursor(binary=True)
            rows = cursor.execute(READ_HELD, {"windows": _encode(keys)}).fetchall()
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        found: dict[Key, set[str]] = {}
        for name, subject, start, value in rows:
            found.setdefault((name, subject, start), set()).add(value)
        return found

    def begins(self) -> bool:
        """Whether the next pipeline opens the transaction with ``BEGIN``:
        on a connection in autocommit outside one (asked before the pipeline,
        whose statements leave the status unknown until its sync)."""
        raw = self.raw
        return raw.autocommit and raw.info.transaction_status == TransactionStatus.IDLE

    def send_expectations(self) -> None:
        """Statements `write` sends first, in its pipeline: none here
        (`metering.storage.hot.speculative` sends its checks)."""

    def commit(self) -> None:
        """End `write`'s transaction, in its pipeline: a ``COMMIT`` statement
        in autocommit (synced with the rest), else psycopg's (which syncs)."""
        if self.raw.autocommit:
            self.raw.execute("COMMIT")
        else:
            self.raw.commit()

    def lock_reservation(self, reservation_id: str) -> ReservationRecord | None:
        """One round trip: the row ``FOR UPDATE`` (a settle takes it before its counters)."""
        try:
            if self.begins():
                with pipeline(self.raw):
                    self.raw.execute("BEGIN")
                    row = self.raw.cursor(binary=True).execute(LOCK_RESERVATION, (reservation_id,))
            else:
                row = self.raw.cursor(binary=True).execute(LOCK_RESERVATION, (reservation_id,))
            found = row.fetchone()
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        return record_of_row(found) if found is not None else None

    def write(
        self,
        changes: Changes,
        now_us: int,
        *,
        commit: bool,
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        raw = self.raw
        sending, self._sending = self._sending, None
        begin = sending is None and self.begins()
        try:
            # Sent while deciding (`sending`): its pipeline, closed (synced) here.
            with pipeline(raw) if sending is None else sending:
                if begin:
                    raw.execute("BEGIN")
                self.send_expectations()
                cursor = raw.cursor()
                drawn = drawn_by_window(changes.draws) if changes.draws else {}
                if changes.updated and (len(changes.updated) <= FEW_ROWS or not self.counter_tids):
                    rows: list[Any] = [
                        counter_update(k, st, now_us, drawn.get(k, 0)) for k, st in changes.updated
                    ]
                    _execute(cursor, SQL.update_counter, rows)
                elif changes.updated:
                    tids = self.counter_tids
                    rows = [(tids[k], *state, drawn.get(k, 0)) for k, state in changes.updated]
                    raw.execute(UPDATE_COUNTERS, {"rows": _encode(rows), "now": now_us})
                if 0 < len(changes.created) <= FEW_ROWS:
                    rows = [
                        counter_insert(k, end, st, now_us, m, drawn.get(k, 0))
                        for k, end, st, m in changes.created
                    ]
                    _execute(cursor, SQL.insert_counter, rows)
                elif changes.created:
                    rows = [
                        (*key, end, *state, created_rate(state[0]), month, drawn.get(key, 0))
                        for key, end, state, month in changes.created
                    ]
                    raw.execute(INSERT_COUNTERS, {"rows": _encode(rows), "now": now_us})
                if changes.new_windows:
                    rows = [(*pair, *window) for pair, window in changes.new_windows]
                    raw.execute(INSERT_WINDOWS, {"rows": _encode(rows)})
                if changes.moved_windows and self.window_tids:
                    rows = [
                        (self.window_tids[pair], *window) for pair, window in changes.moved_windows
                    ]
                    raw.execute(UPDATE_WINDOWS, {"rows": _encode(rows)})
                elif changes.moved_windows:  # no read before (speculative): by key
                    rows = [(*window, *pair) for pair, window in changes.moved_windows]
                    _execute(cursor, UPDATE_WINDOW, rows)
                if changes.issues:  # before the draws: they may draw on them
                    _issue(raw, changes.issues, now_us)
                if changes.draws:
                    expected = changes.expected
                    rows = [(g, delta, expected.get(g)) for g, delta in grant_deltas(changes.draws)]
                    raw.execute(UPDATE_GRANTS, {"rows": _encode(rows)})
                _insert_results(cursor, changes.results)
                if changes.holds:
                    cursor.executemany(SQL.insert_hold, changes.holds)
                if changes.settled:
                    _execute(cursor, SQL.settle_reservation, changes.settled)
                absent, self.absent_seats = self.absent_seats, set()
                if changes.seats:
                    rows = seat_rows(changes.seats)
                    if len(rows) <= FEW_ROWS:
                        _execute(cursor, SQL.add_seat, rows)
                    else:
                        _add_seats(raw, rows, absent)
                if changes.rejected:
                    rows = rejected_rows(changes.rejected, now_us)
                    raw.execute(INSERT_REJECTED, {"rows": _encode(rows)})
                if changes.secret is not None:
                    made = {"name": BREAKER_SECRET, "value": changes.secret, "now": now_us}
                    raw.execute(INSERT_SECRET, made)
                if changes.breakers:
                    changed, held = changes.breakers, self.breaker_tids
                    if len(changed) > FEW_ROWS and all(pair in held for pair in changed):
                        raw.execute(UPDATE_BREAKERS, pg_breaker_updates(changed, held))
                    else:  # new ones, or not read before (speculative)
                        raw.execute(UPSERT_BREAKERS, pg_breaker_params(changed))
                low = None
                if changes.low:  # their messages follow the pipeline
                    low = raw.cursor(binary=True).execute(MARK_LOW, pg_low_params(changes.low))
                if changes.notices:
                    raw.execute(RECORD_NOTICES, pg_notice_params(changes.notices, now_us))
                if changes.rollups:  # appended: no row lock (see rollups)
                    raw.execute(PG_APPEND, {"rows": _encode(appended_rows(changes.rollups))})
                if commit and low is None:
                    self.commit()
                if meanwhile is not None:  # while the server writes (all is sent)
                    meanwhile()
            if low is not None:  # a grant's first ``grant.low``: one round trip more
                messages = low_documents(low.fetchall(), now_us)
                if messages:
                    raw.execute(INSERT_MESSAGES, pg_message_params(messages, now_us))
                if commit:
                    self.commit()
        except psycopg.errors.CheckViolation as exc:
            if exc.diag.constraint_name == "ck_grants_used":
                # A draw counted on a balance another transaction spent: decide again.
                raise RetryTransaction("a grant was drawn on concurrently") from exc
            raise _translate(exc) from exc
        except psycopg.Error as exc:  # a key written meanwhile (23505) is retried
            raise _translate(exc) from exc


def _add_seats(
    raw: psycopg.Connection[Any], rows: list[tuple[str, str, int, str, int]], absent: set[SeatKey]
) -> None:
    """Seat rows (`seat_rows`): those of ``absent`` values inserted, the rest upserted."""
    new: list[Any] = []
    seen: list[Any] = []
    for row in rows:
        subject, name, start, value, added = row
        (new if added > 0 and (name, subject, start, value) in absent else seen).append(row)
    if new:
        raw.execute(INSERT_SEATS, {"rows": _encode(new)})
    if seen:
        raw.execute(ADD_SEATS, {"rows": _encode(seen)})


def _issue(
    raw: psycopg.Connection[Any], issued: list[tuple[ScheduleRecord, list[Issue]]], now_us: int
) -> None:
    """Insert recurring grants' issues and move their schedules on."""
    rows: list[Any] = [
        [issue_row(schedule, issue, now_us)[column] for column in ISSUE_COLUMNS]
        for schedule, issues in issued
        for issue in issues
    ]
    raw.execute(INSERT_ISSUES, {"rows": _encode(rows)})
    rows = [
        (s.schedule_id, s.last_issue, made[-1].number, next_due_us(made[-1], s.until_us))
        for s, made in issued
    ]
    raw.execute(MOVE_SCHEDULES, {"rows": _encode(rows)})


@contextmanager
def pipeline(raw: psycopg.Connection[Any]) -> Iterator[None]:
    """``raw.pipeline()``, with an error its block meets raised once, after the
    pipeline ends: psycopg would log a warning for the next it meets ending
    it (the statements after the error, aborted), each failed speculation
    (`metering.storage.hot.speculative`) a line of noise."""
    failed: psycopg.Error | None = None
    try:
        with raw.pipeline():
            try:
                yield
            except psycopg.Error as exc:
                failed = exc
    except psycopg.Error:
        if failed is None:
            raise
    if failed is not None:
        raise failed


def _insert_results(cursor: psycopg.Cursor[Any], records: Sequence[ResultRecord]) -> None:
    """``records``' rows, in their order (sorted by id): a few one statement
    each, more as one ``jsonb`` array."""
    rows = [result_row(r) for r in records]
    if 0 < len(rows) <= FEW_ROWS:
        _execute(cursor, SQL.insert_result, rows)
    elif rows:
        cursor.execute(INSERT_RESULTS, {"rows": _encode(rows)})


def _execute(cursor: psycopg.Cursor[Any], statement: str, rows: list[Any]) -> None:
    """A few rows, one statement each; one row (`consume`) by `execute`, which
    costs the client less than `executemany`'s pipeline of one."""
    if len(rows) == 1:
        cursor.execute(statement, rows[0])
    else:
        cursor.executemany(statement, rows)


def _windows(rows: Sequence[Sequence[Any]]) -> dict[Pair, Window | None]:
    return {(r[0], r[1]): (r[2], r[3]) if r[2] is not None else None for r in rows}


def _translate(exc: psycopg.Error) -> StatementError:
    """A psycopg error as SQLAlchemy would raise it, for `run_transaction` to judge."""
    broken = isinstance(exc, psycopg.OperationalError) or exc.sqlstate is None
    return DBAPIError.instance(None, None, exc, psycopg.Error, connection_invalidated=broken)


# `POST /v1/check` and `Meter.check`: the same state `PostgresHotStore.read`
# locks, read in one statement without a lock or a transaction (a statement
# sees one snapshot): the limits' version, the first-use windows of
# ``pairs``, the counters of ``keys`` and of those windows, the grants of
# ``grant_pairs`` with what their windows drew, and the live events of
# ``seats`` (`READ_SEATS`). Rows are tagged: 0 the version, 1 a window
# (start, end), 2 a counter, 3 a grant, 4 a window's draws, 5 a seat value
# (its live events; the value in the last column).
CHECK_READ: Final = f"""
WITH p AS MATERIALIZED {_PAIRS},
w AS MATERIALIZED (
    SELECT w.limit_name, w.subject, w.window_start_us, w.window_end_us
    FROM p CROSS JOIN LATERAL (
        SELECT * FROM current_windows AS w WHERE w.limit_name = p.l AND w.subject = p.s
    ) AS w
),
k AS (
    SELECT r->>0 AS l, r->>1 AS s, (r->>2)::bigint AS ws
    FROM jsonb_array_elements(%(keys)s::jsonb) AS r
    UNION ALL
    SELECT limit_name, subject, window_start_us FROM w WHERE window_start_us IS NOT NULL
),
gp AS MATERIALIZED (
    SELECT r->>0 AS l, r->>1 AS s FROM jsonb_array_elements(%(grant_pairs)s::jsonb) AS r
)
SELECT 0::int, NULL::text, NULL::text, version, NULL::bigint, NULL::bigint, NULL::bigint,
       NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::float8,
       NULL::float8
FROM limits_version WHERE id = 1
UNION ALL
SELECT 1, limit_name, subject, window_start_us, window_end_us, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL
FROM w
UNION ALL
SELECT 2, c.limit_name, c.subject, c.window_start_us, c.used, c.denied_count, c.denied_cost,
       c.first_denied_at_us, c.tat_us, c.tat_rem, c.tat_scale, NULL, NULL, NULL
FROM k CROSS JOIN LATERAL (
    SELECT * FROM counters AS c
    WHERE c.limit_name = k.l AND c.subject = k.s AND c.window_start_us = k.ws
) AS c
UNION ALL
SELECT 3, g.limit_name, g.subject, g.amount, g.used, g.effective_from_us, g.expires_at_us,
       g.priority, NULL, NULL, NULL, g.grant_id, NULL, NULL
FROM gp CROSS JOIN LATERAL (
    SELECT * FROM grants AS g
    WHERE g.limit_name = gp.l AND g.subject = gp.s AND g.used < g.amount
      AND (g.expires_at_us IS NULL OR g.expires_at_us > %(since)s)
) AS g
UNION ALL
SELECT 4, c.limit_name, c.subject, c.window_start_us, c.granted, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL
FROM gp CROSS JOIN LATERAL (
    SELECT * FROM counters AS c
    WHERE c.subject = gp.s AND c.limit_name = gp.l AND c.granted <> 0
) AS c
UNION ALL
SELECT 5, d.limit_name, d.subject, d.window_start_us, d.live_events, NULL, NULL, NULL, NULL,
       NULL, NULL, d.value, NULL, NULL
FROM ({READ_SEATS}) AS d
UNION ALL
SELECT 6, b.limit_name, b.subject, b.rate_at_us, b.since_us, b.over_since_us, b.quarantined_at_us,
       NULL, NULL, NULL, NULL, NULL, b.short_rate, b.long_rate
FROM jsonb_array_elements(%(breaker_pairs)s::jsonb) AS r
CROSS JOIN LATERAL (
    SELECT * FROM breakers AS b WHERE b.limit_name = r->>0 AND b.subject = r->>1
) AS b
"""


def read_unlocked(raw: psycopg.Connection[Any], request: ReadRequest) -> Snapshot:
    """`PostgresHotStore.read` for a decision that writes nothing (`check`):
    one statement on ``raw`` in autocommit (`DirectPostgres.autocommit`), no
    lock, no transaction to end. Results are not looked up (``ids`` is not
    read, ``stored`` is empty), nor recurring grants' schedules (``due_pairs``),
    nor the breaker links' secret. Driver errors come out as SQLAlchemy's, for
    `metering.storage.connections.translate`."""
    grant_pairs = request.grant_pairs
    params = {
        "pairs": _encode(request.pairs),
        "keys": _encode(request.keys),
        "seats": _encode(request.seats),
        "grant_pairs": _encode(grant_pairs),
        "breaker_pairs": _encode(request.breaker_pairs),
        "since": request.grants_since_us,
    }
    try:
        rows = raw.cursor(binary=True).execute(CHECK_READ, params).fetchall()
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    version = -1
    windows: dict[Pair, Window | None] = {}
    states: dict[Key, list[Any]] = {}
    seen: Seen = {}
    grant_rows: list[tuple[Any, ...]] = []
    draw_rows: list[tuple[Any, ...]] = []
    breakers: dict[Pair, Breaker] = {}
    for row in rows:
        kind = row[0]
        if kind == 0:
            version = row[3]
        elif kind == 1:
            windows[(row[1], row[2])] = (row[3], row[4]) if row[3] is not None else None
        elif kind == 2:
            states[(row[1], row[2], row[3])] = list(row[4:11])
        elif kind == 3:
            grant_rows.append((row[1], row[2], row[11], *row[3:8]))
        elif kind == 4:
            draw_rows.append(row[1:5])
        elif kind == 5:
            seen[(row[1], row[2], row[3], row[11])] = row[4]
        else:
            breakers[(row[1], row[2])] = Breaker(row[12], row[13], *row[3:7])
    pots = pots_of(grant_rows, draw_rows, grant_pairs) if grant_pairs else {}
    return Snapshot(
        version=version,
        stored={},
        windows=windows,
        states=states,
        pots=pots,
        seen=seen,
        breakers=breakers,
    )
