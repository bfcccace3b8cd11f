"""Token buckets (GCRA in exact integers), checked against a Fraction model."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from metering.domain.buckets import evaluate_bucket
from metering.domain.decisions import ChargeInput, EventVerdict, decide_event
from metering.domain.instants import from_us, to_us
from metering.domain.limits import Limit
from metering.domain.state import CounterKey, CounterState

SECOND = 1_000_000
SUBJECT = "client-1"


def bucket(capacity: int = 10, period: str = "10s", name: str = "api") -> Limit:
    return Limit(name, maximum=capacity, period=period, algorithm="token_bucket")


class Client:
    """Calls `decide_event` for one bucket and keeps the state it returns."""

    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.state = CounterState()

    def call(self, now_us: int, cost: int = 1) -> EventVerdict:
        key = CounterKey(self.limit.name, SUBJECT, 0, 0)
        verdict = decide_event([ChargeInput(self.limit, key, self.state, cost)], now_us)
        self.state = verdict.new_states[0]
        return verdict


class ReferenceBucket:
    """The token bucket of the SPEC in exact rationals, written independently.

    It starts full, refills ``capacity / period`` tokens a microsecond, never
    holds more than ``capacity`` and allows a cost iff it holds that many.
    """

    def __init__(self, capacity: int, period_us: int) -> None:
        self.capacity = Fraction(capacity)
        self.rate = Fraction(capacity, period_us)
        self.tokens = Fraction(capacity)
        self.last_us: int | None = None

    def refill(self, now_us: int) -> None:
        if self.last_us is not None:
            assert now_us >= self.last_us
            self.tokens = min(self.capacity, self.tokens + (now_us - self.last_us) * self.rate)
        self.last_us = now_us

    def take(self, now_us: int, cost: int) -> bool:
        self.refill(now_us)
        if cost <= self.tokens:
            self.tokens -= cost
            return True
        return False

    def retry_at_us(self, now_us: int, cost: int) -> int | None:
        """The first whole microsecond at which ``cost`` tokens are there."""
        if cost > self.capacity:
            return None
        missing = cost - self.tokens
        return now_us + max(math.ceil(missing / self.rate), 0)

    def full_at_us(self, now_us: int) -> int:
        return now_us + math.ceil((self.capacity - self.tokens) / self.rate)


def test_reference_bucket_is_exact_with_a_fractional_token_interval() -> None:
    model = ReferenceBucket(3, 10 * SECOND)
    for _ in range(3):
        assert model.take(0, 1)
    assert not model.take(0, 1)
    assert model.tokens == 0
    model.refill(10 * SECOND)
    assert model.tokens == 3


# --------------------------------------------------------------------------- burst and refill


def test_a_full_bucket_allows_capacity_at_once_and_denies_one_more(now_us: int) -> None:
    client = Client(bucket(capacity=10, period="10s"))
    for n in range(1, 11):
        verdict = client.call(now_us)
        assert verdict.outcome == "allowed", n
        assert verdict.charges[0].remaining == 10 - n
        assert verdict.charges[0].used == n
    eleventh = client.call(now_us)
    assert eleventh.outcome == "denied"
    assert eleventh.denied_by == ("api",)
    assert eleventh.charges[0].remaining == 0
    assert eleventh.new_states[0].denied_count == 1


def test_four_seconds_after_emptying_exactly_four_more_are_allowed(now_us: int) -> None:
    client = Client(bucket(capacity=10, period="10s"))
    for _ in range(10):
        client.call(now_us)
    later = now_us + 4 * SECOND
    outcomes = [client.call(later).outcome for _ in range(5)]
    assert outcomes == ["allowed"] * 4 + ["denied"]


def test_one_microsecond_before_a_token_is_due_it_is_not_there(now_us: int) -> None:
    client = Client(bucket(capacity=10, period="10s"))
    for _ in range(10):
        client.call(now_us)
    assert client.call(now_us + SECOND - 1).outcome == "denied"
    assert client.call(now_us + SECOND).outcome == "allowed"


def test_a_client_faster_than_the_refill_gets_exactly_the_refill(now_us: int) -> None:
    limit = bucket(capacity=10, period="10s")  # 1 token a second
    client = Client(limit)
    step = 300_000  # a call every 0.3 s
    times = [now_us + k * step for k in range(100 * SECOND // step + 1) if k * step <= 100 * SECOND]
    allowed = sum(client.call(t).outcome == "allowed" for t in times)

    elapsed = Fraction(times[-1] - times[0], SECOND)  # 99.9 s
    refilled = elapsed * Fraction(limit.maximum, limit.period_seconds)
    assert allowed == limit.maximum + math.floor(refilled)
    assert allowed == 109


def test_a_fractional_token_interval_loses_no_token_to_rounding(now_us: int) -> None:
    # Capacity 3 over 10 s: a token every 3.333... s. At 100 s exactly 30
    # tokens have come back; an interval rounded up to 3_333_334 us would
    # deliver the 30th token 20 us too late, one rounded down too early.
    limit = bucket(capacity=3, period="10s")
    client = Client(limit)
    step = SECOND // 2
    times = [now_us + k * step for k in range(201)]  # 0 s .. 100 s inclusive
    allowed = sum(client.call(t).outcome == "allowed" for t in times)
    refilled = Fraction(100) * Fraction(3, 10)
    assert refilled == 30
    assert allowed == 3 + 30
    assert client.call(times[-1]).outcome == "denied"


def test_a_fractional_token_interval_matches_the_reference_over_many_calls(now_us: int) -> None:
    limit = bucket(capacity=3, period="10s")
    client = Client(limit)
    model = ReferenceBucket(3, 10 * SECOND)
    steps = [700_000, 1_100_000, 3_333_333, 1, 2_500_000, 333_334, 0, 9_999_999]
    costs = [1, 2, 1, 3, 1, 1, 2, 1, 4]
    now = now_us
    allowed_count = 0
    for i in range(1500):
        now += steps[i % len(steps)]
        cost = costs[i % len(costs)]
        verdict = client.call(now, cost)
        expected = model.take(now, cost)
        assert (verdict.outcome == "allowed") == expected, i
        assert verdict.charges[0].remaining == math.floor(model.tokens), i
        allowed_count += expected
    assert 0 < allowed_count < 1500


# --------------------------------------------------------------------------- retry_at and resets_at


def test_retry_at_is_the_exact_microsecond_the_cost_fits(now_us: int) -> None:
    limit = bucket(capacity=3, period="10s")
    client = Client(limit)
    for _ in range(3):
        client.call(now_us)
    denied = client.call(now_us + 1000, cost=2)
    retry_at = denied.charges[0].retry_at
    assert retry_at is not None
    # 2 tokens take 6.666... s from empty: the first whole microsecond after.
    assert to_us(retry_at) == now_us + math.ceil(Fraction(20 * SECOND, 3))
    assert to_us(retry_at) == now_us + 6_666_667
    assert evaluate_bucket(limit, client.state, 2, to_us(retry_at) - 1).fits is False
    assert evaluate_bucket(limit, client.state, 2, to_us(retry_at)).fits is True


def test_retry_at_matches_the_reference_after_a_partial_refill(now_us: int) -> None:
    limit = bucket(capacity=7, period="1m")
    client = Client(limit)
    model = ReferenceBucket(7, 60 * SECOND)
    for t, cost in [(0, 5), (1_234_567, 2), (20_000_001, 3), (20_000_002, 4)]:
        verdict = client.call(now_us + t, cost)
        fits = model.take(now_us + t, cost)
        assert (verdict.outcome == "allowed") == fits
    assert verdict.outcome == "denied"
    assert verdict.charges[0].retry_at == from_us(model.retry_at_us(now_us + 20_000_002, 4))  # type: ignore[arg-type]


def test_resets_at_is_when_the_bucket_is_full_again(now_us: int) -> None:
    client = Client(bucket(capacity=10, period="10s"))
    verdict = client.call(now_us, cost=4)
    assert verdict.charges[0].resets_at == from_us(now_us + 4 * SECOND)
    full = client.call(now_us, cost=6)
    assert full.charges[0].resets_at == from_us(now_us + 10 * SECOND)
    assert full.charges[0].window_start is None


def test_resets_at_rounds_a_fractional_instant_up_to_the_next_microsecond(now_us: int) -> None:
    limit = bucket(capacity=3, period="10s")
    client = Client(limit)
    verdict = client.call(now_us)
    model = ReferenceBucket(3, 10 * SECOND)
    model.take(now_us, 1)
    assert to_us(verdict.charges[0].resets_at) == model.full_at_us(now_us) == now_us + 3_333_334


def test_a_denied_charge_reports_when_the_bucket_is_full_without_consuming(now_us: int) -> None:
    client = Client(bucket(capacity=10, period="10s"))
    client.call(now_us, cost=8)
    denied = client.call(now_us + 2 * SECOND, cost=5)
    assert denied.outcome == "denied"
    assert denied.charges[0].resets_at == from_us(now_us + 8 * SECOND)
    assert denied.charges[0].remaining == 4
    assert denied.charges[0].used == 6
    assert client.call(now_us + 2 * SECOND, cost=4).outcome == "allowed"


def test_a_cost_larger_than_capacity_is_denied_and_never_retried(now_us: int) -> None:
    client = Client(bucket(capacity=10, period="10s"))
    verdict = client.call(now_us, cost=11)
    assert verdict.outcome == "denied"
    assert verdict.charges[0].retry_at is None
    assert verdict.new_states[0].tat_us is None
    assert verdict.new_states[0].denied_cost == 11
    # The bucket is still full.
    assert client.call(now_us, cost=10).outcome == "allowed"


def test_a_denial_does_not_move_the_arrival_time(now_us: int) -> None:
    client = Client(bucket(capacity=2, period="10s"))
    client.call(now_us, cost=2)
    before = client.state
    client.call(now_us + SECOND, cost=1)
    after = client.state
    assert (after.tat_us, after.tat_rem, after.tat_scale) == (
        before.tat_us,
        before.tat_rem,
        before.tat_scale,
    )
    assert after.used == before.used
    assert after.denied_count == 1
    assert after.first_denied_at_us == now_us + SECOND


# --------------------------------------------------------------------------- capacity bounds


def test_tokens_never_exceed_capacity_after_a_long_idle(now_us: int) -> None:
    client = Client(bucket(capacity=10, period="10s"))
    client.call(now_us)
    later = now_us + 3600 * SECOND
    first = client.call(later)
    assert first.charges[0].remaining == 9
    outcomes = [client.call(later).outcome for _ in range(10)]
    assert outcomes == ["allowed"] * 9 + ["denied"]


def test_an_idle_bucket_reports_full_now(now_us: int) -> None:
    limit = bucket(capacity=10, period="10s")
    client = Client(limit)
    client.call(now_us, cost=10)
    later = now_us + 3600 * SECOND
    ev = evaluate_bucket(limit, client.state, 1, later)
    assert ev.remaining_before == 10
    assert ev.used_before == 0
    assert ev.resets_at_before_us == later


def test_a_bucket_written_under_another_capacity_keeps_the_instant_it_is_full(
    now_us: int,
) -> None:
    small = bucket(capacity=10, period="10s")
    client = Client(small)
    client.call(now_us, cost=5)  # full again at now + 5 s
    state = client.state
    for capacity in (20, 10, 7, 3):
        bigger = bucket(capacity=capacity, period="10s")
        ev = evaluate_bucket(bigger, state, 1, now_us)
        assert ev.resets_at_before_us == now_us + 5 * SECOND, capacity
    # Under capacity 20 (2 tokens a second) 5 s of debt is 10 tokens.
    ev = evaluate_bucket(bucket(capacity=20, period="10s"), state, 1, now_us)
    assert ev.remaining_before == 10


def test_a_fractional_arrival_time_survives_a_capacity_change(now_us: int) -> None:
    client = Client(bucket(capacity=3, period="10s"))
    client.call(now_us)  # full again at now + 3_333_333.33... us
    full_at = now_us + math.ceil(Fraction(10 * SECOND, 3))
    assert full_at == now_us + 3_333_334
    for capacity in (2, 3, 4, 5, 6, 7, 10, 11):
        ev = evaluate_bucket(bucket(capacity=capacity, period="10s"), client.state, 1, now_us)
        assert ev.resets_at_before_us == full_at, capacity
        # Not full one microsecond before that instant, whatever the capacity.
        before = evaluate_bucket(
            bucket(capacity=capacity, period="10s"), client.state, 1, full_at - 1
        )
        assert before.remaining_before < capacity, capacity


# --------------------------------------------------------------------------- property


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=12),
    period_s=st.sampled_from([1, 3, 7, 10, 60, 3600]),
    calls=st.lists(
        st.tuples(
            st.one_of(
                st.integers(min_value=0, max_value=3),
                st.integers(min_value=0, max_value=5 * SECOND),
                st.integers(min_value=0, max_value=4000 * SECOND),
            ),
            st.integers(min_value=1, max_value=14),
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_gcra_equals_the_fraction_reference_model(
    capacity: int, period_s: int, calls: list[tuple[int, int]]
) -> None:
    limit = bucket(capacity=capacity, period=f"{period_s}s")
    client = Client(limit)
    model = ReferenceBucket(capacity, period_s * SECOND)
    now = 1_800_000_000 * SECOND
    for step, cost in calls:
        now += step
        verdict = client.call(now, cost)
        fits = model.take(now, cost)
        (charge,) = verdict.charges
        assert charge.allowed == fits
        assert verdict.outcome == ("allowed" if fits else "denied")
        assert charge.remaining == math.floor(model.tokens)
        assert 0 <= charge.remaining <= capacity
        assert to_us(charge.resets_at) == model.full_at_us(now)
        if fits:
            assert charge.retry_at is None
        else:
            expected_retry = model.retry_at_us(now, cost)
            assert (to_us(charge.retry_at) if charge.retry_at else None) == expected_retry


def test_with_used_changes_the_usage_only() -> None:
    state = CounterState(2, 3, 4, 5, tat_us=6, tat_rem=7, tat_scale=8)
    assert state.with_used(9) == CounterState(9, 3, 4, 5, tat_us=6, tat_rem=7, tat_scale=8)
