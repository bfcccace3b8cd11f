"""Giving an event's usage back: the one transaction step of cancel, commit of less and void.

`give_back` takes the units of some charges of one decided event back from the counters, the
grants (the last drawn first) and the usage rollups, in the engines' lock order (counters, then
grants); a counter the event counted in as a gauge's (by its era: `counted_by`) takes the level
its remaining reports give (`gauge_after`); the rollups, the rows of the dimensions it was
decided under (`rolled_up_under`). The rules are pure (`metering.domain.corrections`); the SQL
is in the stores. Exactly once is the callers' part: a reservation's ``given_back``, a void's
correction record, the reset log (`resets_after`: a cleared counter gives back to rollups alone).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from metering.domain.corrections import (
    GivenBack,
    VoidedCharge,
    can_take_back,
    counter_of,
    gauge_after,
    gauge_reports,
    not_reset,
    taken_back,
)
from metering.domain.dimension_history import counted_by, ever_dimensioned, rolled_up_under
from metering.domain.limits import GAUGES, Limit
from metering.domain.rollups import given_back_deltas, merged, spend_given_back
from metering.domain.state import CounterState
from metering.storage.allowances import AllowanceStore, DrawKey
from metering.storage.results import ResultRecord
from metering.storage.rollups import record_rollups
from metering.storage.store import Store


@dataclass(frozen=True, slots=True)
class Returning:
    """One charge of the event to give back: its counter, the units going
    back and the grants they drew (a `VoidedCharge`), and how much of it the
    event still had charged before (all of it going back takes the event
    out of the rollups' event count)."""

    charge: VoidedCharge
    charged: int


@dataclass(frozen=True, slots=True)
class Returned:
    """What `give_back` did with one `Returning`: whether its counter and
    grants took it (False: a reset cleared the counter since), the units the
    counter took (a bucket already full takes none), and the grants whose
    amounts were given back (the ones still active)."""

    charge: VoidedCharge
    counter: bool
    returned: int
    grants: list[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class GaveBack:
    """The charges given back, in the order given (those whose counter no
    longer takes anything back, under a cancel's rules, left out)."""

    charges: list[Returned]

    @property
    def returned(self) -> int:
        """Units the counters took back."""
        return sum(r.returned for r in self.charges)

    @property
    def given_back(self) -> list[GivenBack]:
        """Per counter that took its charge back, the units of it that went
        back (a reservation's ``given_back``)."""
        return [(*counter_of(r.charge.key), r.charge.cost) for r in self.charges if r.counter]


def give_back(
    connection: Connection,
    event: ResultRecord | None,
    charges: Sequence[Returning],
    now_us: int,
    *,
    past_windows: bool,
    money: bool = True,
    released: Sequence[Returning] = (),
) -> GaveBack:
    """Give back, once, what ``charges`` of ``event`` (its stored result;
    None once pruned: no resets, grants or rollups to consider) consumed.

    ``past_windows`` is a void's rule: every charge's counter takes it back,
    a past window too. Without it (a cancel, a commit of less) a charge
    whose counter can no longer take anything back (`can_take_back`: its
    window ended, its limit was deleted or redefined) is left out entirely.
    ``money`` False: the spend rollups are the caller's (a commit of less
    priced usage: `metering.reservations.transactions`). ``released``: what of
    ``event``'s charges a reset cleared from a hold goes back on a cancel or
    a commit of less; no counter takes it back (it started over), the
    rollups take it off.
    """
    store = Store(connection)
    names = {item.charge.key.limit for item in [*charges, *released]}
    limits = store.load_limits(names)
    kept = [
        item
        for item in charges
        if can_take_back(
            limits.get(item.charge.key.limit), item.charge, now_us, past_windows=past_windows
        )
    ]
    if not kept and not released:
        return GaveBack([])
    result = _take_back(connection, event, kept, limits, now_us, past_windows) if kept else []
    if event is not None:
        dimensions = event_dimensions(store, event, names)
        returned = [
            (item.charge.key.subject, item.charge.key.limit, item.charged, item.charge.cost)
            for item in [*kept, *released]
        ]
        deltas = given_back_deltas(event, returned, dimensions) if dimensions else {}
        if money:  # the money of its priced charges, spend limit or not
            deltas = merged(deltas, spend_given_back(event, returned))
        if deltas:
            record_rollups(connection, deltas)
    return GaveBack(result)


def event_dimensions(
    store: Store, event: ResultRecord, names: Iterable[str]
) -> dict[str, tuple[str, ...]]:
    """The dimensions ``event`` was rolled up under, of those of ``names``
    that have any (`metering.domain.dimension_history`)."""
    history = {
        name: eras
        for name, eras in store.dimension_history(names).items()
        if ever_dimensioned(eras)
    }
    if not history:
        return {}
    tick = store.reset_tick_of(event.event_id)
    if tick is None:
        return {}
    found = {
        name: rolled_up_under(eras, tick, event.decided_at_us) for name, eras in history.items()
    }
    return {name: keys for name, keys in found.items() if keys}


def _take_back(
    connection: Connection,
    event: ResultRecord | None,
    kept: Sequence[Returning],
    limits: Mapping[str, Limit],
    now_us: int,
    past_windows: bool,
) -> list[Returned]:
    """`give_back`'s counters and grants: what each of ``kept`` gives back,
    but to a counter a reset cleared after ``event`` (it started over)."""
    store = Store(connection)
    left = [item.charge for item in kept]
    if event is not None:
        resets = store.resets_after(
            event.event_id, event.decided_at_us, (charge.key for charge in left)
        )
        left = not_reset(left, resets)
    cleared = [not any(charge is item.charge for charge in left) for item in kept]
    states = store.lock_counters({charge.key for charge in left}, now_us)
    kinds = _counted_by(store, event, left, limits, past_windows) if event is not None else {}
    levels = {
        charge.key: gauge_after(
            kind,
            states.get(charge.key, CounterState()),
            gauge_reports(charge.key, store.window_results(charge.key, event.event_id)),
        )
        for charge in left
        if event is not None and (kind := kinds.get(charge.key.limit, "sum")) in GAUGES
    }
    changed, units = taken_back(
        limits, left, states, now_us, past_windows=past_windows, levels=levels
    )
    store.write_counters(changed, now_us)
    restored = iter(zip(units, restore_grants(connection, left, now_us), strict=True))
    return [
        Returned(item.charge, not gone, *((0, []) if gone else next(restored)))
        for item, gone in zip(kept, cleared, strict=True)
    ]


def _counted_by(
    store: Store,
    event: ResultRecord,
    charges: Sequence[VoidedCharge],
    limits: Mapping[str, Limit],
    past_windows: bool,
) -> dict[str, str]:
    """How each limit of ``charges`` counted ``event``: for a void, by the
    aggregation of the era it was decided under (a gauge made a sum once its
    windows were over still holds levels there), else by today's (a hold is
    never on a gauge, nor is a limit with holds made one)."""
    names = {charge.key.limit for charge in charges}
    history = store.dimension_history(names) if past_windows else {}
    tick = store.reset_tick_of(event.event_id) if history else None
    found = {}
    for name in names:
        limit = limits.get(name)
        today = limit.aggregation if limit is not None else None
        kind = counted_by(history.get(name, []), tick, event.decided_at_us, today)
        if kind is not None:
            found[name] = kind
    return found


def restore_grants(
    connection: Connection, charges: Sequence[VoidedCharge], now_us: int
) -> list[list[tuple[str, int]]]:
    """Give back what ``charges`` drew on grants: always to their windows'
    draws, and to the grants that are still active. Per charge, the grants
    given back."""
    paid = [c for c in charges if c.grants]
    if not paid:
        return [[] for _ in charges]
    allowances = AllowanceStore(connection)
    pots = allowances.lock_pots({(c.key.limit, c.key.subject) for c in paid}, [])
    active = {
        balance.grant_id
        for pot in pots.values()
        for balance in pot.balances
        if balance.expires_at_us is None or now_us < balance.expires_at_us
    }
    draws: dict[DrawKey, int] = defaultdict(int)
    restored: list[list[tuple[str, int]]] = []
    for charge in charges:
        given: list[tuple[str, int]] = []
        for grant_id, amount in charge.grants:
            key = charge.key
            draws[(key.limit, key.subject, key.window_start_us, grant_id)] -= amount
            if grant_id in active:
                given.append((grant_id, amount))
        restored.append(given)
    allowances.write_draws(draws, restore=active)
    return restored
