"""The ways of deciding, each declaring the needs it implements.

`Engine` holds them in order and gives a batch to the first whose
``implements`` covers the batch's needs (`metering.domain.needs`); a path
that finds another need while deciding returns `Declined`, before writing
anything, and the next path that implements it decides. In order:

* `OneTrip` (PostgreSQL): one plain event in one round trip;
* `Direct`: the fast path on the engine's own connections;
* `OnConnection`: the fast path in a SQLAlchemy transaction;
* `Reference`: the reference engine, the oracle; it implements every need,
  and what it decides is counted (``metering_reference_events_total``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import partial
from typing import Protocol

from sqlalchemy import Connection
from sqlalchemy.exc import StatementError

from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.events import Rejected, UsageEvent
from metering.domain.instants import from_us
from metering.domain.kinds import refuse
from metering.domain.needs import EVERY, Need
from metering.domain.reservations import held_charge
from metering.domain.rules import EventOutcome
from metering.engine.answers import (
    CONFLICT,
    DUPLICATE,
    NEW,
    Answer,
    AnswerKind,
    Batch,
    Declined,
    NotHeld,
)
from metering.engine.fast import FAST_IMPLEMENTS, apply_records, check_record, refused_event
from metering.engine.limit_cache import LimitCache
from metering.engine.money import Money
from metering.engine.one_trip import ONE_TRIP_IMPLEMENTS, STATS, learn_held, prepare
from metering.engine.reference import (
    Allowed,
    WindowResolver,
    apply_events,
    decide_with_states,
    first_use_pairs,
    record_of,
    validate_against_limits,
)
from metering.engine.seats import Seats, seat_keys
from metering.errors import EventConflict, StorageError
from metering.storage.connections import RetryTransaction
from metering.storage.database import Database
from metering.storage.hot import HotStore
from metering.storage.hot.direct_postgres import DirectPostgres
from metering.storage.hot.one_trip import FunctionDeclined, apply_one
from metering.storage.hot.postgres import PostgresHotStore, read_unlocked
from metering.storage.hot.speculative import LearningStore, RowCache, SpeculativeStore
from metering.storage.hot.sqlite import DirectSqlite, sqlite_read_unlocked
from metering.storage.recurring import issue_due
from metering.storage.reservations import ReservationStore
from metering.storage.store import Store
from metering.telemetry.metrics import count_reference


class Path(Protocol):
    name: str
    implements: frozenset[Need]

    def apply(self, batch: Batch) -> list[Answer] | Declined: ...

    def check(self, event: UsageEvent, now_us: int) -> Decision | Declined: ...


_NO_CHECK = Declined("this path does not check")

# The function's declines (`metering.storage.hot.one_trip`), as needs.
_FUNCTION_NEEDS = {
    "exists": Need.REPEATED_ID,
    "old": Need.EARLY_FIRST_USE,
    "notify": Need.NOTICES,
    "zone": Need.TIME_ZONE,
}


class OneTrip:
    """A single plain event decided by ``metering_consume_one`` in one round
    trip (PostgreSQL), its subject's entitlements included."""

    name = "one_trip"
    implements = ONE_TRIP_IMPLEMENTS

    def __init__(self, direct: DirectPostgres, cache: LimitCache) -> None:
        self.direct = direct
        self.cache = cache

    def apply(self, batch: Batch) -> list[Answer] | Declined:
        [record] = batch.records
        parameters = prepare(self.cache, record, batch.now_us)
        if isinstance(parameters, Declined):
            STATS["unsuited"] += 1
            return parameters
        try:
            with self.direct.autocommit() as raw:
                found = apply_one(raw, parameters, record.metadata)
        except StorageError:
            return Declined("no connection")  # the next path raises what it finds
        if not isinstance(found, FunctionDeclined):
            STATS["applied"] += 1
            result, held = found
            if held:
                learn_held(self.cache, record, result, held)
            return [Answer(NEW, result)]
        code = found.code
        STATS[f"declined:{code}"] += 1
        if code == "stale":
            return Declined("the limits changed since they were cached", stale=True)
        return Declined(f"the function declined: {code}", _FUNCTION_NEEDS.get(code))

    def check(self, event: UsageEvent, now_us: int) -> Decision | Declined:
        return _NO_CHECK


class Direct:
    """The fast path on the engine's own connections: stdlib sqlite3 on a
    SQLite file (dead letters go through SQLAlchemy), psycopg on PostgreSQL.
    It also checks, reading without a lock: in one statement in autocommit
    on PostgreSQL, in a read transaction on SQLite. Notices, forecasts and
    breakers are read and written by the store, with the rest."""

    name = "direct"

    def __init__(self, direct: DirectSqlite | DirectPostgres, cache: LimitCache) -> None:
        self.direct = direct
        self.cache = cache
        implements = FAST_IMPLEMENTS
        if isinstance(direct, DirectSqlite):
            implements -= {Need.DEAD_LETTERS}
        self.implements = implements
        # PostgreSQL: the rows last read and written, for a single event's
        # speculative round trip (`metering.storage.hot.speculative`).
        self.rows = RowCache() if isinstance(direct, DirectPostgres) else None

    def apply(self, batch: Batch) -> list[Answer] | Declined:
        cache, rows = self.cache, self.rows
        if rows is None or not _speculates(batch, cache):
            return self.direct.run(
                lambda store, retry: apply_records(None, cache, batch, retry=retry, store=store)
            )

        def work(store: HotStore, retry: bool) -> list[Answer] | Declined:
            assert isinstance(store, PostgresHotStore) and rows is not None
            if not retry and rows.worth_trying():
                speculative = SpeculativeStore(store.raw, rows, cache.current[0])
                found = self._speculate(speculative, batch)
                if found is not None:
                    return found
                retry = speculative.failed  # a repeated id, maybe: looked up now
            learning = LearningStore(store.raw, rows)
            return apply_records(None, cache, batch, retry=retry, store=learning)

        return self.direct.run(work)

    def _speculate(
        self, speculative: SpeculativeStore, batch: Batch
    ) -> list[Answer] | Declined | None:
        """``batch`` decided on cached rows and written in one round trip
        (`metering.storage.hot.speculative`); None when it was not: nothing
        is written, the transaction is rolled back and its keys forgotten.
        When its rows were not all cached, the store read them: what it
        decided on them is the answer (planned once), an error the run's."""
        try:
            found = apply_records(None, self.cache, batch, store=speculative)
        except (StatementError, RetryTransaction):
            if speculative.missed:
                raise
            speculative.abandon()
            return None
        if speculative.missed:
            return found
        if isinstance(found, Declined):  # perhaps on stale rows: decided again with a read
            speculative.forget()
            return None
        speculative.succeeded()
        return found

    def check(self, event: UsageEvent, now_us: int) -> Decision | Declined:
        direct, cache, record = self.direct, self.cache, event.record()
        try:
            if isinstance(direct, DirectPostgres):
                with direct.autocommit() as raw:
                    found = check_record(partial(read_unlocked, raw), cache, record, now_us)
            else:
                with direct.reading() as raw_sqlite:
                    read = partial(sqlite_read_unlocked, raw_sqlite)
                    found = check_record(read, cache, record, now_us)
        except StorageError:
            return Declined("no connection")  # the reference engine retries, or raises
        return _checked(event, found, now_us)


_READ_NEEDS = frozenset({Need.BREAKER, Need.FORECAST})


def _speculates(batch: Batch, cache: LimitCache) -> bool:
    """Whether ``batch`` is one event that may be decided on cached rows (a
    breaker's rows are never cached, nor the rates a forecast needs: read)."""
    if not (
        len(batch.records) == 1
        and batch.hold is None
        and batch.policy is None
        and not batch.lookup_first
    ):
        return False
    rules = cache.current[1]
    for _, name, _ in batch.records[0].charges:
        rule = rules.get(name)
        if rule is not None and rule.needs and rule.needs & _READ_NEEDS:
            return False
    return True


class OnConnection:
    """The fast path in a SQLAlchemy transaction (in-memory SQLite, or what
    the direct connections leave: dead letters on SQLite); its check reads
    on a SQLAlchemy connection with the direct path's statements."""

    name = "connection"
    implements = FAST_IMPLEMENTS

    def __init__(self, database: Database, cache: LimitCache) -> None:
        self.database = database
        self.cache = cache

    def apply(self, batch: Batch) -> list[Answer] | Declined:
        cache = self.cache

        def work(connection: Connection, retry: bool) -> list[Answer] | Declined:
            return apply_records(connection, cache, batch, retry=retry)

        return self.database.run_retry_aware(work)

    def check(self, event: UsageEvent, now_us: int) -> Decision | Declined:
        cache, record = self.cache, event.record()
        try:
            with self.database.reading() as connection, connection.begin():
                raw = connection.connection.driver_connection  # in one snapshot
                if isinstance(raw, sqlite3.Connection):
                    read = partial(sqlite_read_unlocked, raw)
                else:
                    assert raw is not None  # psycopg's, on PostgreSQL
                    read = partial(read_unlocked, raw)
                found = check_record(read, cache, record, now_us)
        except StorageError:
            return Declined("no connection")  # the reference engine retries, or raises
        return _checked(event, found, now_us)


def _checked(event: UsageEvent, found: EventOutcome | Declined, now_us: int) -> Decision | Declined:
    """The fast check's outcome of ``event`` as the `Decision` `Meter.check` returns."""
    if isinstance(found, Declined):
        return found
    return Decision(
        event_id=None,
        outcome=found.outcome,  # type: ignore[arg-type]
        charges=tuple(ChargeDecision.from_row(row) for row in found.rows),
        occurred_at=event.occurred_at,
        decided_at=from_us(now_us),
        denied_by=found.denied_by,
        metadata=event.metadata,
    )


class Reference:
    """The reference engine (`metering.engine.reference`): the oracle the
    differential tests compare every path with; here it decides what the
    others decline. A reservation's row is kept as the fast path keeps it."""

    name = "reference"
    implements = EVERY

    def __init__(self, database: Database) -> None:
        self.database = database

    def apply(self, batch: Batch) -> list[Answer] | Declined:
        events = [UsageEvent(*r[:2], from_us(r.occurred_at_us), r.metadata) for r in batch.records]
        if batch.hold is not None:
            [event] = events
            answer = self.database.run_retry_aware(partial(self._reserve, batch, event))
            count_reference("apply", 1)
            return [answer]
        decided = self.database.run_retry_aware(partial(self._apply, batch, events))
        count_reference("apply", len(events))
        answers: list[Answer] = []
        for event, applied in zip(events, decided, strict=True):
            if isinstance(applied, EventConflict):
                answers.append(Answer(CONFLICT, None))
            else:
                kind: AnswerKind = DUPLICATE if applied.duplicate else NEW
                answers.append(Answer(kind, record_of(event, applied)))
        return answers

    @staticmethod
    def _apply(
        batch: Batch, events: Sequence[UsageEvent], connection: Connection, retry: bool
    ) -> list[Decision | EventConflict]:
        store = Store(connection)
        precheck = retry or batch.lookup_first or len(events) > 1
        applied = apply_events(
            store,
            events,
            batch.now_us,
            invalid=batch.invalid,
            precheck=precheck,
            policy=batch.policy,
        )
        conflicts = [
            Rejected(event.event_id, str(outcome), event.fingerprint())
            for event, outcome in zip(events, applied, strict=True)
            if isinstance(outcome, EventConflict) and batch.invalid == "reject"
        ]
        refused = [
            refused_event(event, outcome.reason or "")
            for event, outcome in zip(events, applied, strict=True)
            if isinstance(outcome, Decision)
            and outcome.outcome == "rejected"
            and not outcome.duplicate
        ]
        store.record_rejected_messages([*batch.rejected, *conflicts, *refused], batch.now_us)
        return applied

    @staticmethod
    def _reserve(batch: Batch, event: UsageEvent, connection: Connection, retry: bool) -> Answer:
        """One event decided and, when allowed, held (``batch.hold``); a seat
        limit is refused (a seat is taken by consuming, never held), so is a
        gauge (a level is no cost to hold), and a lease's denied block raises
        `NotHeld`, rolling back."""
        assert batch.hold is not None
        store = Store(connection)
        limits = store.load_limits(c.limit for c in event.charges)
        for _, limit in sorted(limits.items()):
            refuse(limit, "hold")
        precheck = retry or batch.lookup_first
        [applied] = apply_events(store, [event], batch.now_us, invalid="raise", precheck=precheck)
        if isinstance(applied, EventConflict):
            return Answer(CONFLICT, None)
        if applied.duplicate:
            return Answer(DUPLICATE, record_of(event, applied))
        if not applied.allowed:
            if batch.hold.block:
                raise NotHeld(event.event_id)
            return Answer(NEW, record_of(event, applied))
        now_us = batch.now_us
        held = [held_charge(c) for c in applied.charges]
        ReservationStore(connection).insert(
            event.event_id, held, now_us, batch.hold.expires_at_us(now_us)
        )
        return Answer(NEW, record_of(event, applied))

    def check(self, event: UsageEvent, now_us: int) -> Decision | Declined:
        decision = self.database.run(partial(_check_reference, event, now_us))
        count_reference("check", 1)
        return decision


def _check_reference(original: UsageEvent, now_us: int, connection: Connection) -> Decision:
    """`check` by the reference engine, in one transaction; records nothing
    but a recurring grant's issue due (reading a window makes it)."""
    event = original
    store = Store(connection)
    limits = store.load_limits(c.limit for c in event.charges)
    money = Money.read(store, [event], limits)
    error = validate_against_limits(event, limits, now_us, money)
    if error is not None:
        raise error
    if money is not None:
        event = money.expand(original)
        limits = money.limits
    # Reading a window makes a recurring grant's due issues (of its spend limits too).
    issue_due(connection, {(c.limit, c.subject) for c in event.charges}, now_us)
    pairs = first_use_pairs([event], limits)
    resolver = WindowResolver(store, dict(store.read_current_windows(pairs)))
    keys = [resolver.key(limits[c.limit], c.subject, event.occurred_at_us) for c in event.charges]
    states = store.read_counters(keys)
    allowed = Allowed.read(store, [event], [keys], lock=False, money=money, limits=limits)
    seats = seat_keys(event, keys, limits)
    costs = Seats.read(store, [event], [keys], limits).costs(seats) if any(seats) else None
    return decide_with_states(
        event, keys, limits, states, now_us, allowed, record=False, costs=costs
    )
