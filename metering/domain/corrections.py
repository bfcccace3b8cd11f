"""Corrections: voiding an allowed event after the fact (pure rules).

A void reverses what the event's charges consumed, each in the counter of
its own window, past windows included: a fixed window's ``used`` goes down
by the charge's cost (never below zero: a reset may have cleared it since);
a token bucket gets its tokens back up to its capacity, as a cancelled
reservation does. The grants that paid for a charge are given back to the
window (its own usage is ``used`` less its draws, so the draws go down with
it) and, when still active, to the grant itself; an expired grant's amount
stays gone. Charges that consumed nothing (a shadow limit's would-deny) are
left alone. The event's result stays in the ledger; the correction is a
record of its own that references it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from metering.domain.bounds import shown
from metering.domain.decisions import ChargeDecision
from metering.domain.limits import Limit
from metering.domain.reservations import HeldCharge, give_back
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


def void_charge(
    limit: Limit | None, charge: VoidedCharge, state: CounterState, now_us: int
) -> CounterState:
    """The counter after taking ``charge`` back (see the module's rules)."""
    if charge.key.window_end_us == NO_WINDOW:
        if limit is None or limit.algorithm != "token_bucket":
            return state  # the bucket was deleted or redefined since
        held = HeldCharge(charge.key.subject, charge.key.limit, charge.cost, NO_WINDOW, NO_WINDOW)
        return give_back(limit, held, state, now_us).state
    return replace(state, used=state.used - min(charge.cost, state.used))
