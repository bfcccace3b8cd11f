"""Corrections: voiding an allowed event after the fact (pure rules; docs/allowances.md).

A void reverses each charge's consumption in the counter of its own window, past ones too:
a fixed window's ``used`` goes down by the cost (never below zero), a token bucket gets its
tokens back up to its capacity, and the grants that paid are given back (to the grant only
while it is active). A gauge's level is recomputed from the reports left (`gauge_after`:
their peak, or the latest by event time; 0 when none). Charges that consumed nothing are
left alone; the result stays, the correction is a record of its own. Usage goes back at
most once: a charge whose counter a reset cleared after the event is skipped
(`Reset.cleared`), and so is one a cancel of its reservation gave back (`still_charged`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from metering.domain.bounds import shown
from metering.domain.decisions import ChargeDecision
from metering.domain.limits import Limit
from metering.domain.reservations import GiveBack, HeldCharge, can_give_back, give_back
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.errors import InvalidInput

DEFAULT_HORIZON_SECONDS: Final = 35 * 86_400
MAX_REASON_CHARS: Final = 500
VOIDABLE: Final = ("allowed", "overage")


def validate_reason(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("reason", f"must be a non-empty string, got {shown(reason)}")
    if len(reason) > MAX_REASON_CHARS or not reason.isprintable():
        raise InvalidInput("reason", f"must be at most {MAX_REASON_CHARS} printable characters")
    return reason


@dataclass(frozen=True, slots=True)
class VoidedCharge:
    """One charge a void reverses: its counter, cost, and the grants that paid."""

    key: CounterKey
    cost: int
    grants: tuple[tuple[str, int], ...]

    def to_row(self, restored: Sequence[tuple[str, int]]) -> list[Any]:
        return [
            self.key.subject,
            self.key.limit,
            self.cost,
            self.key.window_start_us,
            [list(draw) for draw in restored],
        ]


def voided_charges(outcome: str, rows: Sequence[Sequence[Any]]) -> list[VoidedCharge]:
    """The charges of a stored result that consumed something (empty: nothing to void)."""
    if outcome not in VOIDABLE:
        return []
    found = []
    for row in rows:
        charge = ChargeDecision.from_row(row)
        if charge.outcome not in VOIDABLE:
            continue  # a shadow limit's would-deny consumed nothing
        start = charge.window_start_us
        bucket = start is None
        key = CounterKey(
            charge.limit,
            charge.subject,
            start if start is not None else NO_WINDOW,
            NO_WINDOW if bucket else charge.resets_at_us,
        )
        found.append(VoidedCharge(key, charge.cost, charge.grants))
    return found


def _held(charge: VoidedCharge) -> HeldCharge:
    key = charge.key
    return HeldCharge(key.subject, key.limit, charge.cost, key.window_start_us, key.window_end_us)


def can_take_back(
    limit: Limit | None, charge: VoidedCharge, now_us: int, *, past_windows: bool
) -> bool:
    """Whether ``charge``'s counter takes anything back: always for a void
    (``past_windows``: a past window's usage goes down too); for a cancel or
    a commit of less only while it still can (`can_give_back`)."""
    return past_windows or can_give_back(limit, _held(charge), now_us)


# A gauge's report in the ledger: (occurred_at_us, decided_at_us, event id, value).
Report = tuple[int, int, str, int]


def gauge_reports(key: CounterKey, found: Sequence[tuple[str, int, int, str]]) -> list[Report]:
    """The reports on ``key``'s window among ``found`` results (event id,
    occurred_at_us, decided_at_us, charge rows as JSON text) whose charge
    on it was allowed; the caller leaves voided and reset results out."""
    reports: list[Report] = []
    for event_id, occurred_at_us, decided_at_us, rows in found:
        for row in json.loads(rows):
            charge = ChargeDecision.from_row(row)
            if (
                charge.limit == key.limit
                and charge.subject == key.subject
                and charge.window_start_us == key.window_start_us
                and charge.outcome in VOIDABLE
            ):
                reports.append((occurred_at_us, decided_at_us, event_id, charge.cost))
    return reports


def gauge_after(aggregation: str, state: CounterState, reports: Sequence[Report]) -> CounterState:
    """A gauge counter's state once a void left only ``reports`` in its window:
    their peak (``max``) or the latest one's value and instant (``latest``),
    else 0; denials stay as they were."""
    if not reports:
        return replace(state, used=0, tat_us=None)
    if aggregation == "max":
        return replace(state, used=max(report[3] for report in reports), tat_us=None)
    occurred_at_us, _, _, value = max(reports)
    return replace(state, used=value, tat_us=occurred_at_us)


def take_back(
    limit: Limit | None,
    charge: VoidedCharge,
    state: CounterState,
    now_us: int,
    *,
    past_windows: bool,
    level: CounterState | None = None,
) -> GiveBack:
    """The counter after giving ``charge.cost`` back, and the units it took.

    A bucket gets its tokens back as of now (`give_back`), unless it was
    deleted or redefined as a window since. A window gets the cost back
    down to zero while it is current, and with ``past_windows`` (a void)
    after it ended too. A window counted as a gauge's when the event was
    decided takes ``level`` (`gauge_after`), and the units it went down by,
    but never goes down by more than the charge's cost (a gauge's own level
    is never below that).
    """
    if level is not None:
        level = replace(level, used=max(level.used, state.used - charge.cost))
        return GiveBack(level, max(state.used - level.used, 0))
    if past_windows and charge.key.window_end_us != NO_WINDOW:
        returned = min(charge.cost, state.used)
        return GiveBack(replace(state, used=state.used - returned), returned)
    if limit is None:  # deleted since: nothing to return to
        return GiveBack(state, 0)
    return give_back(limit, _held(charge), state, now_us)


def taken_back(
    limits: Mapping[str, Limit],
    charges: Sequence[VoidedCharge],
    states: Mapping[CounterKey, CounterState],
    now_us: int,
    *,
    past_windows: bool,
    levels: Mapping[CounterKey, CounterState] | None = None,
) -> tuple[dict[CounterKey, CounterState], list[int]]:
    """The counters ``charges`` (of one event) change, after each gave its
    cost back in turn (`take_back`; two charges may share a counter), and
    the units each returned. A counter not in ``states`` starts empty;
    a gauge's takes its level in ``levels`` (`gauge_after`)."""
    changed: dict[CounterKey, CounterState] = {}
    returned: list[int] = []
    for charge in charges:
        state = changed.get(charge.key, states.get(charge.key, CounterState()))
        outcome = take_back(
            limits.get(charge.key.limit),
            charge,
            state,
            now_us,
            past_windows=past_windows,
            level=levels.get(charge.key) if levels else None,
        )
        changed[charge.key] = outcome.state
        returned.append(outcome.returned)
    return changed, returned


@dataclass(frozen=True, slots=True)
class Reset:
    """An operator's reset written after an event's result (storage orders
    the two by which was written first, not by their clocks): the counter
    it cleared, and when.

    ``window_start_us`` None (a reset recorded by an earlier version): every
    window of its subject and limit still open at ``at_us``, and a subject
    or limit None stands for every one.
    """

    subject: str | None
    limit: str | None
    at_us: int
    window_start_us: int | None = None

    def cleared(self, key: CounterKey) -> bool:
        """Whether this reset cleared what the event put on ``key``'s counter."""
        if self.subject is not None and self.subject != key.subject:
            return False
        if self.limit is not None and self.limit != key.limit:
            return False
        if self.window_start_us is not None:
            return self.window_start_us == key.window_start_us
        return key.window_end_us == NO_WINDOW or key.window_end_us > self.at_us


def not_reset(charges: Sequence[VoidedCharge], resets: Sequence[Reset]) -> list[VoidedCharge]:
    """The charges no reset written after their event cleared."""
    return [c for c in charges if not any(r.cleared(c.key) for r in resets)]


CounterOf = tuple[str, str, int]  # subject, limit, window start: a counter, as stored
GivenBack = tuple[str, str, int, int]  # a counter, and the units of a charge that went back to it


def counter_of(key: CounterKey) -> CounterOf:
    return (key.subject, key.limit, key.window_start_us)


def split_back(charge: VoidedCharge, units: int) -> tuple[VoidedCharge, VoidedCharge]:
    """``charge`` as (the ``units`` that go back, the rest that stays).

    A charge drew on its window's own allowance first, then on grants in
    order; what goes back is the last drawn first: grants from the last
    one back, then the own allowance.
    """
    units = max(0, min(units, charge.cost))
    back: list[tuple[str, int]] = []
    kept = list(charge.grants)
    owed = units
    for index in range(len(kept) - 1, -1, -1):
        if owed == 0:
            break
        grant_id, amount = kept[index]
        taken = min(amount, owed)
        back.insert(0, (grant_id, taken))
        kept[index] = (grant_id, amount - taken)
        owed -= taken
    stays = tuple((grant_id, amount) for grant_id, amount in kept if amount > 0)
    return (
        replace(charge, cost=units, grants=tuple(back)),
        replace(charge, cost=charge.cost - units, grants=stays),
    )


def split_held(
    charges: Sequence[VoidedCharge], held: Sequence[HeldCharge]
) -> tuple[list[VoidedCharge], list[VoidedCharge]]:
    """``charges`` whose counter a reservation's ``held`` charges still name,
    and those a reset dropped from the hold."""
    holds = {counter_of(charge.key) for charge in held}
    kept: list[VoidedCharge] = []
    dropped: list[VoidedCharge] = []
    for charge in charges:
        (kept if counter_of(charge.key) in holds else dropped).append(charge)
    return kept, dropped


def still_charged(
    charges: Sequence[VoidedCharge], given_back: Sequence[GivenBack]
) -> list[VoidedCharge]:
    """What of the charges a cancel or a settled commit did not give back already."""
    returned = {(subject, limit, start): units for subject, limit, start, units in given_back}
    left = []
    for charge in charges:
        stays = split_back(charge, returned.get(counter_of(charge.key), 0))[1]
        if stays.cost > 0:
            left.append(stays)
    return left
