"""`Engine`: the one place that chooses how an event is applied or checked.

It holds the decision paths in order (`metering.engine.paths`: the one-trip
function, the fast path on its own connections and on SQLAlchemy's, the
reference engine) and runs one loop: a batch's needs are worked out from
the cached limits (`metering.domain.needs`), and the first path whose
``implements`` covers them decides; a path that declines names the need it
found, and the loop goes on to the next that implements it. A stale cache
is reloaded and the same path asked again.

Concurrent single calls share transactions (`metering.engine.group`). What
every committed transaction decided is counted here (`metering.telemetry.metrics`),
so callers count nothing. The differential tests hold every path to the
reference engine's results, counters, notifications and checks.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Connection

from metering.domain.decisions import Decision
from metering.domain.events import EventRecord, Rejected, UsageEvent
from metering.domain.imports import ImportPolicy
from metering.domain.needs import UNHELD, Need, batch_needs
from metering.engine.answers import (
    CONFLICT,
    NEW,
    Answer,
    Batch,
    Declined,
    Hold,
    InvalidPolicy,
    Unacceptable,
)
from metering.engine.group import GroupCommit
from metering.engine.limit_cache import LimitCache
from metering.engine.paths import Direct, OnConnection, OneTrip, Path, Reference
from metering.storage.database import Database
from metering.storage.hot import HotStore
from metering.storage.hot.direct_postgres import DirectPostgres
from metering.storage.hot.sqlite import DirectSqlite
from metering.storage.store import Store
from metering.telemetry.metrics import UNKNOWN_LIMIT, count_events

T = TypeVar("T")

# Reloads of the cached limits one call may make when a path finds them stale.
_REFRESHES = 2


class Engine:
    """Applies and checks events on one database; a `Meter` holds one.

    ``group_commit``: single calls from several threads (`submit`) share
    transactions; without it each gets its own. ``paths``: the decision
    paths in order (tests pick some); the last must implement every need.
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
        paths: list[Path] = []
        if isinstance(self.direct, DirectPostgres):
            paths.append(OneTrip(self.direct, self.limits))
        if self.direct is not None:
            paths.append(Direct(self.direct, self.limits))
        paths += [OnConnection(database, self.limits), Reference(database)]
        self.paths = paths

    def path(self, name: str) -> Path:
        """The path called ``name`` (``one_trip``, ``direct``, ``connection``, ``reference``)."""
        return next(path for path in self.paths if path.name == name)

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
        meanwhile: Callable[[list[Answer]], None] | None = None,
    ) -> list[Answer]:
        """Apply a batch in one transaction, in order (see `Meter.apply_records`);
        ``policy``: an import's flags (`metering.imports`); ``meanwhile``:
        see `Batch`."""
        batch = Batch(
            records, self.database.now_us(), invalid, rejected, policy=policy, meanwhile=meanwhile
        )
        try:
            answers = self.decide(batch)
        except Unacceptable as exc:
            raise exc.error from None
        _count(records, answers, self.limits.current[1], invalid, len(rejected))
        return answers

    def reserve(self, record: EventRecord, hold: Hold) -> Answer:
        """Apply one event and, when it is allowed, keep its reservation row
        in the same transaction (`metering.reservations.transactions`). Raises
        the event's error, and `NotHeld` for a lease's denied block (nothing
        is recorded). Reservations are not counted in the metrics."""
        batch = Batch([record], self.database.now_us(), "raise", hold=hold)
        try:
            [answer] = self.decide(batch)
        except Unacceptable as exc:
            raise exc.error from None
        return answer

    def _apply_raising(self, records: Sequence[EventRecord]) -> list[Answer]:
        """A group's batch: an unacceptable event raises `Unacceptable`, naming it."""
        answers = self.decide(Batch(records, self.database.now_us(), "raise"))
        _count(records, answers, self.limits.current[1], "raise", 0)
        return answers

    def decide(self, batch: Batch) -> list[Answer]:
        """``batch`` decided by the first path that implements its needs."""
        if len(batch.records) == 1:
            return self._first(batch, lambda path, batch: path.apply(batch))
        with collector_paused():
            return self._first(batch, lambda path, batch: path.apply(batch))

    def _first(self, batch: Batch, ask: Callable[[Path, Batch], T | Declined]) -> T:
        """What ``ask`` gets of the first path that implements ``batch``'s
        needs: a decline adds the need it found and goes on to the next path
        that implements it; a stale one reloads the limits and asks the same
        path again."""
        if self.limits.current[0] < 0:
            self.database.run(self.limits.refresh)
        # None: not worked out, as the first path takes the batch whatever
        # its charges need (until it declines).
        needs = None if self._unheld(batch) else self.needs(batch)
        refreshes, index = 0, 0
        while index < len(self.paths):
            path = self.paths[index]
            if needs is not None and not needs <= path.implements:
                index += 1
                continue
            found = ask(path, batch)
            if not isinstance(found, Declined):
                return found
            if found.stale and refreshes < _REFRESHES:
                refreshes += 1
                self.database.run(self.limits.refresh)
                if needs is not None:
                    needs = self.needs(batch) | (needs & _FOUND)
                continue  # the same path, with the limits as they are now
            if needs is None:
                needs = self.needs(batch)
            if found.need is not None:
                needs |= {found.need}
                if found.need == Need.REPEATED_ID:
                    batch = batch.looking_up()
            index += 1
        raise AssertionError(f"no decision path implements {sorted(needs or ())}")

    def _unheld(self, batch: Batch) -> bool:
        """Whether ``batch`` has no hold, import nor dead letters and the
        first path implements every need such a batch may have (`UNHELD`):
        it is asked first whatever the batch's charges need."""
        paths = self.paths
        return (
            batch.hold is None
            and batch.policy is None
            and not batch.rejected
            and bool(paths)
            and paths[0].implements >= UNHELD
        )

    def needs(self, batch: Batch) -> frozenset[Need]:
        """What deciding ``batch`` needs, from the cached limits (`metering.domain.needs`)."""
        _, rules, allowances = self.limits.current
        return batch_needs(
            len(batch.records),
            held=batch.hold is not None,
            imported=batch.policy is not None,
            dead_letters=bool(batch.rejected),
            charged=frozenset(allowances.charged(rules, batch.records)),
        )

    def settle(self, direct: Callable[[HotStore], T | Declined], general: Callable[[], T]) -> T:
        """A reservation's settle (`metering.reservations.transactions`): ``direct``
        in one transaction on the fast path's own connections; where there are
        none, or ``direct`` declines (before it wrote anything: grants,
        rollups, the limits' cache stale), ``general`` runs the whole settle
        under SQLAlchemy."""
        if self.direct is not None:
            found = self.direct.run(lambda store, retry: direct(store))
            if not isinstance(found, Declined):
                return found
            if found.stale:
                self.database.run(self.limits.refresh)
        return general()

    # -- checking ------------------------------------------------------------------

    def check(self, event: UsageEvent) -> Decision:
        """What applying ``event`` would decide now; records nothing. The
        first path that checks and implements its needs answers."""
        now_us = self.database.now_us()
        batch = Batch([event.record()], now_us)
        return self._first(batch, lambda path, _: path.check(event, now_us))


# Needs found while deciding (kept when the limits are reloaded).
_FOUND = frozenset({Need.EARLY_FIRST_USE, Need.NOTICES, Need.REPEATED_ID})


def _limits_version(connection: Connection) -> int:
    return Store(connection).limits_version()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector, paused while a batch is decided.

    A batch allocates tens of thousands of short-lived tuples and lists, all
    freed by reference counting; meanwhile they set off collections that walk
    every object of the process (`bench/bench_gc.py`). Cyclic garbage made
    meanwhile is collected after. Left alone when the collector was off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _count(
    records: Sequence[EventRecord],
    answers: Sequence[Answer],
    known: Container[str],
    invalid: InvalidPolicy,
    dead_letters: int,
) -> None:
    """Count what a committed transaction decided (`metering.telemetry.metrics.count_events`).

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
    for record, answer in zip(records, answers, strict=True):
        result = answer.record
        if answer.kind != NEW or result is None:
            repeats[answer.kind] = repeats.get(answer.kind, 0) + 1
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
    outcomes = Counter(keys)
    for name, outcome in [key for key in outcomes if key[1] == "rejected" and key[0] not in known]:
        outcomes[(UNKNOWN_LIMIT, outcome)] += outcomes.pop((name, outcome))
    if invalid == "reject":
        dead_letters += repeats.get(CONFLICT, 0)
    count_events(outcomes, denied_by, repeats, dead_letters)
