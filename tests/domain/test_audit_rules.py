"""`metering.domain.audit`: ledger sums and judgements on plain values."""

from __future__ import annotations

import pytest

from metering.domain.audit import (
    Invariant,
    Tally,
    Violation,
    WindowLedger,
    consumed,
    judge_counter,
    judge_grant,
    judge_hard,
    judge_seats,
    live_values,
    seat_windows,
    spend_violations,
)

W = 1_800_000_000_000_000
KEY = ("org-1", "calls", W)


def row(
    cost: int,
    *,
    limit: str = "calls",
    subject: str = "org-1",
    allowed: bool = True,
    outcome: str = "allowed",
    maximum: int = 10,
    overage: int = 0,
    price: list[object] | None = None,
) -> list[object]:
    base: list[object] = [
        *(subject, limit, cost, allowed, outcome, 0, 0, maximum, overage, W, W + 1, None)
    ]
    return [*base, [], price] if price is not None else base


def test_only_consumed_charges_of_a_window_count() -> None:
    charges = [row(3), row(2, outcome="would_deny"), row(4, allowed=False, outcome="denied")]
    assert list(consumed("allowed", charges)) == [(KEY, 3, 10)]
    assert list(consumed("denied", [row(3)])) == []
    bucket = ["org-1", "api", 1, True, "allowed", 0, 0, 10, 0, None, W, None]
    assert list(consumed("allowed", [bucket])) == []


def test_a_soft_charge_past_the_maximum_lets_its_window_hold_its_overage() -> None:
    """Made hard since, the window is judged against what the soft limit let it hold."""
    assert list(consumed("overage", [row(5, outcome="overage", overage=3)])) == [(KEY, 5, 13)]
    tally = Tally()
    tally.add_result("overage", 0, [row(5, outcome="overage", overage=3)])
    tally.add_result("allowed", 0, [row(1, maximum=4)])
    assert tally.windows[KEY] == WindowLedger(6, 13)


def test_a_reset_clears_what_was_written_before_it_whatever_the_order() -> None:
    tally = Tally({KEY: WindowLedger(5, 10)})
    tally.reset(KEY, tick=7, at_us=100)
    tally.add_result("allowed", 6, [row(4)])  # written before the reset: cleared
    tally.add_result("allowed", 7, [row(2, maximum=20)])
    tally.take_back(KEY, 1, at_us=99)  # a void before the reset: its units went with it
    tally.take_back(KEY, 1, at_us=101)
    assert tally.windows[KEY] == WindowLedger(1, 20)
    assert tally.touched == {KEY}
    twin = tally.copy()
    twin.add_result("allowed", 6, [row(4)])
    assert twin.windows[KEY] == WindowLedger(1, 20) and twin.touched == set()


def test_a_commits_added_units_count_only_where_no_reset_cleared_them() -> None:
    tally = Tally({KEY: WindowLedger(5, 10)})
    tally.reset(KEY, tick=7, at_us=100)
    tally.add_units(KEY, 2, at_us=99)  # committed before the reset: cleared with the rest
    tally.add_units(KEY, 2, at_us=101)  # of a result an earlier run counted, after the reset
    tally.add_units(KEY, 3, at_us=102, result_tick=7, maximum=30)  # its result counts them
    assert tally.windows[KEY] == WindowLedger(2, 10)
    # Of a result the reset cleared, committed after it: the units, at the charge's maximum.
    tally.add_units(KEY, 3, at_us=102, result_tick=6, maximum=30)
    tally.add_units(KEY, 3, at_us=99, result_tick=6, maximum=40)  # before it: cleared
    assert tally.windows[KEY] == WindowLedger(5, 30)


def test_judgements_name_what_broke() -> None:
    assert judge_counter(KEY, 5, 5, spend=False) is None
    broken = judge_counter(KEY, 5, 4, spend=False)
    assert broken is not None and (broken.invariant, broken.expected, broken.found) == (
        Invariant.COUNTER_LEDGER,
        "used 5",
        "used 4",
    )
    spend = judge_counter(KEY, 5, 4, spend=True)
    assert spend is not None and spend.invariant == Invariant.SPEND_PRICED
    assert judge_hard(KEY, used=14, maximum=10, drawn=3, overdraft=1) is None
    over = judge_hard(KEY, used=15, maximum=10, drawn=3, overdraft=1)
    assert over is not None and over.expected.startswith("used <= 14 (maximum 10")
    assert judge_grant("g", "org-1", "calls", amount=5, used=3, drawn=3) is None
    assert judge_grant("g", "org-1", "calls", amount=5, used=3, drawn=1) is None  # a reset
    below = judge_grant("g", "org-1", "calls", amount=1, used=1, drawn=3)
    assert below is not None and below.found == "used 1, balance -2"


def test_a_spend_charge_equals_its_events_priced_amounts() -> None:
    priced = [row(30, price=["USD", 30]), row(5, price=["USD", 5]), row(35, limit="spend")]
    assert spend_violations("e", "allowed", priced, {"spend": "USD"}) == []
    wrong = [row(30, price=["USD", 30]), row(29, limit="spend")]
    [found] = spend_violations("e", "allowed", wrong, {"spend": "USD"})
    assert (found.invariant, found.item, found.expected, found.found) == (
        Invariant.SPEND_PRICED,
        "e",
        "30 USD priced",
        "29 charged",
    )
    assert spend_violations("e", "denied", wrong, {"spend": "USD"}) == []


def test_each_subjects_spend_charge_equals_its_own_priced_amounts() -> None:
    """An event charging two subjects: each one's spend charge is its own money."""
    both = [
        row(30, price=["USD", 30]),
        row(5, subject="org-2", price=["USD", 5]),
        row(30, limit="spend"),
        row(5, limit="spend", subject="org-2"),
    ]
    assert spend_violations("e", "allowed", both, {"spend": "USD"}) == []
    summed = [*both[:2], row(35, limit="spend"), row(35, limit="spend", subject="org-2")]
    found = spend_violations("e", "allowed", summed, {"spend": "USD"})
    assert [(v.subject, v.expected, v.found) for v in found] == [
        ("org-1", "30 USD priced", "35 charged"),
        ("org-2", "5 USD priced", "35 charged"),
    ]


SEATS = ("org-1", "seats", W)


def test_a_results_seat_windows_are_those_it_consumed_in_on_seat_limits() -> None:
    charges = [row(1, limit="seats"), row(1), row(1, limit="seats", outcome="would_deny")]
    assert seat_windows("allowed", charges, {"seats": "user"}) == [SEATS]
    assert seat_windows("denied", charges, {"seats": "user"}) == []


def test_live_values_leave_out_what_a_reset_cleared_and_what_carries_no_value() -> None:
    distinct = {"seats": "user"}
    assert live_values("e1", [SEATS], {"user": 7}, distinct, {}, 0) == [((*SEATS, "7"), "e1")]
    assert live_values("e1", [SEATS], {"user": "ann"}, distinct, {SEATS: 3}, 2) == []
    assert live_values("e1", [SEATS], {"user": "ann"}, distinct, {SEATS: 3}, 3) == [
        ((*SEATS, "ann"), "e1")
    ]
    assert live_values("e1", [SEATS], {"team": "x"}, distinct, {}, 0) == []
    assert live_values("e1", [SEATS], None, distinct, {}, 0) == []


def test_a_seat_window_is_judged_on_its_count_and_its_unheld_values() -> None:
    assert judge_seats(SEATS, 2, 2, {}) == []
    [count] = judge_seats(SEATS, 2, 1, {})
    assert (count.invariant, count.expected, count.found) == (
        Invariant.SEAT_HELD,
        "used 1 (values holding a seat)",
        "used 2",
    )
    [value] = judge_seats(SEATS, 1, 1, {"dee": "e9"})
    assert (value.invariant, value.item, value.found) == (Invariant.SEAT_HELD, "e9", "no seat")
    assert value.expected == "value 'dee' holds a seat (a live event counts it)"


def test_a_violation_as_a_dict_names_its_window_by_its_start() -> None:
    found = Violation(Invariant.HARD_MAXIMUM, "org-1", "calls", W, "at most 10", "12", "ev-1")
    assert found.to_dict() == {
        "invariant": "hard_maximum",
        "subject": "org-1",
        "limit": "calls",
        "window_start": "2027-01-15T08:00:00+00:00",
        "item": "ev-1",
        "expected": "at most 10",
        "found": "12",
    }
    assert Violation(Invariant.QUEUE_UNDECIDED, item="ev-2").to_dict() == {
        "invariant": "queue_undecided",
        "subject": None,
        "limit": None,
        "window_start": None,
        "item": "ev-2",
        "expected": "",
        "found": "",
    }


def test_each_judgement_is_a_whole_violation() -> None:
    assert judge_counter(KEY, 5, 4, spend=False) == Violation(
        Invariant.COUNTER_LEDGER, "org-1", "calls", W, expected="used 5", found="used 4"
    )
    assert judge_hard(KEY, used=15, maximum=10, drawn=3, overdraft=1) == Violation(
        Invariant.HARD_MAXIMUM,
        "org-1",
        "calls",
        W,
        expected="used <= 14 (maximum 10 + grants 3 + overdraft 1)",
        found="used 15",
    )
    assert judge_grant("g", "org-1", "calls", amount=1, used=1, drawn=3) == Violation(
        Invariant.GRANT_BALANCE,
        "org-1",
        "calls",
        expected="0 <= drawn 3 <= used <= amount 1",
        found="used 1, balance -2",
        item="g",
    )
    assert judge_seats(SEATS, 1, 1, {"dee": "e9", "al": "e8"}) == [
        Violation(
            Invariant.SEAT_HELD,
            *SEATS,
            expected="value 'al' holds a seat (a live event counts it)",
            found="no seat",
            item="e8",
        ),
        Violation(
            Invariant.SEAT_HELD,
            *SEATS,
            expected="value 'dee' holds a seat (a live event counts it)",
            found="no seat",
            item="e9",
        ),
    ]
    [count] = judge_seats(SEATS, 2, 1, {})
    assert count == Violation(
        Invariant.SEAT_HELD, *SEATS, expected="used 1 (values holding a seat)", found="used 2"
    )


@pytest.mark.parametrize(("used", "drawn"), [(0, 0), (5, 5), (5, 0)])
def test_a_grant_used_from_nothing_to_all_of_it_is_sound(used: int, drawn: int) -> None:
    assert judge_grant("g", "org-1", "calls", amount=5, used=used, drawn=drawn) is None


@pytest.mark.parametrize(("used", "drawn"), [(-1, -1), (6, 6), (2, 3)])
def test_a_grant_used_past_either_end_is_not(used: int, drawn: int) -> None:
    assert judge_grant("g", "org-1", "calls", amount=5, used=used, drawn=drawn) is not None


def test_a_spend_violation_names_its_window_or_none() -> None:
    bucket = ["org-1", "spend", 9, True, "allowed", 0, 0, 10, 0, None, W, None]
    found = spend_violations("e", "allowed", [row(9, limit="spend"), bucket], {"spend": "USD"})
    assert found == [
        Violation(
            Invariant.SPEND_PRICED,
            "org-1",
            "spend",
            W,
            expected="0 USD priced",
            found="9 charged",
            item="e",
        ),
        Violation(
            Invariant.SPEND_PRICED,
            "org-1",
            "spend",
            None,
            expected="0 USD priced",
            found="9 charged",
            item="e",
        ),
    ]
    # a row that grants paid and has no price (13 fields) prices nothing
    drawn = [*row(2), [["g", 1]]]
    assert spend_violations("e", "allowed", [drawn, row(0, limit="spend")], {"spend": "USD"}) == []


def test_what_is_not_consumed_is_passed_over_not_the_rest() -> None:
    charges = [row(4, allowed=False, outcome="denied"), row(3), row(2, limit="other")]
    assert [cost for _, cost, _ in consumed("allowed", charges)] == [3, 2]
    tally = Tally()
    tally.reset(KEY, tick=7, at_us=100)
    tally.add_result("allowed", 6, [row(4), row(2, limit="other")])  # the first cleared
    assert tally.windows[("org-1", "other", W)] == WindowLedger(2, 10)
    seats = [SEATS, ("org-1", "seats", W + 1), ("org-1", "seats", W + 2)]
    cleared = {seats[0]: 9}
    found = live_values("e1", seats, {"user": "ann"}, {"seats": "user"}, cleared, 3)
    assert found == [((*seats[1], "ann"), "e1"), ((*seats[2], "ann"), "e1")]


def test_resets_keep_the_latest_tick_and_the_latest_time() -> None:
    tally = Tally({KEY: WindowLedger(5, 10)})
    tally.reset(KEY, tick=7, at_us=100)
    tally.reset(KEY, tick=8, at_us=50)  # written later, stamped earlier: still from 100
    tally.take_back(KEY, 1, at_us=70)  # before the reset
    tally.add_result("allowed", 8, [row(3)])
    tally.reset(KEY, tick=5, at_us=200)  # an older reset: clears nothing
    assert tally.windows[KEY].used == 3
    tally.reset(KEY, tick=8, at_us=300)  # the same tick again: from 300
    tally.add_units(KEY, 2, at_us=250)
    assert tally.windows[KEY].used == 0
    tally.add_units(KEY, 2, at_us=300)  # at the reset's time: counts
    assert tally.windows[KEY].used == 2


def test_units_without_a_reset() -> None:
    tally = Tally()
    tally.add_units(KEY, 2, at_us=10)  # no maximum known: 0
    assert tally.windows[KEY] == WindowLedger(2, 0)
    tally.add_units(KEY, 2, at_us=10, result_tick=0)  # its result counts them
    assert tally.windows[KEY] == WindowLedger(2, 0)
    twin = tally.copy()
    twin.take_back(KEY, 1, at_us=5)
    assert twin.windows[KEY] == WindowLedger(1, 0) and tally.windows[KEY].used == 2


def test_a_window_with_no_value_is_passed_over_not_the_rest() -> None:
    distinct = {"seats": "user", "teams": "team"}
    windows = [SEATS, ("org-1", "teams", W)]
    found = live_values("e1", windows, {"team": "red"}, distinct, {}, 0)
    assert found == [(("org-1", "teams", W, "red"), "e1")]


def test_the_first_reset_of_a_window_clears_it_and_a_take_back_subtracts() -> None:
    tally = Tally({KEY: WindowLedger(5, 10)})
    tally.take_back(KEY, 2, at_us=0)
    assert tally.windows[KEY].used == 3
    tally.reset(KEY, tick=0, at_us=0)
    assert tally.windows[KEY].used == 0
