"""`metering.domain.dimension_history`: the dimensions in force for a result."""

from __future__ import annotations

from metering.domain.dimension_history import (
    Era,
    counted_by,
    ever_dimensioned,
    ever_gauge,
    ever_seats,
    holds_a_sum,
    in_force,
    rolled_up_under,
)

SEED = Era(10, 500, ("route",), seeded=True)
ADDED = Era(14, 900, ("route", "plan"))
REMOVED = Era(20, 1_000, ())


def test_a_result_has_the_last_era_at_or_below_its_tick() -> None:
    history = [SEED, ADDED, REMOVED]
    assert in_force(history, 10, 0) == ("route",)
    assert in_force(history, 13, 10**9) == ("route",)  # whatever its clock said
    assert in_force(history, 14, 0) == ("route", "plan")
    assert in_force(history, 19, 0) == ("route", "plan")
    assert in_force(history, 20, 0) == ()
    assert in_force(history, 99, 0) == ()


def test_before_the_history_a_seed_says_only_what_was_decided_since_its_definition() -> None:
    assert in_force([SEED, ADDED], 9, 500) == ("route",)
    assert in_force([SEED, ADDED], 9, 499) is None
    assert in_force([ADDED], 9, 10**9) is None  # not seeded: its limit was not defined
    assert in_force([], 9, 0) is None


def test_a_give_back_takes_from_the_oldest_rows_known_when_unknown() -> None:
    assert rolled_up_under([SEED, ADDED], 9, 0) == ("route",)
    assert rolled_up_under([SEED, ADDED], 15, 0) == ("route", "plan")
    assert rolled_up_under([], 9, 0) == ()


def test_a_history_has_dimensions_when_an_era_has_some() -> None:
    assert ever_dimensioned([REMOVED, SEED])
    assert not ever_dimensioned([REMOVED])
    assert not ever_dimensioned([])


def test_a_history_was_a_seat_limits_or_a_gauges_when_an_era_was() -> None:
    seats, gauge = Era(30, 1_100, (), distinct="user"), Era(31, 1_200, (), aggregation="max")
    assert ever_seats([REMOVED, seats]) and not ever_seats([REMOVED, gauge])
    assert ever_gauge([seats, gauge]) and not ever_gauge(
        [seats, Era(32, 1_300, (), aggregation="sum")]
    )
    assert not ever_gauge([REMOVED])  # not known: not a gauge


def test_a_window_holds_a_sum_unless_a_gauge_counted_in_it() -> None:
    gauge, summed = Era(31, 1_200, (), aggregation="max"), Era(32, 1_300, (), aggregation="sum")
    latest = Era(33, 1_400, (), aggregation="latest")
    assert holds_a_sum([], 0) and holds_a_sum([REMOVED, summed], 0)  # never a gauge
    assert holds_a_sum([REMOVED], 0)  # not known: not a gauge
    assert not holds_a_sum([REMOVED, gauge], 5_000)  # a gauge now
    # A sum since 1,300: a window not over then (ending later), not one over.
    assert holds_a_sum([gauge, summed], 1_301) and not holds_a_sum([gauge, summed], 1_300)
    assert not holds_a_sum([gauge, summed, latest], 5_000)
    assert holds_a_sum([gauge, latest, summed, REMOVED], 1_301)  # the last gauge's successor
    assert not holds_a_sum([gauge, latest, Era(34, 1_500, ()), summed], 1_500)


def test_a_result_was_counted_by_its_eras_aggregation_else_by_todays() -> None:
    gauge, summed = Era(30, 1_100, (), aggregation="max"), Era(40, 1_200, (), aggregation="sum")
    history = [REMOVED, gauge, summed]
    assert counted_by(history, 35, 0, "sum") == "max"  # a gauge's then, a sum now
    assert counted_by(history, 45, 0, "max") == "sum"
    assert counted_by(history, 25, 0, "latest") == "latest"  # its era's not known
    assert counted_by(history, None, 0, "sum") == "sum"  # no result
    assert counted_by([], 35, 0, None) is None  # the limit gone, no history


def test_before_the_history_a_seeded_era_says_how_what_was_decided_since_was_counted() -> None:
    seeded = Era(10, 500, (), seeded=True, aggregation="max")
    assert counted_by([seeded], 5, 500, "sum") == "max"  # decided since its definition
    assert counted_by([seeded], 5, 499, "sum") == "sum"  # before it: not known
    assert counted_by([Era(10, 500, (), seeded=True)], 5, 600, "latest") == "latest"
