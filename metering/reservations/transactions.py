"""The transactions of reservations, beside the ledger they consume through.

`reserve` (and `lease`, a quota lease's block) decides and records an event exactly like
`consume` (`Engine.reserve`) and, when allowed, writes in the same transaction a durable
reservation row naming the counters it consumed from. `cancel` gives the cost back where it
still can (`metering.domain.reservations`); `commit` makes it final, at ``actual`` units
giving the rest back (priced, with their money) or charging the excess (a hard limit's
overdraft; refused for priced usage). Both settle on the engine's own connections
(`Engine.settle`: the reservation row locked, then its counters); what that declines (grants,
rollups, money) runs again whole under SQLAlchemy. `Reservation` is what callers hold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from typing import Final, Literal

from sqlalchemy import Connection

from metering.allowances.give_back import Returning, event_dimensions, give_back
from metering.domain.corrections import (
    GivenBack,
    VoidedCharge,
    can_take_back,
    counter_of,
    split_back,
    split_held,
    taken_back,
    voided_charges,
)
from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.events import MAX_COST, UsageEvent
from metering.domain.notifications import Notice, notices_for, payload_of
from metering.domain.reservations import (
    MAX_TTL_SECONDS,
    ChargedMore,
    HeldCharge,
    ReservationState,
    can_give_back,
    charge_more,
    committed_money,
    ruleless,
)
from metering.domain.rollups import charged_more_deltas, spend_kept
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.engine.answers import CONFLICT, DUPLICATE, Declined, Hold, NotHeld
from metering.engine.breakers import Breakers
from metering.engine.core import Engine
from metering.engine.limit_cache import LimitCache
from metering.engine.reference import decision_of
from metering.errors import (
    EventConflict,
    InvalidInput,
    ReservationExpired,
    ReservationSettled,
    UnknownReservation,
)
from metering.storage.allowances import AllowanceStore
from metering.storage.database import Database
from metering.storage.hot import Changes, HotStore, ReadRequest
from metering.storage.prices import PriceStore
from metering.storage.reservations import ReservationRecord, ReservationStore, settle_row
from metering.storage.results import ResultRecord
from metering.storage.rollups import record_rollups
from metering.storage.store import Store
from metering.storage.webhooks import WebhookStore


def validate_ttl(ttl_seconds: object) -> float:
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
        raise InvalidInput("ttl_seconds", f"must be a number of seconds, got {ttl_seconds!r}")
    if not 0 < ttl_seconds <= MAX_TTL_SECONDS:
        raise InvalidInput("ttl_seconds", f"must be above 0 and at most {MAX_TTL_SECONDS:.0f}")
    return float(ttl_seconds)


Reserved = tuple[Decision, ReservationState, int | None]  # decision, state, expires_at_us


def reserve(engine: Engine, event: UsageEvent, ttl_us: int) -> Reserved:
    """The transaction of `Meter.reserve`: decide, and keep a row if allowed."""
    return _reserved(engine, event, Hold(ttl_us=ttl_us))


def lease(engine: Engine, event: UsageEvent, expires_at_us: int) -> Reserved | None:
    """`reserve` for a lease's block (`metering.reservations.leases`), held until
    ``expires_at_us``. A block that does not fit is not an event: its
    transaction rolls back and nothing is recorded (None); the request that
    asked for it then takes the exact path, which records its own outcome."""
    try:
        return _reserved(engine, event, Hold(until_us=expires_at_us, block=True))
    except NotHeld:
        return None


def _reserved(engine: Engine, event: UsageEvent, hold: Hold) -> Reserved:
    """The event decided and its reservation row written in one transaction
    (`Engine.reserve`, on whichever path implements it)."""
    answer = engine.reserve(event.record(), hold)
    record = answer.record
    if answer.kind == CONFLICT or record is None:
        raise EventConflict(event.event_id)
    decision = decision_of(record, duplicate=answer.kind == DUPLICATE)
    if answer.kind == DUPLICATE:
        return _repeated(engine.database, event.event_id, decision)
    if not decision.allowed:
        return decision, ReservationState.DENIED, None
    return decision, ReservationState.HELD, hold.expires_at_us(record.decided_at_us)


def _repeated(database: Database, event_id: str, decision: Decision) -> Reserved:
    """The answer to an id decided before: its reservation's state, or, for
    an id consumed (not reserved), its final state."""
    record = database.run(lambda connection: ReservationStore(connection).get(event_id))
    if record is not None:
        return decision, ReservationState(record.state), record.expires_at_us
    final = ReservationState.COMMITTED if decision.allowed else ReservationState.DENIED
    return decision, final, None


@dataclass(frozen=True, slots=True)
class Settled:
    """What a cancel or commit transaction did."""

    returned: int = 0
    expired: bool = False


def _locked(rows: ReservationStore, reservation_id: str) -> ReservationRecord:
    record = rows.get(reservation_id, lock=True)
    if record is None:
        raise UnknownReservation(reservation_id)
    return record


def cancel(engine: Engine, reservation_id: str) -> int:
    """Give a held reservation's cost back; returns the units returned.

    Cancelling twice does nothing; a committed one raises `ReservationSettled`,
    one past its time to live is committed and raises `ReservationExpired`.
    """
    return _settle(engine, reservation_id, ReservationState.CANCELLED, 0)


def validate_actual(actual: object) -> int:
    """``actual`` for `commit`: a whole number from 0 to the largest cost an
    event may have. Below a charge's reserved cost the rest goes back; above
    it the excess is charged (`_charge_more`)."""
    if isinstance(actual, bool) or not isinstance(actual, int) or actual < 0:
        raise InvalidInput("actual", f"must be a whole number of at least 0, got {actual!r}")
    if actual > MAX_COST:
        raise InvalidInput("actual", f"must be at most {MAX_COST}, got {actual}")
    return actual


def _more(
    record: ReservationRecord,
    keep: int | None,
    spend: Collection[str],
    dropped: Sequence[HeldCharge] = (),
) -> bool:
    """Whether settling at ``keep`` charges some usage charge (not one of the
    ``spend`` limits: their money follows the units) more than it reserved,
    one a reset ``dropped`` from the hold included."""
    return keep is not None and any(
        charge.cost < keep for charge in (*record.charges, *dropped) if charge.limit not in spend
    )


def commit(engine: Engine, reservation_id: str, actual: int | None = None) -> int:
    """Make a held reservation final; returns the units given back.

    With ``actual``, each usage charge is settled at ``actual`` units: below
    its reserved cost the rest goes back once, as a cancel gives it back,
    its money with it (`_money_back`); above it the excess is charged once,
    fitting or not (`_charge_more`; refused for priced usage), also after
    the sweeper committed the reservation in full at its time to live.
    Committing twice does nothing (0); after a cancel it raises
    `ReservationSettled`; a commit of less than reserved past the time to
    live raises `ReservationExpired`: the sweeper's commit in full stands.
    """
    return _settle(engine, reservation_id, ReservationState.COMMITTED, actual)


def _settle(engine: Engine, reservation_id: str, to: ReservationState, keep: int | None) -> int:
    """Cancel (``to`` cancelled, ``keep`` 0) or commit a held reservation,
    each charge keeping ``keep`` units (None: all) and giving the rest back.

    Settling into the state it is in does nothing; from the other settled
    state it raises `ReservationSettled`. Past the time to live a settle that
    would give anything back commits in full instead and raises
    `ReservationExpired`, so the answer does not depend on when the sweeper
    last ran.

    The common settle runs on the fast path's own connections
    (`Engine.settle`, `_settle_direct`); what it declines (grants to
    restore, rollups to take back, a counter gone, the limits' cache
    stale) runs again, whole, here under SQLAlchemy.
    """
    action = "cancel" if to == ReservationState.CANCELLED else "commit"
    database = engine.database
    now_us = database.now_us()

    def work(connection: Connection) -> Settled:
        rows = ReservationStore(connection)
        record = _locked(rows, reservation_id)
        store = Store(connection)
        committing = to == ReservationState.COMMITTED and keep is not None
        dropped = _dropped(store, record) if committing and record.hold_cleared else []
        names = [c.limit for c in (*record.charges, *dropped)]
        known = store.load_limits(names) if committing else {}
        spend = {name: limit.currency for name, limit in known.items() if limit.currency}
        step = _first_step(record, to, keep, now_us, action, spend, dropped)
        if step is None:
            return Settled()
        if step == _MORE:
            assert keep is not None
            _refuse_priced_more(store, record, keep, spend, dropped)
            # Every counter locked at once, in one order, before any is written
            # (a deleted limit's window too: it takes the excess).
            store.lock_counters(
                [c.key for c in record.charges if c.limit in known or c.window_end_us != NO_WINDOW],
                now_us,
            )
            returned, given_back = 0, list[GivenBack]()
            if record.state == ReservationState.HELD and record.expires_at_us > now_us:
                returned, given_back = _give_back(connection, record, keep, now_us, spend)
            _charge_more(connection, record, keep, now_us, spend, dropped)
            rows.settle(reservation_id, to, now_us, action, given_back)
            return Settled(returned=returned)
        if step != _GIVE_BACK:
            state, by = step
            rows.settle(reservation_id, state, now_us, by)
            return Settled(expired=by == _EXPIRY)
        assert keep is not None
        money = spend if committing else None
        returned, given_back = _give_back(connection, record, keep, now_us, money)
        rows.settle(reservation_id, to, now_us, action, given_back)
        return Settled(returned=returned)

    def direct(store: HotStore) -> Settled | Declined:
        return _settle_direct(store, engine.limits, reservation_id, to, keep, now_us, action)

    settled = engine.settle(direct, lambda: database.run(work))
    if settled.expired:
        raise ReservationExpired(reservation_id, ReservationState.COMMITTED, action)
    return settled.returned


_GIVE_BACK: Final = "give back"
_MORE: Final = "more"
_EXPIRY: Final = "expiry"
# Who committed a reservation in full at its time to live, with no actual:
# a commit of more than reserved after them still charges the excess.
_AT_EXPIRY: Final = (_EXPIRY, "sweeper")


def _first_step(
    record: ReservationRecord,
    to: ReservationState,
    keep: int | None,
    now_us: int,
    action: str,
    spend: Collection[str] = (),
    dropped: Sequence[HeldCharge] = (),
) -> tuple[ReservationState, str] | Literal["give back", "more"] | None:
    """What settling ``record`` into ``to`` does before anything is given
    back, the same on both paths: None when it is in ``to`` already;
    (state, settled by) when nothing goes back (a commit in full, or past the
    time to live: committed in full by `_EXPIRY`); `_MORE` when a commit
    charges more than reserved (also after a commit in full at the time to
    live, once: the commit is then settled by ``commit``); `_GIVE_BACK`
    otherwise. Raises `ReservationSettled` from the other settled state, and
    what `validate_actual` raises. ``spend``: the charges' spend limits;
    ``dropped``: the charges a reset dropped from the hold (`_dropped`)."""
    if keep is not None:
        validate_actual(keep)
    more = to == ReservationState.COMMITTED and _more(record, keep, spend, dropped)
    if record.state == to:
        return _MORE if more and record.settled_by in _AT_EXPIRY else None
    if record.state != ReservationState.HELD:
        raise ReservationSettled(record.id, record.state, action)
    if keep is None:
        return to, action
    if more:
        return _MORE
    if record.expires_at_us <= now_us:
        return ReservationState.COMMITTED, _EXPIRY
    return _GIVE_BACK


def _returning(
    record: ReservationRecord,
    stored: ResultRecord | None,
    keep: int,
    spend: Collection[str] = (),
    money: Mapping[tuple[str, str], int] | None = None,
) -> list[Returning]:
    """Each usage charge's units above ``keep``, and each charge of the
    ``spend`` limits' minor units in ``money`` (by subject and limit), with
    what they drew on grants (the last drawn first: `split_back` of the
    reserving event's charge; none once its result is pruned)."""
    paid = {
        counter_of(charge.key): charge
        for charge in (voided_charges(stored.outcome, stored.charges) if stored else ())
    }
    returning = []
    for charge in record.charges:
        if charge.limit in spend:
            units = (money or {}).get((charge.subject, charge.limit), 0)
        else:
            units = charge.cost - keep
        if units <= 0:
            continue
        drawn = paid.get(counter_of(charge.key))
        back = VoidedCharge(charge.key, units, ()) if drawn is None else split_back(drawn, units)[0]
        returning.append(Returning(replace(back, key=charge.key), charge.cost))
    return returning


def _settle_direct(
    store: HotStore,
    cache: LimitCache,
    reservation_id: str,
    to: ReservationState,
    keep: int | None,
    now_us: int,
    action: str,
) -> Settled | Declined:
    """`_settle`'s transaction on a `HotStore` of the fast path's own: the
    same checks and writes as ``work`` there, in at most three round trips on
    PostgreSQL (the reservation locked; its counters locked with the limits'
    version and its result; counters and reservation written with the
    COMMIT). Declines (`Declined`) before writing anything what is
    rare: a commit of more than reserved, a hold a reset cleared part of,
    grants to restore, usage rollups to take back, a counter that no longer
    exists (the general path creates it), the limits' cache stale."""
    record = store.lock_reservation(reservation_id)
    if record is None:
        raise UnknownReservation(reservation_id)
    spend: frozenset[str] = frozenset()
    if to == ReservationState.COMMITTED and keep is not None:
        version, rules, _ = cache.current
        if version < 0:
            return Declined("the limits are not loaded yet", stale=True)
        spend = frozenset(
            c.limit for c in record.charges if c.limit in rules and rules[c.limit].limit.currency
        )
    if record.hold_cleared and keep is not None:  # what the reset dropped, the result says
        return Declined("a reset cleared part of its hold")
    step = _first_step(record, to, keep, now_us, action, spend)
    if step is None:
        return Settled()
    if step == _MORE:
        return Declined("a commit of more than reserved")
    if step != _GIVE_BACK:
        state, by = step
        store.write(
            Changes(settled=[settle_row(reservation_id, state, now_us, by)]), now_us, commit=True
        )
        return Settled(expired=by == _EXPIRY)
    assert keep is not None
    returning = _returning(record, None, keep, spend)
    keys = [item.charge.key for item in returning]
    wanted = sorted({(k.limit, k.subject, k.window_start_us, k.window_end_us) for k in keys})
    returned = 0
    units: list[GivenBack] = []
    updated: list[tuple[tuple[str, str, int], list[object]]] = []
    if wanted:
        version, rules, _ = cache.current
        if version < 0:
            return Declined("the limits are not loaded yet", stale=True)
        snapshot = store.read(ReadRequest([reservation_id], (), wanted))
        if snapshot.version != version:
            return Declined("the limits changed since they were cached", stale=True)
        limits = {c.limit: rules[c.limit].limit for c in record.charges if c.limit in rules}
        if any(rules[name].money for name in limits):
            return Declined("money to give back")
        returning = _returning(record, snapshot.stored.get(reservation_id), keep, spend)
        live = [
            charge
            for charge in (item.charge for item in returning)
            if can_take_back(limits.get(charge.key.limit), charge, now_us, past_windows=False)
        ]
        if live:
            if any(name in cache.dimensioned for name in limits):  # now or when decided
                return Declined("rollups to take back")
            if any(charge.grants for charge in live):
                return Declined("grants to restore")
            states: dict[CounterKey, CounterState] = {}
            for charge in live:
                key = charge.key
                found = snapshot.states.get((key.limit, key.subject, key.window_start_us))
                if found is None:
                    return Declined("a counter to create")
                states[key] = CounterState(*found)
            changed, taken = taken_back(limits, live, states, now_us, past_windows=False)
            returned = sum(taken)
            units = [(*counter_of(charge.key), charge.cost) for charge in live]
            updated = sorted(
                ((k.limit, k.subject, k.window_start_us), _state_row(state))
                for k, state in changed.items()
            )
    row = settle_row(reservation_id, to, now_us, action, units)
    store.write(Changes(updated=updated, settled=[row]), now_us, commit=True)
    return Settled(returned=returned)


# A counter's state as the hot stores write it (`metering.domain.rules.State`):
# its fields in order.
_STATE_FIELDS: Final = attrgetter(*(f.name for f in fields(CounterState)))


def _state_row(state: CounterState) -> list[object]:
    return list(_STATE_FIELDS(state))


def _give_back(
    connection: Connection,
    record: ReservationRecord,
    keep: int,
    now_us: int,
    spend: Mapping[str, str] | None = None,
) -> tuple[int, list[GivenBack]]:
    """Give back each charge's cost above ``keep`` where it still can be
    (`metering.allowances.give_back`); the units returned, and per counter
    the units of its charge that went back (a bucket already full counts:
    it needs nothing). With ``spend`` (a commit: the charges' spend limits
    and their currencies, none or some) ``keep`` is the usage's units, and
    the money of the priced units going back goes back with them
    (`_money_back`)."""
    store = Store(connection)
    stored = store.fetch_results([record.id]).get(record.id)
    # What a reset dropped from the hold goes back while its window is current,
    # as a held charge does: past it, nothing (its money stays billed).
    dropped = [c for c in cleared_from(record, stored) if _current(c.key, now_us)]
    if spend is not None and dropped:  # the spend limits of charges a reset dropped too
        found = store.load_limits(charge.key.limit for charge in dropped)
        spend = {**spend, **{name: lim.currency for name, lim in found.items() if lim.currency}}
    released = _released(dropped, keep, spend or ())
    if spend is not None:
        money = _money_back(connection, record, stored, keep, now_us, spend, released)
        if money is not None:
            return money
        returning = _returning(record, stored, keep, spend)
    else:
        returning = _cancelled(store, record, stored, now_us, released)
    gave = give_back(connection, stored, returning, now_us, past_windows=False, released=released)
    return gave.returned, gave.given_back + _named(released)


def _current(key: CounterKey, now_us: int) -> bool:
    """Whether ``key``'s window is not over (a bucket has none)."""
    return key.window_end_us == NO_WINDOW or now_us < key.window_end_us


def _cancelled(
    store: Store,
    record: ReservationRecord,
    stored: ResultRecord | None,
    now_us: int,
    released: Sequence[Returning],
) -> list[Returning]:
    """A cancel's charges to give back (`_returning` at 0 units): each spend
    charge gives back the money of the priced charges that go back (held ones
    whose counter still takes it, and those a reset ``released``), not that
    of usage past its window, which stays charged and billed."""
    limits = store.load_limits(c.limit for c in record.charges)
    spend = {name: limit.currency for name, limit in limits.items() if limit.currency}
    if not spend or stored is None:
        return _returning(record, stored, 0)
    going = {
        (c.subject, c.limit)
        for c in record.charges
        if can_give_back(limits.get(c.limit), c, now_us)
    }
    going |= {(item.charge.key.subject, item.charge.key.limit) for item in released}
    money: dict[tuple[str, str], int] = defaultdict(int)
    for row in (ChargeDecision.from_row(r) for r in stored.charges):
        if row.price is not None and (row.subject, row.limit) in going:
            currency, amount = row.price
            for name, code in spend.items():
                if code == currency:
                    money[(row.subject, name)] += amount
    return _returning(record, stored, 0, spend, money)


def _released(
    dropped: Sequence[VoidedCharge], keep: int, spend: Collection[str]
) -> list[Returning]:
    """What settling at ``keep`` units gives back of the charges a reset
    ``dropped`` from a hold (`cleared_from`): each usage charge's units above
    ``keep``, off the rollups alone (the counter started over). A commit's
    ``spend`` limits keep their money (`_money_back` refuses to split it)."""
    return [
        Returning(split_back(charge, charge.cost - keep)[0], charge.cost)
        for charge in dropped
        if charge.cost > keep and charge.key.limit not in spend
    ]


def _named(released: Sequence[Returning]) -> list[GivenBack]:
    """``released`` as a settled row names it: per counter, the units gone
    back (a void then takes only the units kept: none after a cancel)."""
    return [(*counter_of(item.charge.key), item.charge.cost) for item in released]


def cleared_from(record: ReservationRecord, stored: ResultRecord | None) -> list[VoidedCharge]:
    """The charges of the reserving event's result that a reset dropped from
    ``record``'s hold (`ReservationStore.forget_held_charges`): consumed, and
    held no more."""
    if stored is None:
        return []
    return split_held(voided_charges(stored.outcome, stored.charges), record.charges)[1]


def _dropped(store: Store, record: ReservationRecord) -> list[HeldCharge]:
    """`cleared_from`, read from the reserving event's result, as held charges."""
    stored = store.fetch_results([record.id]).get(record.id)
    return [
        HeldCharge(c.key.subject, c.key.limit, c.cost, c.key.window_start_us, c.key.window_end_us)
        for c in cleared_from(record, stored)
    ]


_UNSPLIT: Final = (
    "a reset cleared {0!r} since it was reserved: the money of its units cannot be split; "
    "commit it in full or cancel it"
)


def _money_back(
    connection: Connection,
    record: ReservationRecord,
    stored: ResultRecord | None,
    keep: int,
    now_us: int,
    spend: Mapping[str, str],
    released: Sequence[Returning],
) -> tuple[int, list[GivenBack]] | None:
    """A commit of priced usage at ``keep`` units: the units above it go
    back where they still can (as for any usage), and the money of its
    priced charges becomes that of the units kept, the first of those
    reserved, at the price the reserve charged (`committed_money`). The
    result is rewritten with the money kept (each priced charge's amount,
    each spend charge's cost: a void then gives back the rest), the spend
    counters and rollups take the difference back, and ``given_back``
    names the usage alone. None when no priced units go back (nothing
    changes in money). `InvalidInput`, before anything is written, when the
    money cannot be split exactly."""
    held = {(c.subject, c.limit): c for c in record.charges}
    store = Store(connection)
    limits = store.load_limits(c.limit for c in record.charges)
    rows = [ChargeDecision.from_row(row) for row in stored.charges] if stored else []
    kept = []
    for row in rows:
        charge = held.get((row.subject, row.limit))
        if charge is None and row.price is not None and keep < row.cost:
            raise InvalidInput("actual", _UNSPLIT.format(row.limit))
        back = (
            row.limit not in spend
            and charge is not None
            and keep < charge.cost
            and can_give_back(limits.get(row.limit), charge, now_us)
        )
        kept.append(keep if back else row.cost)
    if stored is None or not any(
        row.price is not None and units < row.cost for row, units in zip(rows, kept, strict=True)
    ):
        if stored is None and any(c.cost > keep for c in record.charges if c.limit not in spend):
            raise InvalidInput(
                "actual",
                "its result is gone (retention): the money of its units cannot be "
                "found; commit it in full or cancel it",
            )
        return None
    prices = PriceStore(connection).histories(row.limit for row in rows if row.price)
    money = committed_money(rows, kept, prices, spend, stored.occurred_at_us)
    refunds: dict[tuple[str, str], int] = {}
    rewritten: list[list[object]] = []
    rolled: list[tuple[str, str, str, int, int, bool]] = []
    for row, units, amount in zip(rows, kept, money, strict=True):
        if row.limit in spend:
            charge = held.get((row.subject, row.limit))
            if amount < row.cost:
                if charge is None:
                    raise InvalidInput("actual", _UNSPLIT.format(row.limit))
                if not can_give_back(limits.get(row.limit), charge, now_us):
                    raise InvalidInput(
                        "actual",
                        f"the window of its spend limit {row.limit!r} ended: its money is "
                        "history; commit it in full",
                    )
            refunds[(row.subject, row.limit)] = row.cost - amount
            rewritten.append(replace(row, cost=amount).to_row())
        elif row.price is not None:
            currency, charged = row.price
            rolled.append((row.subject, row.limit, currency, charged, amount, units == 0))
            rewritten.append(replace(row, price=(currency, amount)).to_row())
        else:
            rewritten.append(row.to_row())
    returning = _returning(record, stored, keep, spend, refunds)
    gave = give_back(
        connection, stored, returning, now_us, past_windows=False, money=False, released=released
    )
    store.rewrite_charges(record.id, rewritten)
    record_rollups(connection, spend_kept(stored, rolled))
    usage = [given for given in gave.given_back if given[1] not in spend]
    return gave.returned, usage + _named(released)


def _refuse_priced_more(
    store: Store,
    record: ReservationRecord,
    keep: int,
    spend: Collection[str],
    dropped: Sequence[HeldCharge] = (),
) -> None:
    """`InvalidInput` for a commit of more units than reserved of priced
    usage (held, or ``dropped`` by a reset): its money was priced (and
    checked against its caps) for the units reserved. With its result gone
    (retention) and no spend limit, allowed."""
    stored = store.fetch_results([record.id]).get(record.id)
    if stored is None and not spend:
        return
    priced = {
        (row.subject, row.limit)
        for row in (ChargeDecision.from_row(r) for r in (stored.charges if stored else ()))
        if row.price is not None
    }
    if any(
        c.cost < keep and (stored is None or (c.subject, c.limit) in priced)
        for c in (*record.charges, *dropped)
        if c.limit not in spend
    ):
        raise InvalidInput(
            "actual",
            "a reservation of priced usage commits at most the units it reserved "
            "(its money was priced, and held against any spend cap, for them): record "
            "the rest as an event of its own",
        )


def _charge_more(
    connection: Connection,
    record: ReservationRecord,
    keep: int,
    now_us: int,
    spend: Collection[str] = (),
    dropped: Sequence[HeldCharge] = (),
) -> None:
    """Charge each charge's units above its reserved cost, fitting or not
    (`metering.domain.reservations.charge_more`), in the commit's
    transaction: the counters (locked by the caller), the grants that pay
    part of it, the usage rollups, the overdraft a hard limit had no room
    for, ``limit.exceeded`` once per window, and the reserving event's result
    rewritten with the real cost, its draws and its overdraft (so that a
    void reverses all of it). The excess steps the runaway breakers as a
    consume of it would. A window's charge with no rule (`ruleless`) adds
    the excess to its counter alone; one a reset ``dropped`` from the hold
    adds it to the result and rollups alone (its counter started over: a
    reset clears usage, not billing)."""
    store = Store(connection)
    held = [c for c in record.charges if c.cost < keep and c.limit not in spend]
    more = held + [c for c in dropped if c.cost < keep and c.limit not in spend]
    limits = store.load_limits(c.limit for c in more)
    stored = store.fetch_results([record.id]).get(record.id)
    rows = [list(row) for row in stored.charges] if stored is not None else []
    where = {(row[0], row[1]): i for i, row in enumerate(rows)}
    # A window's charge with no rule (its limit deleted, or made a bucket)
    # still has a counter to take the excess.
    orphans = [c for c in held if c.window_end_us != NO_WINDOW and ruleless(limits.get(c.limit), c)]
    chargeable = [c for c in held if c.limit in limits and c not in orphans]
    states = store.lock_counters([c.key for c in (*chargeable, *orphans)], now_us)
    windowed = [c for c in chargeable if c.window_end_us != NO_WINDOW]
    pots = AllowanceStore(connection).lock_pots(
        [(c.limit, c.subject) for c in windowed],
        [(c.limit, c.subject, c.window_start_us) for c in windowed],
    )
    changed: dict[CounterKey, CounterState] = {}
    draws: dict[tuple[str, str, int, str], int] = defaultdict(int)
    overdraft: list[tuple[str, str, int, int]] = []
    notices: list[Notice] = []
    parts: list[list[object]] = []  # the excess, charged: it steps the breakers
    for charge in more:
        extra = keep - charge.cost
        index = where.get((charge.subject, charge.limit))
        decided = ChargeDecision.from_row(rows[index]) if index is not None else None
        limit = limits.get(charge.limit)
        got = _NOTHING_MORE
        if charge in orphans:
            before = states[charge.key]
            got = ChargedMore(replace(before, used=before.used + extra))
            states[charge.key] = changed[charge.key] = got.state
        elif limit is not None and charge in chargeable:
            pot = pots.get((charge.limit, charge.subject))
            granted = pot.granted.get(charge.window_start_us, 0) if pot is not None else 0
            before = states[charge.key]
            maximum = decided.maximum if decided is not None else limit.maximum
            got = charge_more(
                limit, charge, extra, before, now_us, maximum=maximum, granted=granted, pot=pot
            )
            if got.draws and pot is not None:
                pot.take(charge.window_start_us, got.draws)
                for grant_id, amount in got.draws:
                    draws[(charge.limit, charge.subject, charge.window_start_us, grant_id)] += (
                        amount
                    )
            states[charge.key] = changed[charge.key] = got.state
            overdraft.append((charge.subject, charge.limit, charge.window_start_us, got.overdraft))
            if decided is not None:
                part = replace(
                    decided,
                    cost=extra,
                    used=decided.used + extra,
                    overage=decided.overage + got.overage,
                    grants=got.draws,
                    overdraft=got.overdraft,
                )
                notices.extend(notices_for(limit, charge.key, before, got.state, part, record.id))
                parts.append(part.to_row())
        if decided is not None and index is not None:
            rows[index] = replace(
                decided,
                cost=keep,
                used=decided.used + extra,
                remaining=max(decided.remaining - extra, 0),
                overage=decided.overage + got.overage,
                grants=_merged(decided.grants, got.draws),
                overdraft=decided.overdraft + got.overdraft,
            ).to_row()
    store.write_counters(changed, now_us)
    pairs = [(c.limit, c.subject) for c in chargeable]
    breakers = Breakers.read(connection, limits.values(), pairs, lock=True) if pairs else None
    if breakers is not None:  # after the counters' lock, as a consume steps them
        breakers.charged("allowed", parts, record.id, now_us)
        breakers.write(connection, now_us)
    AllowanceStore(connection).write_draws(draws)
    ReservationStore(connection).add_overdrafts(record.id, overdraft, now_us)
    if stored is not None:
        store.rewrite_charges(record.id, rows)
        # Every charge the result rewrote, its limit gone too: the rows follow the result.
        dimensioned = event_dimensions(store, stored, (c.limit for c in more))
        if dimensioned:
            extra_units = [(c.subject, c.limit, keep - c.cost) for c in more]
            record_rollups(connection, charged_more_deltas(stored, extra_units, dimensioned))
    if notices:
        WebhookStore(connection).record_notices(
            [(notice, payload_of(notice, now_us)) for notice in notices], now_us
        )


# A charge whose limit is gone: the result still records the real cost.
_NOTHING_MORE: Final = ChargedMore(CounterState())


def _merged(
    grants: tuple[tuple[str, int], ...], more: tuple[tuple[str, int], ...]
) -> tuple[tuple[str, int], ...]:
    """A charge's grant draws with ``more`` added (one entry per grant, in first-drawn order)."""
    total: dict[str, int] = {}
    for grant_id, amount in (*grants, *more):
        total[grant_id] = total.get(grant_id, 0) + amount
    return tuple(total.items())
