"""The runaway breaker's rule on a frozen stream: a steady subject never
trips; a synthetic burst past the multiple trips a minute after the now
rate first ran past it, not before; a subject younger than a day trips only
under a floor; a release starts the history again; bad factors, floors and
quarantine maximums name their field; a breaker stepped in place charge
after charge, or a steady one's charges at one instant in one run, ends
as `step` leaves it, to the bit."""

from __future__ import annotations

import math
import random

import pytest

from metering.domain.breaker import (
    HISTORY_US,
    LONG_TAU_SECONDS,
    SUSTAIN_US,
    Breaker,
    Stepping,
    breaker_of,
    parse_factor,
    parse_floor,
    quarantine_cap,
    rates_at,
    released,
    runs,
    steady,
    step,
)
from metering.domain.limits import Limit
from metering.errors import InvalidLimit

SECOND_US = 1_000_000
MINUTE_US = 60 * SECOND_US


@pytest.mark.parametrize(("text", "factor"), [("10x", 10), (" 3X ", 3), ("1000x", 1000)])
def test_a_factor_is_a_multiple(text: str, factor: int) -> None:
    assert parse_factor(text) == factor


@pytest.mark.parametrize("text", ["0x", "1x", "x", "abc", "10", 10, "1001x", "2.5x", None])
def test_a_bad_factor_names_the_breaker(text: object) -> None:
    with pytest.raises(InvalidLimit, match="breaker"):
        parse_factor(text)


@pytest.mark.parametrize("value", [0, -1, "abc", "nan", "inf", True, None, 1e13])
def test_a_bad_floor_names_it(value: object) -> None:
    with pytest.raises(InvalidLimit, match="breaker_floor"):
        parse_floor(value)


def test_a_floor_is_a_rate() -> None:
    assert parse_floor("0.5") == 0.5 and parse_floor(2) == 2.0


def test_the_quarantine_maximum_defaults_to_the_maximum_over_the_factor() -> None:
    assert quarantine_cap(1000, 10, None) == 100
    assert quarantine_cap(5, 10, None) == 1
    assert quarantine_cap(1000, 10, 5000) == 1000  # never more than the maximum
    for bad in (0, -3, True, "5"):
        with pytest.raises(InvalidLimit, match="quarantine_max"):
            quarantine_cap(1000, 10, bad)  # type: ignore[arg-type]


def test_the_baseline_decays_over_a_day() -> None:
    first, _ = step(None, 86_400, 0, factor=10)
    assert first.long_rate == pytest.approx(1.0) and first.since_us == 0
    _, baseline = rates_at(first, LONG_TAU_SECONDS * SECOND_US)
    assert baseline == pytest.approx(1 / math.e, rel=1e-9)


def _run(
    breaker: Breaker | None,
    seconds: int,
    per_second: int,
    start_us: int,
    floor: float | None = None,
) -> tuple[Breaker | None, int | None]:
    """A charge of ``per_second`` units each second for ``seconds``: the
    breaker after them, and the instant it tripped (None: never)."""
    tripped = None
    for n in range(seconds):
        now = start_us + n * SECOND_US
        breaker, trips = step(breaker, per_second, now, factor=10, floor=floor)
        if trips and tripped is None:
            tripped = now
    return breaker, tripped


def test_a_steady_subject_never_trips_and_a_burst_does_after_a_minute() -> None:
    steady, tripped = _run(None, 2 * 86_400, 1, 0)  # a unit a second, two days
    assert tripped is None and steady is not None
    assert steady.long_rate == pytest.approx(1 - math.exp(-2), rel=0.01)
    start = 2 * 86_400 * SECOND_US
    breaker, first_over, tripped = steady, None, None
    for n in range(600):  # 100 a second
        now = start + n * SECOND_US
        breaker, trips = step(breaker, 100, now, factor=10)
        if first_over is None and breaker.over_since_us is not None:
            first_over = breaker.over_since_us
        if trips:
            tripped = now
            break
    # The now rate ran past 10 x the baseline some seconds in; the breaker
    # tripped a minute later, not before.
    assert first_over is not None and first_over > start
    assert tripped is not None and tripped - first_over == SUSTAIN_US
    assert breaker.quarantined_at_us == tripped


def test_a_spike_shorter_than_a_minute_past_the_multiple_does_not_trip() -> None:
    steady, _ = _run(None, 2 * 86_400, 1, 0)
    start = 2 * 86_400 * SECOND_US
    # Ten seconds at 100 a second: the now rate (a minute's) is past 10 x the
    # baseline, and back under it within the minute.
    spiked, tripped = _run(steady, 10, 100, start)
    assert tripped is None and spiked is not None and spiked.over_since_us is not None
    calm, tripped = _run(spiked, 600, 1, start + 10 * SECOND_US)
    assert tripped is None and calm is not None and calm.over_since_us is None


def test_lumps_a_minute_or_more_apart_never_trip() -> None:
    # 600 units every 10 minutes: each lump is past 10 x the baseline, and
    # the now rate falls back under it long before the next.
    breaker, tripped = None, None
    for n in range(3 * 24 * 6):
        breaker, trips = step(breaker, 600, n * 10 * MINUTE_US, factor=10, floor=0.01)
        tripped = tripped or trips
    assert not tripped and breaker is not None and breaker.over_since_us is not None


def test_a_young_subject_trips_only_under_a_floor() -> None:
    young, tripped = _run(None, 3600, 50, 0)  # 50 a second from the first charge
    assert tripped is None and young is not None and young.over_since_us is None
    floored, tripped = _run(None, 3600, 50, 0, floor=0.1)
    # Past 10 x 0.1 a second from the second charge (the first is 50/60 a second).
    assert tripped == SECOND_US + SUSTAIN_US
    assert floored is not None and floored.quarantined_at_us == tripped


def test_a_quarantined_breaker_stays_until_released_and_then_starts_again() -> None:
    _, tripped = _run(None, 120, 50, 0, floor=0.1)
    held, _ = _run(None, 120, 50, 0, floor=0.1)
    assert held is not None and tripped is not None
    later, trips = step(held, 50, 121 * SECOND_US, factor=10, floor=0.1)
    assert not trips and later.quarantined_at_us == tripped
    free = released(later, 200 * SECOND_US)
    assert free.quarantined_at_us is None and free.over_since_us is None
    assert free.short_rate == 0.0 and free.since_us == 200 * SECOND_US
    # Without a floor, the new history is too young to trip for a day.
    again, tripped = _run(free, 600, 1000, 200 * SECOND_US)
    assert tripped is None and again is not None
    assert again.since_us + HISTORY_US > again.rate_at_us


def test_a_limit_takes_a_breaker_on_a_fixed_window_only() -> None:
    limit = Limit("api", maximum=1000, period="1d", breaker=" 10X ", breaker_floor="0.5")
    assert (limit.breaker, limit.breaker_factor, limit.breaker_floor) == ("10x", 10, 0.5)
    assert limit.to_dict()["breaker"] == "10x"
    held = limit.quarantined()
    assert (held.maximum, held.enforcement, held.breaker) == (100, "hard", None)
    soft = Limit("s", maximum=1000, period="1d", enforcement="soft", breaker="10x").quarantined()
    assert soft.enforcement == "hard"
    assert Limit.from_dict(limit.to_dict()) == limit
    for bad in (
        {"algorithm": "token_bucket"},
        {"aggregation": "max"},
    ):
        with pytest.raises(InvalidLimit, match="breaker"):
            Limit("api", maximum=10, period="1m", breaker="10x", **bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidLimit, match="breaker_floor"):
        Limit("api", maximum=10, period="1m", breaker_floor=1.0)
    with pytest.raises(InvalidLimit, match="quarantine_max"):
        Limit("api", maximum=10, period="1m", quarantine_max=1)


def test_a_breaker_stepped_in_place_ends_as_step_leaves_it() -> None:
    # A batch steps each pair's breaker in place (`Stepping`): after every
    # charge, what it reads back and whether it tripped are `step`'s, to the
    # bit, over histories young and old, floors, quarantines, charges at one
    # instant and apart (and a clock that steps back).
    rng = random.Random(7)
    trips = 0
    for _ in range(2_000):
        factor, floor = rng.choice([2, 10, 1000]), rng.choice([None, None, 0.001, 0.5])
        now = rng.randrange(HISTORY_US, 10 * HISTORY_US)
        breaker = None
        if rng.random() < 0.7:
            breaker = Breaker(
                rng.random() * rng.choice([0, 1, 100]),
                rng.random() * rng.choice([0, 0.01, 10]),
                now - rng.randrange(-SECOND_US, HISTORY_US),
                now - rng.randrange(0, 2 * HISTORY_US),
                rng.choice([None, now - rng.randrange(0, 2 * SUSTAIN_US)]),
                rng.choice([None, None, None, now - 5]),
            )
        stepped, in_place = breaker, None
        for _ in range(rng.randrange(1, 40)):
            now += rng.choice([0, 0, 0, SECOND_US, 30 * SECOND_US, -SECOND_US])
            cost = rng.choice([0, 1, 5, 100, 10_000, -3])
            stepped, tripped = step(stepped, cost, now, factor, floor)
            in_place = in_place or Stepping(breaker, now)
            assert in_place.charge(cost, now, factor, floor) == tripped
            assert in_place.breaker() == stepped
            trips += tripped
    assert trips > 10  # (the streams do trip)
    assert breaker_of([0.5, 0.25, 3, 2, None, 1]) == Breaker(0.5, 0.25, 3, 2, None, 1)


def _bits(breaker: Breaker) -> tuple[object, ...]:
    return tuple(v.hex() if isinstance(v, float) else v for v in breaker)


def test_a_steady_breakers_run_ends_as_step_leaves_it() -> None:
    # A batch steps a steady pair's charges (all at its instant) in one run:
    # the same floats as `step` after each, to the bit, and none trips.
    rng = random.Random(11)
    made = 0
    for _ in range(3_000):
        factor, floor = rng.choice([2, 10, 1000]), rng.choice([None, None, 0.001, 0.5])
        now = rng.randrange(HISTORY_US, 10 * HISTORY_US)
        breaker = None
        if rng.random() < 0.8:
            breaker = Breaker(
                rng.random() * rng.choice([0, 1, 100]),
                rng.random() * rng.choice([0, 0.01, 10]),
                now - rng.randrange(-SECOND_US, rng.choice([HISTORY_US, 60 * HISTORY_US])),
                now - rng.randrange(0, 2 * HISTORY_US),
                rng.choice([None, now - rng.randrange(0, 2 * SUSTAIN_US)]),
                rng.choice([None, None, None, now - 5]),
            )
        if not steady(breaker, now):
            continue
        some = [0, 1, 5, 100, 10_000, -3, rng.randrange(1, 10**6)]
        costs = [rng.choice(some) for _ in range(rng.randrange(1, 40))]
        stepped = breaker
        for cost in costs:
            stepped, tripped = step(stepped, cost, now, factor, floor)
            assert not tripped
        assert stepped is not None
        states = {} if breaker is None else {("calls", "s"): breaker}
        ran = runs(states, {("calls", "s"): costs}, now, {"calls": (factor, floor)})
        assert _bits(ran[("calls", "s")]) == _bits(stepped)
        made += 1
    assert made > 1_000


def test_a_run_forgets_rates_as_step_does() -> None:
    now, old = 100 * HISTORY_US, Breaker(5.0, 5.0, 49 * HISTORY_US, 0)  # 51 days idle
    stepped, _ = step(old, 0, now, 10)
    ran = runs({("calls", "s"): old}, {("calls", "s"): [0]}, now, {"calls": (10, None)})
    assert ran[("calls", "s")] == stepped == Breaker(0.0, 0.0, now, 0)


def test_a_breakers_settings_at_their_bounds() -> None:
    assert parse_factor("2x") == 2 and parse_factor("1000X") == 1000
    assert parse_floor(1e12) == 1e12
    assert quarantine_cap(50, 10, 1) == 1 and quarantine_cap(10**16, 10, 10**15) == 10**15
    for bad, field, message in (
        ("1x", "breaker", "give a multiple like '10x', from 2x to 1000x; got '1x'"),
        (None, "breaker", "give a multiple like '10x', from 2x to 1000x; got None"),
    ):
        with pytest.raises(InvalidLimit) as refused:
            parse_factor(bad)
        assert str(refused.value) == f"{field}: {message}"
    with pytest.raises(InvalidLimit) as refused:
        parse_floor(0)
    assert str(refused.value) == (
        "breaker_floor: give a rate in units per second above 0, like 0.5; got 0"
    )
    with pytest.raises(InvalidLimit) as refused:
        quarantine_cap(50, 10, 0)
    assert str(refused.value) == "quarantine_max: give a whole number of units from 1; got 0"


def test_no_breaker_is_steady_and_one_past_the_multiple_for_a_minute_is_not() -> None:
    assert steady(None, 0)
    over = Breaker(1.0, 1.0, 0, 0, 10**12)
    assert steady(over, 10**12 + SUSTAIN_US - 1)
    assert not steady(over, 10**12 + SUSTAIN_US)


def test_rates_decay_from_the_first_microsecond_and_are_forgotten_only_past_fifty_days() -> None:
    breaker = Breaker(3.0, 2.0, 0, 0)
    assert rates_at(breaker, 0) == (3.0, 2.0)
    assert rates_at(breaker, 1) == (
        3.0 * math.exp(-1 / (60 * SECOND_US)),
        2.0 * math.exp(-1 / (LONG_TAU_SECONDS * SECOND_US)),
    )
    assert rates_at(breaker, 50 * HISTORY_US) == (0.0, 2.0 * math.exp(-50))
    assert rates_at(breaker, 50 * HISTORY_US + 1) == (0.0, 0.0)


def test_a_charge_a_microsecond_later_decays_the_rates_and_moves_their_instant() -> None:
    breaker = Breaker(3.0, 2.0, 0, 0)
    stepped, _ = step(breaker, 0, 1, 10)
    assert stepped == Breaker(*rates_at(breaker, 1), 1, 0)
    assert stepped.short_rate < 3.0 and stepped.long_rate < 2.0


def test_a_breaker_stepped_in_place_reads_back_before_any_charge() -> None:
    assert Stepping(None, 7).breaker() == Breaker(0.0, 0.0, 7, 7, None, None)
    held = Breaker(1.5, 0.5, 3, 2, 1, None)
    assert Stepping(held, 9).breaker() == held


def test_a_run_at_exactly_a_day_of_history_is_no_longer_young() -> None:
    # A day after its history began a breaker compares its rates (`step`):
    # one charge past ten times the baseline starts its minute past the multiple.
    now = HISTORY_US
    old = Breaker(0.0, 0.001, now, 0)
    stepped, tripped = step(old, 600, now, 10)
    ran = runs({("calls", "s"): old}, {("calls", "s"): [600]}, now, {"calls": (10, None)})
    assert not tripped and stepped.over_since_us == now
    assert _bits(ran[("calls", "s")]) == _bits(stepped)
    younger = Breaker(0.0, 0.001, now, 1)
    ran = runs({("calls", "s"): younger}, {("calls", "s"): [600]}, now, {"calls": (10, None)})
    assert ran[("calls", "s")].over_since_us is None
