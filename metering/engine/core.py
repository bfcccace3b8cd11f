"""`Engine`: the one place that chooses how an event is applied or checked.

Two engines decide, with one vocabulary (`metering.domain.rules` for the
lean rules, `metering.domain.decisions` for the reference):

* the fast path (`metering.engine.fast`): one read and one write per
  transaction through a `HotStore`, the lean rules in between. It serves
  `consume`, `aconsume`, batches, and `check` on PostgreSQL;
* the reference engine (`metering.engine.reference`): what is rare (an event
  older than its subject's current first-use window), reservations, and
  `check` on SQLite or where the fast path declines.

The fast path runs on connections of its own, with no SQLAlchemy object:
on SQLite stdlib ``sqlite3`` ones (`metering.storage.hot.sqlite.DirectSqlite`),
one ``BEGIN IMMEDIATE`` transaction per call or group; on PostgreSQL psycopg
ones (`metering.storage.hot.direct_postgres.DirectPostgres`), and `check`'s one
statement in autocommit on one of them. Reservations are held
(`Engine.reserve`) and settled (`Engine.settle`) on the same connections.
What it leaves (`NeedsConnection`:
the limits' cache reloaded, notification marks; on SQLite also dead
letters) runs again, whole, in a SQLAlchemy transaction.

Concurrent single calls share transactions (`metering.engine.group`). The
differential suite (``tests/engine/test_differential.py``) holds every path
to the reference engine: the same results, counters, notifications and
checks. What every committed transaction decided is counted here
(`metering.metrics`), so callers count nothing.
"""

from __future__ import annotations

from collections import Counter as CountOf
from collections.abc import Callable, Container, Iterable, Sequence
from functools import partial
from typing import TypeVar

from sqlalchemy import Connection

from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.events import EventRecord, Rejected, UsageEvent
from metering.domain.imports import ImportPolicy
from metering.domain.instants import from_us
from metering.engine.fast import (
    CONFLICT,
    DUPLICATE,
    NEW,
    Answer,
    Hold,
    LimitCache,
    Unacceptable,
    UseGeneralPath,
    apply_records,
    check_record,
    refused_event,
)
from metering.engine.group import GroupCommit
from metering.engine.money import Money
from metering.engine.one_trip import STATS, prepare
from metering.engine.reference import (
    Allowed,
    Decided,
    InvalidPolicy,
    WindowResolver,
    apply_events,
    decide_with_states,
    first_use_pairs,
    record_of,
    validate_against_limits,
)
from metering.engine.seats import Seats, seat_keys
from metering.errors import EventConflict, StorageError
from metering.metrics import UNKNOWN_LIMIT, count_events, count_reference
from metering.storage.database import Database
from metering.storage.hot import HotStore, NeedsConnection
from metering.storage.hot.direct_postgres import DirectPostgres
from metering.storage.hot.one_trip import Declined, apply_one
from metering.storage.hot.postgres import read_unlocked
from metering.storage.hot.sqlite import DirectSqlite
from metering.storage.recurring import issue_due
from metering.storage.store import Store

T = TypeVar("T")

# The fast path's transaction: on a SQLAlchemy connection, or on a store of its own.
_Work = Callable[[Connection | None, bool, HotStore | None], list[Answer]]


class Engine:
    """Applies and checks events on one database; a `Meter` holds one.

    ``group_commit``: single calls from several threads (`submit`) share
    transactions; without it each gets its own.
    """

    def __init__(self, database: Database, *, group_commit: bool = True) -> None:
        self.database = database
        self.limits = LimitCache()
        self.group_commit = group_commit
        self._group = GroupCommit(self._apply_raising)
        # The fast path's own connections: stdlib sqlite3 on a SQLite file,
        # psycopg on PostgreSQL (else None: SQLAlchemy's, e.g. in-memory SQLite).
        self.direct: DirectSqlite | DirectPostgres | None = DirectSqlite.for_engine(
            database.engine
        ) or DirectPostgres.for_engine(database.engine)
        # PostgreSQL: a single event in one round trip (`metering.engine.one_trip`).
        self.one_trip = isinstance(self.direct, DirectPostgres)

    def close(self) -> None:
        self._group.close()
        if self.direct is not None:
            self.direct.close()

    def unknown_limits(self, names: Iterable[str]) -> list[str]:
        """The names among ``names`` that no limit has, in order, from the
        cached limits; a name missing from them reloads them first when the
        limits changed since (a limit defined a moment ago, in any process,
        is known; a flood of typos costs one read of the version each)."""
        rules = self.limits.current[1]
        missing = [name for name in dict.fromkeys(names) if name not in rules]
        if not missing:
            return missing
        if self.database.run(_limits_version) != self.limits.current[0]:
            self.database.run(self.limits.refresh)
        # The cache as it is now: another request may have reloaded it after
        # ``rules`` was read, so the version read above equals its own.
        rules = self.limits.current[1]
        return [name for name in missing if name not in rules]

    # -- applying ----------------------------------------------------------------

    def submit(self, record: EventRecord) -> Answer:
        """Apply one event (group commit when on); an unacceptable one raises its error."""
        if self.group_commit:
            return self._group.submit(record)
        [answer] = self.apply([record], invalid="raise")
        return answer

    async def submit_async(self, record: EventRecord) -> Answer:
        """`submit` for asyncio: always shares transactions, holds no thread."""
        return await self._group.submit_async(record)

    def apply(
        self,
        records: Sequence[EventRecord],
        *,
        invalid: InvalidPolicy = "reject",
        rejected: Sequence[Rejected] = (),
        policy: ImportPolicy | None = None,
    ) -> list[Answer]:
        """Apply a batch in one transaction, in order (see `Meter.apply_records`);
        ``policy``: an import's flags (`metering.imports`)."""
        try:
            return self._apply(records, invalid, rejected, policy=policy)
        except Unacceptable as exc:
            raise exc.error from None

    def reserve(self, record: EventRecord, hold: Hold) -> Answer:
        """Apply one event and, when it is allowed, keep its reservation row
        in the same transaction (`metering.reservations.transactions`). Raises the event's
        error, `NotHeld` (a lease's denied block: nothing recorded) and
        `UseGeneralPath` (the caller runs the reference engine)."""
        try:
            [answer] = self._apply([record], "raise", (), hold)
        except Unacceptable as exc:
            raise exc.error from None
        return answer

    def _apply_raising(self, records: Sequence[EventRecord]) -> list[Answer]:
        """A group's batch: an unacceptable event raises `Unacceptable`, naming it."""
        return self._apply(records, "raise", ())

    def _apply(
        self,
        records: Sequence[EventRecord],
        invalid: InvalidPolicy,
        rejected: Sequence[Rejected],
        hold: Hold | None = None,
        *,
        policy: ImportPolicy | None = None,
    ) -> list[Answer]:
        now_us = self.database.now_us()
        # One event (consume) skips the id lookup: a repeated id fails the
        # results insert and the retry looks it up.
        single = len(records) == 1

        def work(
            connection: Connection | None, retry: bool, store: HotStore | None = None
        ) -> list[Answer]:
            return apply_records(
                connection,
                self.limits,
                records,
                now_us,
                invalid=invalid,
                precheck=retry or not single or repeat,
                rejected=rejected,
                store=store,
                hold=hold,
                policy=policy,
            )

        repeat = False  # the one-trip function found the id decided: look it up first
        # Not a reservation: the function writes no reservation row.
        if single and self.one_trip and not rejected and hold is None and policy is None:
            found = self._apply_one_trip(records[0], now_us)
            if isinstance(found, tuple):
                _count(records, [found], self.limits.current[1], invalid, 0)
                return [found]
            repeat = found == "exists"
        try:
            answers = self._run_direct(work)
            if answers is None:
                answers = self.database.run_retry_aware(work)
        except UseGeneralPath:
            if hold is not None:
                raise
            answers = self._apply_reference(records, now_us, invalid, rejected, policy)
        if hold is not None:
            return answers  # reservations are not counted (as on the reference engine)
        _count(records, answers, self.limits.current[1], invalid, len(rejected))
        return answers

    def settle(self, direct: Callable[[HotStore], T], general: Callable[[], T]) -> T:
        """A reservation's settle (`metering.reservations.transactions`): ``direct`` in one
        transaction on the fast path's own connections; where there are none,
        or ``direct`` raises `NeedsConnection` (before it wrote anything:
        grants, rollups, the limits' cache stale), ``general`` runs the whole
        settle again under SQLAlchemy."""
        if self.direct is not None:
            try:
                return self._on_direct(lambda store, retry: direct(store))
            except NeedsConnection as exc:
                if exc.args and exc.args[0] == "limits":
                    self.database.run(self.limits.refresh)
        return general()

    def _on_direct(self, work: Callable[[HotStore, bool], T]) -> T:
        """``work(store, retry)`` in a transaction on the fast path's own connections."""
        assert self.direct is not None
        return self.direct.run(work)

    def _apply_one_trip(self, record: EventRecord, now_us: int) -> Answer | str:
        """``record`` decided by ``metering_consume_one`` in one round trip, or
        why not (then the usual path decides; nothing was written)."""
        code = "stale"
        for attempt in range(2):
            parameters = prepare(self.limits, record, now_us)
            if parameters is None:
                STATS["unsuited"] += 1
                return "unsuited"
            assert isinstance(self.direct, DirectPostgres)
            try:
                with self.direct.autocommit() as raw:
                    found = apply_one(raw, parameters, record.metadata)
            except StorageError:
                return "error"  # no connection: the usual path raises what it finds
            if not isinstance(found, Declined):
                STATS["applied"] += 1
                return (NEW, found)
            code = found.code
            STATS[f"declined:{code}"] += 1
            if code != "stale" or attempt:
                break
            self.database.run(self.limits.refresh)  # a limit changed: once more, up to date
        return code

    def _run_direct(self, work: _Work) -> list[Answer] | None:
        """``work`` on the fast path's own connections; None where it needs SQLAlchemy."""
        if self.direct is None:
            return None
        try:
            return self._on_direct(lambda store, retry: work(None, retry, store))
        except NeedsConnection:
            return None

    def _apply_reference(
        self,
        records: Sequence[EventRecord],
        now_us: int,
        invalid: InvalidPolicy,
        rejected: Sequence[Rejected],
        policy: ImportPolicy | None = None,
    ) -> list[Answer]:
        """The reference engine, for batches the fast path leaves to it."""
        events = [UsageEvent(*r[:2], from_us(r.occurred_at_us), r.metadata) for r in records]
        single = len(events) == 1

        def work(connection: Connection, retry: bool) -> list[Decided]:
            store = Store(connection)
            precheck = retry or not single
            applied = apply_events(
                store, events, now_us, invalid=invalid, precheck=precheck, policy=policy
            )
            conflicts = [
                Rejected(event.event_id, str(outcome), event.fingerprint())
                for event, outcome in zip(events, applied, strict=True)
                if isinstance(outcome, EventConflict) and invalid == "reject"
            ]
            refused = [
                refused_event(event, outcome.reason or "")
                for event, outcome in zip(events, applied, strict=True)
                if isinstance(outcome, Decision)
                and outcome.outcome == "rejected"
                and not outcome.duplicate
            ]
            store.record_rejected_messages([*rejected, *conflicts, *refused], now_us)
            return applied

        decided = self.database.run_retry_aware(work)
        count_reference("apply", len(events))
        answers: list[Answer] = []
        for event, applied in zip(events, decided, strict=True):
            if isinstance(applied, EventConflict):
                answers.append((CONFLICT, None))
            else:
                kind = DUPLICATE if applied.duplicate else NEW
                answers.append((kind, record_of(event, applied)))
        return answers

    # -- checking ------------------------------------------------------------------

    def check(self, event: UsageEvent) -> Decision:
        """What applying ``event`` would decide now; records nothing.

        On PostgreSQL the fast path's rules decide over state read in one
        statement in autocommit on a connection of `DirectPostgres`
        (`check_record`); the reference engine answers what they leave to
        it, and on SQLite.
        """
        now_us = self.database.now_us()
        fast = self._check_fast(event, now_us)
        if fast is not None:
            return fast
        return self._check_reference(event, now_us)

    def _check_fast(self, event: UsageEvent, now_us: int) -> Decision | None:
        """`check` by `check_record`, or None for the reference engine."""
        direct = self.direct
        if not isinstance(direct, DirectPostgres):
            return None
        record = event.record()
        for attempt in range(2):
            if attempt or self.limits.current[0] < 0:
                self.database.run(self.limits.refresh)
            try:
                with direct.autocommit() as raw:
                    found = check_record(partial(read_unlocked, raw), self.limits, record, now_us)
            except StorageError:
                return None  # the reference engine retries, or raises
            if found is None:
                return None
            if not isinstance(found, str):  # else STALE: refresh the limits, ask again
                return Decision(
                    event_id=None,
                    outcome=found.outcome,  # type: ignore[arg-type]
                    charges=tuple(ChargeDecision.from_row(row) for row in found.rows),
                    occurred_at=event.occurred_at,
                    decided_at=from_us(now_us),
                    denied_by=found.denied_by,
                    metadata=event.metadata,
                )
        return None

    def _check_reference(self, event: UsageEvent, now_us: int) -> Decision:
        """`check` by the reference engine, in one transaction."""

        original = event

        def work(connection: Connection) -> Decision:
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
            keys = [
                resolver.key(limits[c.limit], c.subject, event.occurred_at_us)
                for c in event.charges
            ]
            states = store.read_counters(keys)
            allowed = Allowed.read(store, [event], [keys], lock=False, money=money)
            seats = seat_keys(event, keys, limits)
            costs = Seats.read(store, [event], [keys], limits).costs(seats) if any(seats) else None
            return decide_with_states(
                event, keys, limits, states, now_us, allowed, record=False, costs=costs
            )

        decision = self.database.run(work)
        count_reference("check", 1)
        return decision


def _limits_version(connection: Connection) -> int:
    return Store(connection).limits_version()


def _count(
    records: Sequence[EventRecord],
    answers: Sequence[Answer],
    known: Container[str],
    invalid: InvalidPolicy,
    dead_letters: int,
) -> None:
    """Count what a committed transaction decided (`metering.metrics.count_events`).

    A new result counts once under each distinct limit its event charges,
    with the event's outcome; a rejected event's unknown limits count as
    `UNKNOWN_LIMIT` (their names are anyone's input). Repeated ids count by
    kind, and with ``invalid="reject"`` conflicts are also dead letters.
    The loop only collects keys (about 0.2 µs an event, bench/bench_metrics.py):
    `collections.Counter` adds them up.
    """
    keys: list[tuple[str, str]] = []
    append = keys.append
    denied_by: dict[str, int] = {}
    repeats: dict[str, int] = {}
    for record, (kind, result) in zip(records, answers, strict=True):
        if kind != NEW or result is None:
            repeats[kind] = repeats.get(kind, 0) + 1
            continue
        charges = record.charges
        outcome = result.outcome
        if len(charges) == 1:
            append((charges[0][1], outcome))
        else:
            for name in dict.fromkeys(charge[1] for charge in charges):
                append((name, outcome))
        if outcome == "denied":
            for name in result.denied_by:
                denied_by[name] = denied_by.get(name, 0) + 1
    outcomes = CountOf(keys)
    for name, outcome in [key for key in outcomes if key[1] == "rejected" and key[0] not in known]:
        outcomes[(UNKNOWN_LIMIT, outcome)] += outcomes.pop((name, outcome))
    if invalid == "reject":
        dead_letters += repeats.get(CONFLICT, 0)
    count_events(outcomes, denied_by, repeats, dead_letters)
