"""Giving a cancelled reservation's cost back, charging a commit's usage beyond it (pure).

A reservation consumed like any event. Cancelling gives the charge back where that still
means something (`can_give_back`, `give_back`): a fixed window only while it is current
(an ended window's usage is history), a token bucket up to its capacity. A commit of more
than reserved (`charge_more`) charges the excess to the reservation's own window (even an
ended one), drawing on grants as a decision would; what a hard limit has no room for is
charged all the same as *overdraft* (billed; the counter denies until the window resets or
the bucket refills past its debt). A soft limit's excess is overage; a shadow one has none.
A commit of fewer priced units keeps the money of the first ones reserved (`committed_money`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from metering.domain.buckets import take_anyway
from metering.domain.decisions import ChargeDecision
from metering.domain.grants import Pot, fit_window
from metering.domain.limits import Limit
from metering.domain.money import PriceHistory, priced_charges
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.errors import InvalidInput


class ReservationState(StrEnum):
    """Where a reservation stands. ``denied`` is never stored: a denied
    reservation consumed nothing and has no row. Members are strings, equal
    to their values (``ReservationState.HELD == "held"``)."""

    HELD = "held"
    COMMITTED = "committed"
    CANCELLED = "cancelled"
    DENIED = "denied"


# The states a stored reservation can be in (what listings filter by).
STORED_STATES: tuple[ReservationState, ...] = (
    ReservationState.HELD,
    ReservationState.COMMITTED,
    ReservationState.CANCELLED,
)
DEFAULT_TTL_SECONDS = 60.0
MAX_TTL_SECONDS = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class HeldCharge:
    """One charge of a held reservation: the counter it consumed from, and how much."""

    subject: str
    limit: str
    cost: int
    window_start_us: int
    window_end_us: int

    @property
    def key(self) -> CounterKey:
        return CounterKey(self.limit, self.subject, self.window_start_us, self.window_end_us)

    def to_row(self) -> list[object]:
        return [self.subject, self.limit, self.cost, self.window_start_us, self.window_end_us]

    @classmethod
    def from_row(cls, row: list[object]) -> HeldCharge:
        subject, limit, cost, start, end = row
        return cls(str(subject), str(limit), int(cost), int(start), int(end))  # type: ignore[call-overload]


def held_charge(charge: ChargeDecision) -> HeldCharge:
    """What a reservation holds of an allowed charge. A fixed window's charge
    resets when its window ends: its counter key needs that end to find it
    again (a token bucket has no window)."""
    windowed = charge.window_start_us is not None
    return HeldCharge(
        subject=charge.subject,
        limit=charge.limit,
        cost=charge.cost,
        window_start_us=charge.window_start_us if windowed else NO_WINDOW,  # type: ignore[arg-type]
        window_end_us=charge.resets_at_us if windowed else NO_WINDOW,
    )


@dataclass(frozen=True, slots=True)
class GiveBack:
    """What cancelling one charge does: the new state and the units returned."""

    state: CounterState
    returned: int


def can_give_back(limit: Limit | None, charge: HeldCharge, now_us: int) -> bool:
    """Whether the charge's counter can still take anything back at ``now_us``."""
    if limit is None:  # deleted since: nothing to return to
        return False
    bucket = charge.window_end_us == NO_WINDOW
    if bucket != (limit.algorithm == "token_bucket"):  # redefined since
        return False
    return bucket or now_us < charge.window_end_us


def give_back(limit: Limit, charge: HeldCharge, state: CounterState, now_us: int) -> GiveBack:
    """Return ``charge.cost`` to ``state`` as far as the rules above allow."""
    if not can_give_back(limit, charge, now_us):
        return GiveBack(state, 0)
    if limit.algorithm == "token_bucket":
        return _bucket_give_back(limit, charge.cost, state, now_us)
    returned = min(charge.cost, state.used)
    return GiveBack(replace(state, used=state.used - returned), returned)


def _bucket_give_back(limit: Limit, cost: int, state: CounterState, now_us: int) -> GiveBack:
    if state.tat_us is None:
        return GiveBack(state, 0)
    capacity = limit.maximum
    token = limit.period_seconds * 1_000_000  # one token, in units scaled by capacity
    now_scaled = now_us * capacity
    exact = state.tat_us * state.tat_scale + state.tat_rem
    tat_scaled = -(-exact * capacity // state.tat_scale)
    if tat_scaled <= now_scaled:  # already full
        return GiveBack(state, 0)
    new_tat = max(tat_scaled - cost * token, now_scaled)
    returned = min(cost, (tat_scaled - new_tat) // token)
    tat_us, tat_rem = divmod(new_tat, capacity)
    new_state = replace(
        state,
        used=max(state.used - cost, 0),
        tat_us=tat_us,
        tat_rem=tat_rem,
        tat_scale=capacity,
    )
    return GiveBack(new_state, returned)


@dataclass(frozen=True, slots=True)
class ChargedMore:
    """What charging one charge's excess does: the counter after it, the
    grants that paid part of it, the overage it added (a soft limit) and the
    units a hard limit had no room for (overdraft)."""

    state: CounterState
    draws: tuple[tuple[str, int], ...] = ()
    overage: int = 0
    overdraft: int = 0


def ruleless(limit: Limit | None, charge: HeldCharge) -> bool:
    """Whether ``charge`` has no rule to be charged more by: its limit was
    deleted (None), or redefined as a bucket (a window's charge) or as a
    window (a bucket's) since it was held."""
    return limit is None or (charge.window_end_us == NO_WINDOW) != (
        limit.algorithm == "token_bucket"
    )


def charge_more(
    limit: Limit | None,
    charge: HeldCharge,
    extra: int,
    state: CounterState,
    now_us: int,
    *,
    maximum: int,
    granted: int = 0,
    pot: Pot | None = None,
) -> ChargedMore:
    """Charge ``extra`` units beyond ``charge.cost`` to its counter, whether
    they fit or not (see the module's rules). ``maximum`` is the subject's
    own at the event (the stored decision's), ``granted`` what grants paid of
    the window so far and ``pot`` its grants. A charge with no rule to
    charge by (`ruleless`) changes nothing here (the caller adds a window's
    excess to its counter; the result still records the usage)."""
    if extra <= 0 or ruleless(limit, charge):
        return ChargedMore(state)
    assert limit is not None
    bucket = charge.window_end_us == NO_WINDOW
    hard = limit.enforcement == "hard"
    if bucket:
        taken, available = take_anyway(limit, state, extra, now_us)
        return ChargedMore(taken, overdraft=max(extra - available, 0) if hard else 0)
    fit = fit_window(maximum, state.used, granted, extra, pot or Pot([]), now_us, soft=True)
    beyond = fit.overage_after - fit.overage_before
    return ChargedMore(
        replace(state, used=state.used + extra),
        fit.draws,
        overage=beyond if limit.enforcement == "soft" else 0,
        overdraft=beyond if hard else 0,
    )


def committed_money(
    charges: Sequence[ChargeDecision],
    kept: Sequence[int],
    prices: Mapping[str, PriceHistory],
    currencies: Mapping[str, str],
    at_us: int,
) -> list[int]:
    """What a reservation's money becomes when each of its usage charges
    keeps ``kept[i]`` of its reserved units (spend charges' entries ignored):
    per charge, a priced usage charge's amount, a spend charge's cost, and
    for any other charge its cost as reserved.

    The kept units are the first of the reserved ones: their positions in
    the window are those the reserve priced (``used - cost`` before it), at
    the price in force at ``at_us`` (`tiered_amount`). A spend charge
    (``currencies``: a spend limit's currency) costs the sum of its
    subject's kept amounts in its currency. `InvalidInput` when pricing the
    reserved units again does not give what the reserve charged (a price
    set since with an earlier ``effective_from``): the money cannot be
    split exactly."""
    own = [i for i, charge in enumerate(charges) if charge.limit not in currencies]
    before = [charges[i].used - charges[i].cost for i in own]
    held = priced_charges(
        [(charges[i].subject, charges[i].limit, charges[i].cost) for i in own],
        prices,
        at_us,
        before,
    )
    reserved = {own[p.index]: (p.currency, p.amount) for p in held}
    if any(charges[i].price != reserved.get(i) for i in own):
        raise InvalidInput(
            "actual",
            "its price changed since it was reserved (a price set since, in force at "
            "its time): the money cannot be split; commit it in full or cancel it",
        )
    found = [charge.cost for charge in charges]
    totals: dict[tuple[str, str], int] = {}
    for p in priced_charges(
        [(charges[i].subject, charges[i].limit, kept[i]) for i in own], prices, at_us, before
    ):
        index = own[p.index]
        found[index] = p.amount
        totals[(p.subject, p.currency)] = totals.get((p.subject, p.currency), 0) + p.amount
    for index, charge in enumerate(charges):
        currency = currencies.get(charge.limit)
        if currency is not None:
            found[index] = totals.get((charge.subject, currency), 0)
    return found
