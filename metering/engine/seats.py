"""Seats in a batch: what each charge on a distinct limit costs
(`metering.domain.distinct`), and the values it counts.

Read after the batch's counters are locked (`DistinctStore`'s lock order),
kept up to date event by event, so a batch decides as its events would one
by one; a value's row is written when it takes a seat, not for a held
value's further events (`HELD`). The reference engine reads and writes
them here (`Seats.read`, `Seats.write`); the fast path reads them with its
hot store's counters, only those `HeldCache` does not know held at their
window's stamp (the one-trip function checks it). A void (`free_seats`) asks the ledger.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any

from metering.domain.corrections import VoidedCharge
from metering.domain.decisions import Decision
from metering.domain.distinct import HELD, SeatKey, Seen, after_void, seat_cost, value_of
from metering.domain.events import UsageEvent
from metering.domain.limits import Limit
from metering.domain.rollups import WOULD_DENY
from metering.domain.rules import Key
from metering.domain.state import NO_WINDOW, CounterKey
from metering.errors import MeteringError
from metering.storage.distinct import DistinctStore
from metering.storage.hot import Snapshot, WantedSeat
from metering.storage.results import ResultStore
from metering.storage.store import Store

COUNTED = ("allowed", "overage")
# Seat values taken as held (`HeldCache.split`), by window: the stamp they
# are known held at, and the values.
Assumed = dict[Key, tuple[int, list[SeatKey]]]


def seat_keys(
    event: UsageEvent, keys: Sequence[CounterKey], limits: Mapping[str, Limit]
) -> list[SeatKey | None]:
    """Per charge, the value it counts in its window (None: not a distinct limit)."""
    found: list[SeatKey | None] = []
    for charge, key in zip(event.charges, keys, strict=True):
        distinct = limits[charge.limit].distinct
        if distinct is None:
            found.append(None)
            continue
        value = value_of(distinct, charge.limit, event.metadata, charge.cost)
        found.append((charge.limit, charge.subject, key.window_start_us, value))
    return found


@dataclass
class Seats:
    """The live events of the batch's values (as stored, `HELD` or 0, then
    counted on), and what the batch adds to their rows (a value's first)."""

    seen: Seen = field(default_factory=dict)
    added: dict[SeatKey, int] = field(default_factory=lambda: defaultdict(int))

    @classmethod
    def read(
        cls,
        store: Store,
        events: Sequence[UsageEvent],
        keys: Sequence[Sequence[CounterKey]],
        limits: Mapping[str, Limit],
    ) -> Seats:
        if not any(limits[c.limit].distinct for event in events for c in event.charges):
            return cls()
        wanted = [
            seat
            for event, event_keys in zip(events, keys, strict=True)
            for seat in seat_keys(event, event_keys, limits)
            if seat is not None
        ]
        return cls(DistinctStore(store.connection).live(wanted))

    def costs(self, seats: Sequence[SeatKey | None]) -> list[int | None]:
        """Per charge, its cost on a distinct limit (None: the event's own).
        An event charges a (subject, limit) once (`charges_of`): no value twice."""
        return [None if seat is None else seat_cost(self.seen, seat) for seat in seats]

    def count(self, seats: Sequence[SeatKey | None], decision: Decision) -> None:
        """Count the values of the charges ``decision`` consumed."""
        self.count_outcomes(seats, decision.outcome, [c.outcome for c in decision.charges])

    def count_outcomes(
        self, seats: Sequence[SeatKey | None], outcome: str, charges: Sequence[str]
    ) -> None:
        """`count` for an event decided ``outcome`` with ``charges``' outcomes
        (the fast path's rows, `metering.engine.fast`)."""
        if outcome not in COUNTED:
            return
        for seat, charge in zip(seats, charges, strict=True):
            # Every charge of a consumed event consumed but a shadow limit's would-deny.
            if seat is not None and charge != WOULD_DENY:
                live = self.seen.get(seat, 0)
                self.seen[seat] = live + 1
                if not live:  # a held value's row stays `HELD`
                    self.added[seat] = HELD

    def taken(self, seat: SeatKey) -> int:
        """The cost of a consumed charge on ``seat``'s value (`seat_cost`),
        counted as `count_outcomes` counts it."""
        seen = self.seen
        live = seen.get(seat, 0)
        seen[seat] = live + 1
        if live:  # a held value's row stays `HELD`
            return 0
        self.added[seat] = HELD
        return 1

    def write(self, store: Store) -> None:
        if self.added:
            DistinctStore(store.connection).add(self.added)


class HeldCache:
    """Per meter: the values known held in seat windows, each window's with
    the stamp (``counters.seats_stamp``) they were read at under its lock. A
    stamp is new at every change of the window's held values and never
    reused (migration 0041), so while a window's locked counter shows the
    same stamp, every value known held is still held, whatever wrote or
    restored the database meanwhile. A batch reads only the values it knows
    nothing of (`split`), then those of the windows whose stamp moved
    (`settle`); a window met for the first time with at most ``warm`` seats
    is read whole. One value on SQLite is asked alone (`settle_one`).
    Emptied when it holds more than ``size`` windows."""

    def __init__(self, size: int = 100_000, warm: int = 64) -> None:
        self.size, self.warm = size, warm
        # (limit, subject, window start) -> (stamp, values held at that stamp);
        # entries are replaced whole, never changed in place.
        self.windows: dict[Key, tuple[int, frozenset[str]]] = {}
        self.met: set[Key] = set()  # the windows read whole once

    def split(self, seats: Iterable[WantedSeat]) -> tuple[list[WantedSeat], Assumed]:
        """``seats`` as those to read and, by window, those taken as held if
        the window's stamp is still the one they are known held at (`settle`
        finds out)."""
        asked: list[WantedSeat] = []
        assumed: dict[Any, tuple[int, list[Any]]] = {}
        # Any: a seat of a first-use window (its start None) is in no window known.
        windows: dict[Any, tuple[int, frozenset[str]]] = self.windows
        ask = asked.append
        for seat in seats:
            key = seat[:3]
            known = windows.get(key)
            if known is not None and seat[3] in known[1]:
                group = assumed.get(key)
                if group is None:
                    assumed[key] = (known[0], [seat])
                else:
                    group[1].append(seat)
            else:
                ask(seat)
        return asked, assumed

    def held_at(self, key: Key, value: str) -> int | None:
        """The stamp ``value`` is known held at in ``key``'s window, or None."""
        known = self.windows.get(key)
        return known[0] if known is not None and value in known[1] else None

    def settle(
        self,
        asked: Sequence[WantedSeat],
        assumed: Assumed,
        snapshot: Snapshot,
        read_seats: Callable[[Sequence[WantedSeat]], Seen],
        read_held: Callable[[Sequence[Key]], dict[Key, set[str]]],
    ) -> None:
        """Complete ``snapshot.seen`` (read for ``asked``) with ``assumed``: held
        where the window's stamp is the one they were known held at (not the
        one known now: another batch may have learnt a newer one since), else
        read now (``read_seats``, under the same locks); then learn what was
        read, and the held values of the windows met first (``read_held``)."""
        windows, stamps, seen = self.windows, snapshot.stamps, snapshot.seen
        stale: list[SeatKey] = []
        for key, (known_at, group) in assumed.items():
            if stamps.get(key) == known_at:
                for seat in group:
                    seen[seat] = HELD
            else:
                stale.extend(group)
        if stale:
            seen.update(read_seats(sorted(stale)))
        self._bound()
        held: dict[Key, set[str]] = defaultdict(set)
        for name, subject, start, value in chain(asked, stale):
            if start is not None:
                key = (name, subject, start)
                values = held[key]
                if seen.get((name, subject, start, value), 0) > 0:
                    values.add(value)
        for key, values in held.items():
            stamp = stamps.get(key)
            if stamp is None:
                windows.pop(key, None)
                continue
            self._learn(key, stamp, values)
        met, states = self.met, snapshot.states
        first = [
            key
            for key in held
            if key not in met and key in stamps and 0 < states[key][0] <= self.warm
        ]
        if first:
            met.update(first)
            for key, values in read_held(first).items():
                self._learn(key, stamps[key], values)

    def stamp_of(self, seat: WantedSeat) -> int | None:
        """The stamp ``seat`` is known held at, or None (`settle_one`)."""
        name, subject, start, value = seat
        return None if start is None else self.held_at((name, subject, start), value)

    def settle_one(
        self,
        seat: WantedSeat,
        stamp: int | None,
        snapshot: Snapshot,
        read_seats: Callable[[Sequence[WantedSeat]], Seen],
        read_held: Callable[[Sequence[Key]], dict[Key, set[str]]],
        whole: bool,
    ) -> None:
        """`settle` for a store that reads one value with its first counter
        (``folds_one_seat``): ``seat`` was read there, or taken as held at
        ``stamp`` (`stamp_of`): held while its window shows that stamp, else
        read now. A value read held is learnt, and with ``whole`` a window met
        first is read whole, as `settle` reads it."""
        name, subject, start, value = seat
        if start is None:
            return  # a first-use window's: read, never known
        key = (name, subject, start)
        now = snapshot.stamps.get(key)
        if stamp is not None:
            if now == stamp:
                snapshot.seen[(name, subject, start, value)] = HELD
                return
            snapshot.seen.update(read_seats([seat]))
        if now is None:
            return
        if (
            whole
            and stamp is None
            and key not in self.met
            and 0 < snapshot.states[key][0] <= self.warm
        ):
            self.met.add(key)
            self._bound()
            for found, values in read_held([key]).items():
                self._learn(found, now, values)
        elif snapshot.seen.get((name, subject, start, value), 0) > 0:
            self.learn(key, now, value)

    def learn(self, key: Key, stamp: int, value: str) -> None:
        """``value`` was held in ``key``'s window at ``stamp`` (read under its
        lock: the one-trip function's answer, `metering.engine.one_trip`)."""
        self._bound()
        self._learn(key, stamp, {value})

    def _bound(self) -> None:
        """Empty the cache when it holds more than ``size`` windows."""
        if len(self.windows) > self.size:
            self.windows.clear()
            self.met.clear()

    def _learn(self, key: Key, stamp: int, values: set[str]) -> None:
        known = self.windows.get(key)
        if known is not None and known[0] == stamp:
            if not values <= known[1]:
                self.windows[key] = (stamp, known[1] | values)
        elif values:
            self.windows[key] = (stamp, frozenset(values))
        elif known is not None:  # its stamp moved: nothing known held
            del self.windows[key]

    def forget(self, keys: Iterable[Key]) -> None:
        """Drop the windows a batch changed (their stamps moved on commit)."""
        for key in keys:
            self.windows.pop(key, None)


def free_seats(
    store: Store,
    limits: Mapping[str, Limit],
    charges: Sequence[VoidedCharge],
    metadata: Mapping[str, object] | None,
    event_id: str,
) -> list[VoidedCharge]:
    """A void's charges with those on distinct limits at what they give back:
    the event leaves its value's live events, and the seat is freed (cost 1,
    with the grants that paid for it) only when it was the value's last: its
    other live events are counted in the ledger (`others_live`). Call after
    the charges' counters are locked."""
    seats: list[SeatKey | None] = []
    for charge in charges:
        limit = limits.get(charge.key.limit)
        seat = None
        if limit is not None and limit.distinct and charge.key.window_end_us != NO_WINDOW:
            try:
                value = value_of(limit.distinct, limit.name, metadata, 1)
            except MeteringError:
                value = None  # decided before the limit counted values: a plain charge
            if value is not None:
                seat = (limit.name, charge.key.subject, charge.key.window_start_us, value)
        seats.append(seat)
    if not any(seats):
        return list(charges)
    distinct = DistinctStore(store.connection)
    live = distinct.live(seat for seat in seats if seat is not None)
    changes: dict[SeatKey, int] = defaultdict(int)
    found: list[VoidedCharge] = []
    for charge, seat in zip(charges, seats, strict=True):
        if seat is None:
            found.append(charge)
            continue
        before = live.get(seat, 0)
        others = 0
        if before > 0:
            key = limits[seat[0]].distinct
            assert key is not None  # a seat's limit counts values
            others = others_live(store, charge, key, seat[3], event_id)
        left, freed = after_void(before, others)
        live[seat] = left
        changes[seat] += left - before
        found.append(replace(charge, cost=freed, grants=charge.grants if freed else ()))
    distinct.add(changes)
    return found


def others_live(store: Store, charge: VoidedCharge, key: str, value: str, event_id: str) -> int:
    """The live events but ``event_id`` whose charge on ``charge``'s window
    counts ``value`` (of metadata ``key``), up to one: the window's
    allowed results, not voided nor cleared by a reset since."""
    counter = charge.key
    found = ResultStore(store.connection).window_metadata(counter, event_id, value)
    for _, rows, metadata in found:
        if not metadata:
            continue
        consumed = any(
            row[0] == counter.subject
            and row[1] == counter.limit
            and row[9] == counter.window_start_us
            and row[4] != WOULD_DENY
            for row in json.loads(rows)
        )
        if not consumed:
            continue
        try:
            if value_of(key, counter.limit, json.loads(metadata), 1) != value:
                continue
        except MeteringError:
            continue
        return 1
    return 0
