"""Quota leases: a process decides a hot key's requests from memory (docs/middleware.md).

`LeaseBook` is one `Meter`'s book of keys (subject, limit). For a hot key it reserves a
block of units in one transaction (`metering.reservations.transactions.lease`; size:
`metering.domain.leases.block_units`) and answers the key's next requests from memory; a
cold key takes the exact path. The database counts a block as used when leased, so used plus
leased units never exceed the maximum in any process. A lease is settled once
(`Reservation.commit(actual=used)`) when spent, idle, no longer serving, evicted (at most
``capacity`` keys, least recently used out) or at `close`; a killed process's lease is
committed in full by the sweeper. Settling runs on the book's threads, never in `take`.
"""

from __future__ import annotations

import atexit
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection

from metering.domain.decisions import Decision
from metering.domain.events import UsageEvent, make_event
from metering.domain.instants import from_us
from metering.domain.leases import (
    HOT_US,
    Block,
    block_units,
    is_hot,
    leasable,
    lease_times,
    served_decision,
    streak_after,
)
from metering.domain.limits import Limit
from metering.domain.reservations import DEFAULT_TTL_SECONDS, ReservationState
from metering.engine.core import Engine
from metering.errors import MeteringError
from metering.reservations import transactions
from metering.reservations.admin import EngineSettler, commit, reserve
from metering.reservations.handle import Reservation
from metering.storage.prices import PriceStore
from metering.storage.quota_notices import QuotaListener
from metering.storage.store import Store
from metering.usage.results import consumed

T = TypeVar("T")

log = logging.getLogger("metering.leases")

DEFAULT_CAPACITY = 50_000
LIMIT_CACHE_US = 60_000_000
REAP_INTERVAL_SECONDS = 0.25
# How long a call waits for another call's renewal of the same key before it
# takes the exact path itself.
RENEW_WAIT_SECONDS = 1.0
# The book's thread leases a hot key's next block this long before its
# current one stops serving, so that requests do not wait for the renewal.
RENEW_AHEAD_US = 1_000_000
BUSY = "busy"
# A renewal already done: what `_plan` answers a call that finds the key's
# lease serving again (another call renewed it since this one found it spent).
_DONE = threading.Event()
_DONE.set()

KeyName = tuple[str, str]  # (subject, limit)


class _Lease:
    """A block held in memory: ``used`` by requests, ``held`` by stacked
    reservations whose fate is not known yet, ``taken`` the units handed out
    (given back or not: the key's demand); ``closed`` once settling."""

    __slots__ = ("block", "closed", "expires_at_us", "held", "last_used_us", "taken", "used")

    def __init__(self, block: Block, expires_at_us: int, now_us: int) -> None:
        self.block = block
        self.expires_at_us = expires_at_us
        self.used = 0
        self.held = 0
        self.taken = 0
        self.closed = False
        self.last_used_us = now_us

    @property
    def unused(self) -> int:
        return self.block.units - self.used - self.held


class _Key:
    """A key's memory: when it was last seen and its streak, what its last
    block handed out (or the exact path's cost), what its window had left and
    when it ends; ``renewed`` is set when a renewal in progress ends."""

    __slots__ = (
        "last_seen_us",
        "lease",
        "left",
        "next",
        "renewed",
        "streak",
        "used_before",
        "window_end_us",
    )

    def __init__(self, now_us: int, used_before: int, left: int, window_end_us: int) -> None:
        self.last_seen_us = now_us
        self.streak = 1
        self.used_before = used_before
        self.left = left
        self.window_end_us = window_end_us
        self.lease: _Lease | None = None
        self.next: _Lease | None = None  # leased ahead, serves once ``lease`` ends
        self.renewed: threading.Event | None = None

    def seen(self, now_us: int) -> None:
        self.streak = streak_after(self.streak, self.last_seen_us, now_us)
        self.last_seen_us = now_us

    def hot(self, now_us: int) -> bool:
        """Whether a request now finds the key hot."""
        return is_hot(streak_after(self.streak, self.last_seen_us, now_us))


class LeasedReservation:
    """A stacking reservation served from a lease: held in memory, like a
    `Reservation` to its holder (``decision``, ``state``, ``cancel``,
    ``commit``). Cancelled, its units go back to the lease; committed, they
    count as used. Once the lease has been settled (its units counted as
    used then), neither changes anything stored: a cancel returns 0."""

    def __init__(self, book: LeaseBook, lease: _Lease, cost: int, decision: Decision) -> None:
        self._book = book
        self._lease = lease
        self._cost = cost
        self.decision = decision
        self.state: ReservationState = ReservationState.HELD

    @property
    def id(self) -> str:
        return self._lease.block.lease_id

    @property
    def allowed(self) -> bool:
        return True

    def cancel(self) -> int:
        if self.state != ReservationState.HELD:
            return 0
        self.state = ReservationState.CANCELLED
        return self._book.release(self._lease, self._cost, keep=0)

    def commit(self, actual: int | None = None) -> int:
        if self.state != ReservationState.HELD:
            return 0
        keep = self._cost if actual is None else min(max(actual, 0), self._cost)
        self.state = ReservationState.COMMITTED
        return self._book.release(self._lease, self._cost, keep=keep)

    def __repr__(self) -> str:
        return f"<LeasedReservation {self.id} {self.state}>"


class LeaseBook:
    """One process's leases (see the module docstring)."""

    def __init__(self, engine: Engine, *, capacity: int = DEFAULT_CAPACITY) -> None:
        self._engine = engine
        self._database = engine.database
        self.capacity = capacity
        self._keys: OrderedDict[KeyName, _Key] = OrderedDict()
        self._open: dict[str, tuple[KeyName, _Lease]] = {}
        self._to_settle: list[_Lease] = []
        self._lock = threading.Lock()
        self._limits: dict[str, tuple[int, Limit | None]] = {}
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._renewer: threading.Thread | None = None
        self._closed = False
        # PostgreSQL: the process's listener of quota-change notices, started
        # before the first block is leased; each notice applied counts here.
        self._listener: QuotaListener | None = None
        self._listener_lock = threading.Lock()
        self._generation = 0
        self.notices = 0

    def __len__(self) -> int:
        return len(self._keys)

    def _event(self, subject: str, limit: str, cost: int) -> UsageEvent:
        """A request the exact path decides: now, with an id of its own."""
        return make_event([(subject, limit, cost)], from_us(self._database.now_us()))

    def held_units(self) -> int:
        """Units this process holds in leases and has not used (nor handed
        to a stacked reservation): what it would lose if killed now."""
        with self._lock:
            return sum(lease.unused for _, lease in self._open.values())

    # -- from memory ---------------------------------------------------------

    def take(self, subject: str, limit: str, cost: int) -> Decision | None:
        """A decision from this key's lease, or None (the database must decide)."""
        taken = self._take(subject, limit, cost, held=False)
        return None if taken is None else taken[1]

    def take_held(self, subject: str, limit: str, cost: int) -> LeasedReservation | None:
        """A stacking reservation from this key's lease, or None."""
        taken = self._take(subject, limit, cost, held=True)
        if taken is None:
            return None
        lease, decision = taken
        return LeasedReservation(self, lease, cost, decision)

    def _take(
        self, subject: str, limit: str, cost: int, *, held: bool
    ) -> tuple[_Lease, Decision] | None:
        """``cost`` from this key's lease, used (or ``held``) at once, with its decision."""
        now_us = self._database.now_us()
        with self._lock:
            lease = self._usable(subject, limit, cost, now_us)
            if lease is None:
                return None
            if held:
                lease.held += cost
            else:
                lease.used += cost
            lease.taken += cost
            unused = lease.unused
        return lease, served_decision(lease.block, cost, unused, from_us(now_us))

    def _usable(self, subject: str, limit: str, cost: int, now_us: int) -> _Lease | None:
        name = (subject, limit)
        key = self._keys.get(name)
        if key is None:
            return None
        lease = key.lease
        if not _serves(lease, cost, now_us):
            ahead = key.next
            if not _serves(ahead, cost, now_us):
                return None
            if lease is not None and not lease.closed:  # spent or ending: settle it
                self._to_settle.append(self._close(lease))
            key.lease, key.next, lease = ahead, None, ahead
        assert lease is not None
        key.seen(now_us)
        lease.last_used_us = now_us
        if key.next is not None:  # in use as soon as this one ends: not idle
            key.next.last_used_us = now_us
        self._keys.move_to_end(name)
        return lease

    def release(self, lease: _Lease, cost: int, keep: int) -> int:
        """A leased reservation settled: ``keep`` of its ``cost`` used, the rest
        back to the lease; the units returned (0 once the lease is settled)."""
        with self._lock:
            if lease.closed:
                return 0
            lease.held -= cost
            lease.used += keep
            return cost - keep

    def is_hot(self, subject: str, limit: str) -> bool:
        """Whether this key is hot here and no other call is renewing its lease:
        then `lease` may take a block; else the exact path is the one to take."""
        now_us = self._database.now_us()
        with self._lock:
            key = self._keys.get((subject, limit))
            return key is not None and key.renewed is None and key.hot(now_us)

    def changed(self, subject: str | None, limit: str | None) -> None:
        """A reset or a changed maximum of (subject, limit) (None: every one)
        was committed: its keys leave the book, their leases stop serving at
        once and are settled; their next requests take the exact path."""
        with self._lock:
            self.notices += 1
            self._generation += 1
            for name in [name for name in self._keys if _matches(name, subject, limit)]:
                key = self._keys.pop(name)
                for lease in (key.lease, key.next):
                    if lease is not None and not lease.closed:
                        self._to_settle.append(self._close(lease))

    def note(self, subject: str, limit: str, cost: int, decision: Decision) -> None:
        """The exact path decided a request of this key: remember when, and
        what its window had left (the next block's size depends on both)."""
        now_us = self._database.now_us()
        charge = decision.charges[0] if len(decision.charges) == 1 else None
        if charge is None or charge.window_start_us is None:
            return  # a token bucket, or not this key's decision: nothing to lease
        name = (subject, limit)
        with self._lock:
            key = self._keys.get(name)
            if key is None:
                self._keys[name] = _Key(now_us, cost, charge.remaining, charge.resets_at_us)
                self._evict()
                return
            self._keys.move_to_end(name)
            key.seen(now_us)
            if key.lease is None:  # else its block's demand sizes the next one
                key.used_before = cost
            key.left, key.window_end_us = charge.remaining, charge.resets_at_us

    def _evict(self) -> None:
        while len(self._keys) > self.capacity:
            _name, key = self._keys.popitem(last=False)
            for lease in (key.lease, key.next):
                if lease is not None and not lease.closed:
                    self._to_settle.append(self._close(lease))

    # -- from the database ---------------------------------------------------

    def lease(self, subject: str, limit: str, cost: int) -> Decision:
        """Decide a request of this key: from its lease, from a new block, or
        by the exact path (`Meter.consume`)."""
        decision = self._served(self.take, subject, limit, cost)
        if decision is not None:
            return decision
        event = self._event(subject, limit, cost)
        decision = consumed(event.event_id, self._engine.submit(event.record()))
        self.note(subject, limit, cost, decision)
        return decision

    def reserve(self, subject: str, limit: str, cost: int) -> LeasedReservation | Reservation:
        """`lease` for a stacking reservation: from the lease, else `Meter.reserve`."""
        held = self._served(self.take_held, subject, limit, cost)
        if held is not None:
            return held
        event = self._event(subject, limit, cost)
        settler = EngineSettler(self._engine)
        reservation = reserve(self._engine, settler, event, DEFAULT_TTL_SECONDS)
        self.note(subject, limit, cost, reservation.decision)
        return reservation

    def _served(
        self, take: Callable[[str, str, int], T | None], subject: str, limit: str, cost: int
    ) -> T | None:
        """What ``take`` serves from the key's lease, or from a new block; None
        (the key's pending usage settled first) when the database must decide."""
        served = take(subject, limit, cost)
        if served is None and self._renew(subject, limit, cost):
            served = take(subject, limit, cost)
        if served is None:
            self._settle_pending((subject, limit))
        return served

    def _renew(self, subject: str, limit: str, cost: int) -> bool:
        """Lease a new block if the key is hot and the rule gives one (settling
        the block it replaces); whether a new block is held. A call that finds
        another renewing the key waits for it (at most `RENEW_WAIT_SECONDS`)."""
        definition = self._limit(limit)
        if definition is None or not leasable(definition):
            return False
        planned = self._plan((subject, limit), cost, self._database.now_us())
        if isinstance(planned, threading.Event):
            return planned.wait(RENEW_WAIT_SECONDS)
        if planned is None:
            return False
        key, units, old = planned
        renewed = key.renewed
        try:
            if old is not None:
                self._settle(old)
            return self._take_block(subject, limit, key, units)
        finally:
            with self._lock:
                key.renewed = None
            if renewed is not None:
                renewed.set()

    def _plan(
        self, name: KeyName, cost: int, now_us: int
    ) -> tuple[_Key, int, _Lease | None] | threading.Event | None:
        """Under the lock: the block to lease (and the lease it replaces, if
        that has units to give back), the renewal to wait for, or None.
        A lease that serves the request now (another call renewed it since
        this one found it spent) is not replaced: a renewal already done."""
        with self._lock:
            key = self._keys.get(name)
            if key is not None and key.renewed is not None:
                return key.renewed
            if key is not None and _key_serves(key, cost, now_us):
                return _DONE
            if key is None or now_us >= key.window_end_us:
                return None  # unknown, or a window not seen yet: the exact path
            old, left, used_before = key.lease, key.left, key.used_before
            if old is not None:
                left = old.block.charge.remaining + old.unused
                used_before = old.taken
            units = block_units(used_before, key.hot(now_us), left, cost)
            if units <= cost:
                return None
            key.renewed = threading.Event()
            key.lease = None
            key.used_before = used_before
            if key.next is not None and not key.next.closed:  # not usable either
                self._to_settle.append(self._close(key.next))
            key.next = None
            if old is None or old.closed:
                return key, units, None
            self._close(old)
            if old.unused + units > old.block.charge.remaining:
                # The next block fits only with this one's unused units back:
                # give them back first (a client near its limit is not
                # denied for units this process holds).
                return key, units, old
            self._to_settle.append(old)  # the settling thread commits it
            return key, units, None

    def _take_block(
        self, subject: str, limit: str, key: _Key, units: int, *, ahead: bool = False
    ) -> bool:
        now_us = self._database.now_us()
        times = lease_times(now_us, key.window_end_us)
        if times is None or not self._listening():
            return False
        generation = self._generation
        event = make_event([(subject, limit, units)], from_us(now_us), f"lease-{uuid.uuid4().hex}")
        reserved = transactions.lease(self._engine, event, times[0])
        if reserved is None:
            return False
        decision, _state, expires_at_us = reserved
        charge = decision.charges[0]
        if charge.resets_at_us != key.window_end_us:  # another window after all
            times = lease_times(now_us, charge.resets_at_us) or (now_us, now_us)
        block = Block(event.event_id, units, charge, times[1])
        lease = _Lease(block, expires_at_us or times[0], now_us)
        with self._lock:
            if generation != self._generation:  # a change came meanwhile: settle it unused
                self._to_settle.append(lease)
                lease.closed = True
                return False
            if ahead:
                key.next = lease
            else:
                key.lease = lease
            key.left = charge.remaining
            key.window_end_us = charge.resets_at_us
            self._open[block.lease_id] = ((subject, limit), lease)
        self._start_reaper()
        return True

    def _listening(self) -> bool:
        """Whether changes reach this book (always on SQLite: its leases see
        them at their next renewal); on PostgreSQL the listener is started
        first, and no block is leased while it does not listen."""
        with self._listener_lock:
            if self._closed:
                return False
            if self._listener is None:
                try:
                    self._listener = QuotaListener.for_engine(self._database.engine, self.changed)
                except MeteringError as exc:
                    log.warning("no quota listener (%s): leasing nothing", exc)
                    return False
                if self._listener is None:
                    return True
            return self._listener.listening

    def _limit(self, name: str) -> Limit | None:
        now_us = self._database.now_us()
        cached = self._limits.get(name)
        if cached is None or now_us - cached[0] > LIMIT_CACHE_US or now_us < cached[0]:
            definition = self._database.run(lambda c: _leasable_limit(c, name))
            self._limits[name] = cached = (now_us, definition)
        return cached[1]

    # -- settling -------------------------------------------------------------

    def _close(self, lease: _Lease) -> _Lease:
        """Stop serving from ``lease`` (under the lock); settle it afterwards."""
        lease.closed = True
        self._open.pop(lease.block.lease_id, None)
        return lease

    def settle_due(self, *, everything: bool = False) -> int:
        """Settle the leases idle for `HOT_SECONDS`, past their serving time or
        spent (all of them with ``everything``); how many were settled."""
        now_us = self._database.now_us()
        with self._lock:
            due = [
                self._close(lease)
                for _, lease in list(self._open.values())
                if everything or _due(lease, now_us)
            ]
            due += self._to_settle
            self._to_settle = []
        for lease in due:
            self._settle(lease)
        return len(due)

    def _settle_pending(self, name: KeyName) -> None:
        """Before the exact path decides this key: settle its closed leases
        that still hold unused units, so that the database has them back (a
        client near its limit is not denied for units this process held)."""
        with self._lock:
            mine = [
                lease
                for lease in self._to_settle
                if lease.unused > 0
                and (lease.block.charge.subject, lease.block.charge.limit) == name
            ]
            if not mine:
                return
            self._to_settle = [lease for lease in self._to_settle if lease not in mine]
        for lease in mine:
            self._settle(lease)

    def _settle(self, lease: _Lease) -> None:
        with self._lock:
            actual = lease.used + lease.held
        try:
            commit(
                self._engine, lease.block.lease_id, None if actual == lease.block.units else actual
            )
        except MeteringError as exc:  # expired: the sweeper's commit in full stands
            log.warning("lease %s not settled at %d: %s", lease.block.lease_id, actual, exc)

    def _start_reaper(self) -> None:
        """Start the book's threads: one renews hot keys' leases ahead, one
        settles. Apart, so that renewals never wait behind settlements (a
        settlement is a transaction that gives units back, several round
        trips; with a few hundred hot keys a thread doing both fell behind,
        leases stopped serving and requests waited for renewals)."""
        with self._lock:
            if self._reaper is not None or self._closed:
                return
            self._reaper = threading.Thread(
                target=self._reap, args=(self.settle_due,), name="metering-leases", daemon=True
            )
            self._renewer = threading.Thread(
                target=self._reap, args=(self.renew_ahead,), name="metering-renew", daemon=True
            )
        self._reaper.start()
        self._renewer.start()
        atexit.register(self.close)

    def renew_ahead(self) -> int:
        """Lease the next block of every hot key whose lease stops serving
        within `RENEW_AHEAD_US`; how many were leased (the book's thread)."""
        now_us = self._database.now_us()
        with self._lock:
            wanted = [name for name, lease in self._open.values() if _ending(lease, now_us)]
        return sum(self._renew_ahead(name, now_us) for name in wanted)

    def _renew_ahead(self, name: KeyName, now_us: int) -> bool:
        with self._lock:
            key = self._keys.get(name)
            lease = key.lease if key is not None else None
            if key is None or lease is None or key.next is not None or key.renewed is not None:
                return False
            if not _ending(lease, now_us) or not key.hot(now_us):
                return False
            # The current block still holds its unused units: the next one
            # is sized on what the window has left without them.
            units = block_units(max(lease.taken, 1), True, lease.block.charge.remaining, 1)
            if units <= 1:
                return False
            renewed = key.renewed = threading.Event()
        try:
            return self._take_block(*name, key, units, ahead=True)
        finally:
            with self._lock:
                key.renewed = None
            renewed.set()

    def _reap(self, task: Callable[[], int]) -> None:
        while not self._stop.wait(REAP_INTERVAL_SECONDS):
            try:
                task()
            except Exception:
                log.exception("%s of leases failed; retrying", task.__name__)

    def close(self) -> None:
        """Stop the book's threads and listener, settle every lease (shutdown)."""
        with self._listener_lock:
            self._closed = True
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        self._stop.set()
        reaper = self._reaper
        if reaper is not None:
            for thread in (self._renewer, reaper):
                if thread is not None and thread is not threading.current_thread():
                    thread.join(5)
            atexit.unregister(self.close)
        self.settle_due(everything=True)


def _leasable_limit(connection: Connection, name: str) -> Limit | None:
    """The limit named ``name``, if it may be leased: known, and charging no
    money (a priced or spend limit's requests each charge their spend, on
    the exact path)."""
    definition = Store(connection).load_limits([name]).get(name)
    if definition is None or definition.currency or PriceStore(connection).histories([name]):
        return None
    return definition


def _serves(lease: _Lease | None, cost: int, now_us: int) -> bool:
    """Whether ``lease`` can serve a request of ``cost`` at ``now_us``."""
    return (
        lease is not None
        and not lease.closed
        and lease.unused >= cost
        and lease.last_used_us <= now_us < lease.block.serve_until_us
    )


def _key_serves(key: _Key, cost: int, now_us: int) -> bool:
    """Whether ``key``'s lease, or the one leased ahead, serves a request now."""
    return _serves(key.lease, cost, now_us) or _serves(key.next, cost, now_us)


def _ending(lease: _Lease, now_us: int) -> bool:
    """Whether a lease in use stops serving soon: time to lease the next block."""
    return (
        not lease.closed
        and lease.block.serve_until_us - RENEW_AHEAD_US <= now_us < lease.block.serve_until_us
        and now_us - lease.last_used_us < HOT_US
    )


def _matches(name: KeyName, subject: str | None, limit: str | None) -> bool:
    """Whether a change of (subject, limit), None for every one, concerns key ``name``."""
    return subject in (None, name[0]) and limit in (None, name[1])


def _due(lease: _Lease, now_us: int) -> bool:
    return (
        (lease.unused <= 0 and lease.held == 0)
        or now_us >= lease.block.serve_until_us
        or now_us - lease.last_used_us >= HOT_US
    )
