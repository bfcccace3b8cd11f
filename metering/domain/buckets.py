"""Token buckets as GCRA, in exact integer arithmetic.

Capacity ``C`` (the limit's maximum) refills over period ``P`` microseconds,
so one token is ``P / C`` microseconds. The bucket is described by its
theoretical arrival time ``tat``: the instant it will be full again. Tokens
available at ``now`` are ``C - (tat - now) * C / P`` (never above ``C``).

To stay exact, every instant is multiplied by ``C`` ("scaled"): then a
token is exactly ``P`` scaled units and nothing is ever rounded, so a client
calling faster than the refill rate loses nothing.
"""

from __future__ import annotations

from dataclasses import replace

from metering.domain.limits import Limit
from metering.domain.state import CounterState, Evaluation


def _scaled_tat(state: CounterState, capacity: int, now_us: int) -> int:
    """The state's arrival time scaled by ``capacity``, never before now."""
    now_scaled = now_us * capacity
    if state.tat_us is None:
        return now_scaled
    # A bucket written under another capacity keeps the instant it is full.
    exact = state.tat_us * state.tat_scale + state.tat_rem
    scaled = -(-exact * capacity // state.tat_scale)
    return max(scaled, now_scaled)


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def evaluate_bucket(limit: Limit, state: CounterState, cost: int, now_us: int) -> Evaluation:
    capacity = limit.maximum
    token = limit.period_seconds * 1_000_000  # one token in scaled units
    now_scaled = now_us * capacity
    base = _scaled_tat(state, capacity, now_us)
    # Tokens in debt, in scaled units: (base - now) must leave room for cost.
    debt = base - now_scaled
    available = max((capacity * token - debt) // token, 0)
    fits = cost <= available
    new_tat = base + cost * token
    applied_tat = new_tat if fits else base
    tat_us, tat_rem = divmod(applied_tat, capacity)
    applied = replace(
        state, used=state.used + cost, tat_us=tat_us, tat_rem=tat_rem, tat_scale=capacity
    )
    retry_at_us: int | None = None
    if not fits and cost <= capacity:
        # Earliest t with (base - t*C) + cost*token <= C*token.
        retry_at_us = _ceil_div(base + cost * token - capacity * token, capacity)
    return Evaluation(
        fits=fits,
        applied=applied,
        denied=state.with_denial(cost, now_us),
        used_before=capacity - available,
        used_after=capacity - available + cost,
        remaining_before=available,
        remaining_after=available - cost if fits else available,
        resets_at_us=_ceil_div(applied_tat, capacity),
        resets_at_before_us=_ceil_div(base, capacity),
        retry_at_us=retry_at_us,
        overage_after=0,
    )


def take_anyway(
    limit: Limit, state: CounterState, cost: int, now_us: int
) -> tuple[CounterState, int]:
    """Take ``cost`` tokens whether or not the bucket holds them: usage that
    has already happened (a commit of more than was reserved). Returns the
    new state and the tokens that were available; what is taken beyond them
    is debt, and the bucket refuses every charge until it has refilled past it."""
    capacity = limit.maximum
    token = limit.period_seconds * 1_000_000
    base = _scaled_tat(state, capacity, now_us)
    available = max((capacity * token - (base - now_us * capacity)) // token, 0)
    tat_us, tat_rem = divmod(base + cost * token, capacity)
    taken = replace(
        state, used=state.used + cost, tat_us=tat_us, tat_rem=tat_rem, tat_scale=capacity
    )
    return taken, available
