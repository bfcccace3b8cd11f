"""`metering.domain.audit_rollups`: the rollups' sums from plain ledger rows."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from metering.domain.audit import Invariant
from metering.domain.audit_rollups import RollupLedger, Settlement, judge_rollups
from metering.domain.dimension_history import Era

HOUR = 3_600_000_000
AT = 100 * HOUR + 5


def charge(
    subject: str, limit: str, cost: int, price: int | None = None, outcome: str = "allowed"
) -> list[Any]:
    """A ledger row as `ChargeDecision.to_row` writes it (a price after the grants)."""
    row: list[Any] = [subject, limit, cost, outcome != "denied", outcome, cost, 0, 10, 0]
    row += [HOUR, 2 * HOUR, None]
    if price is not None:
        row += [[], ["USD", price]]
    return row


def ledger(**kwargs: Any) -> RollupLedger:
    route = [Era(0, 0, ("route",))]
    return RollupLedger({"calls": route, "seats": route}, **kwargs)


def test_a_result_counts_its_cost_by_dimension_and_its_money_by_currency() -> None:
    found = ledger()
    found.add("allowed", AT, 1, 1, [charge("org", "calls", 3, price=6)], {"route": "/a"})
    found.add("overage", AT + HOUR, 1, 1, [charge("org", "calls", 2)], None)
    assert found.rows == {
        ("org", "calls", "route", 100 * HOUR, "/a"): [3, 1],
        ("org", "calls", "$spend", 100 * HOUR, "USD"): [6, 1],
        ("org", "calls", "route", 101 * HOUR, ""): [2, 1],
    }


def test_a_denial_and_a_shadow_would_deny_count_nothing() -> None:
    found = ledger()
    found.add("denied", AT, 1, 1, [charge("org", "calls", 3, price=6, outcome="denied")], None)
    found.add("allowed", AT, 1, 1, [charge("org", "calls", 3, price=6, outcome="would_deny")], None)
    found.add("allowed", AT, 1, 1, [charge("org", "plain", 3)], None)  # no dimension, no price
    assert found.rows == {}


def test_a_cancel_takes_the_charge_and_its_event_off_and_a_commit_of_less_its_units() -> None:
    found = ledger()
    rows = [charge("org", "calls", 4, price=8)]
    cancelled = Settlement({("org", "calls"): 4}, {("org", "calls"): 4})
    found.add("allowed", AT, 1, 1, rows, {"route": "/a"}, cancelled)
    kept = Settlement({("org", "calls"): 4}, {("org", "calls"): 3})
    found.add("allowed", AT, 1, 1, [charge("org", "calls", 4, price=2)], {"route": "/b"}, kept)
    ended = Settlement({("org", "calls"): 4}, {})  # its window over: nothing went back
    found.add("allowed", AT, 1, 1, rows, {"route": "/c"}, ended)
    assert found.rows == {
        ("org", "calls", "route", 100 * HOUR, "/a"): [0, 0],
        ("org", "calls", "$spend", 100 * HOUR, "USD"): [2 + 8, 2],
        ("org", "calls", "route", 100 * HOUR, "/b"): [1, 1],
        ("org", "calls", "route", 100 * HOUR, "/c"): [4, 1],
    }


def test_a_reservations_settlement_counts_each_charge_by_what_it_held() -> None:
    found = ledger()
    settled = Settlement({("org", "calls"): 1, ("org", "seats"): 0}, {("org", "calls"): 1})
    rows = [
        charge("org", "calls", 1, outcome="would_deny"),  # a shadow limit's: counts nothing
        charge("org", "calls", 1),  # its one unit given back: its event goes too
        charge("org", "seats", 0),  # a charge of 0 held and kept: its event stays
        charge("web", "calls", 2),  # one the reservation no longer held: counted whole
        [*charge("web", "seats", 1), [["g", 1]]],  # grants paid, and no price after them
    ]
    found.add("allowed", AT, 1, 1, rows, {"route": "/a"}, settled)
    assert found.rows == {
        ("org", "calls", "route", 100 * HOUR, "/a"): [0, 0],
        ("org", "seats", "route", 100 * HOUR, "/a"): [0, 1],
        ("web", "calls", "route", 100 * HOUR, "/a"): [2, 1],
        ("web", "seats", "route", 100 * HOUR, "/a"): [1, 1],
    }


def test_a_spend_charge_a_commit_rewrote_to_0_takes_its_event_off() -> None:
    found = RollupLedger({"usd": [Era(0, 0, ("route",))]})
    held = {("org", "calls"): 3, ("org", "usd"): 6}
    none = Settlement(held, {("org", "calls"): 3})  # a commit of 0: all the money back
    found.add("allowed", AT, 1, 1, [charge("org", "calls", 3), charge("org", "usd", 0)], None, none)
    some = Settlement(held, {("org", "calls"): 2})  # a commit of 1: 2 cents kept
    meta = {"route": "/b"}
    found.add("allowed", AT, 1, 1, [charge("org", "calls", 3), charge("org", "usd", 2)], meta, some)
    assert found.rows == {
        ("org", "usd", "route", 100 * HOUR, ""): [0, 0],
        ("org", "usd", "route", 100 * HOUR, "/b"): [2, 1],
    }


def test_each_result_counts_under_the_dimensions_in_force_at_its_tick() -> None:
    eras = [Era(5, 0, ("route",)), Era(9, 0, ("route", "plan")), Era(12, 0, ())]
    found = RollupLedger({"calls": eras})
    meta = {"route": "/a", "plan": "pro"}
    found.add("allowed", AT, 1, 5, [charge("org", "calls", 3)], meta)
    found.add("allowed", AT, 1, 9, [charge("org", "calls", 2)], meta)
    found.add("allowed", AT, 1, 12, [charge("org", "calls", 7)], meta)
    assert found.stale == set()
    assert found.rows == {
        ("org", "calls", "route", 100 * HOUR, "/a"): [5, 2],
        ("org", "calls", "plan", 100 * HOUR, "pro"): [2, 1],
    }


def test_a_result_written_before_the_history_leaves_its_hour_stale() -> None:
    found = RollupLedger({"calls": [Era(7, 50, ("route",), seeded=True)]})
    found.add("allowed", AT, 49, 6, [charge("org", "calls", 3, price=6)], None)
    found.add("allowed", AT + HOUR, 50, 6, [charge("org", "calls", 1)], None)  # defined before
    assert found.stale == {("org", "calls", 100 * HOUR)}
    assert found.rows == {
        ("org", "calls", "$spend", 100 * HOUR, "USD"): [6, 1],  # money follows no definition
        ("org", "calls", "route", 101 * HOUR, ""): [1, 1],
    }


def test_a_voided_result_counts_nothing_and_leaves_a_seat_hour_unknown() -> None:
    found = ledger(seats=frozenset({"seats"}))
    found.voided(AT, 1, 1, [charge("org", "calls", 3), charge("org", "seats", 1)])
    assert (found.rows, found.unknown, found.stale) == ({}, {("org", "seats", 100 * HOUR)}, set())
    found = RollupLedger({"calls": [Era(7, 50, ("route",), seeded=True)]})
    found.voided(AT, 49, 6, [charge("org", "calls", 3)])  # its limit defined again since
    assert (found.rows, found.stale) == ({}, {("org", "calls", 100 * HOUR)})


RESULTS = st.lists(
    st.tuples(
        st.sampled_from(["allowed", "overage", "denied"]),
        st.integers(0, 3 * HOUR),
        st.lists(
            st.tuples(
                st.sampled_from(["org-1", "org-2"]),
                st.sampled_from(["calls", "plain"]),
                st.integers(1, 9),
                st.none() | st.integers(0, 50),
            ),
            min_size=1,
            max_size=3,
            unique_by=lambda c: c[:2],
        ),
        st.sampled_from([None, {"route": "/a"}, {"route": "/b"}]),
    ),
    max_size=8,
)


def _sums(results: list[Any]) -> dict[Any, list[int]]:
    found = ledger()
    for outcome, at_us, charges, metadata in results:
        rows = [charge(s, lim, cost, price) for s, lim, cost, price in charges]
        found.add(outcome, at_us, 1, 1, rows, metadata)
    return found.rows


@given(RESULTS, st.randoms())
def test_the_sums_do_not_depend_on_the_order_of_the_results(results: list[Any], rnd: Any) -> None:
    shuffled = list(results)
    rnd.shuffle(shuffled)
    assert _sums(shuffled) == _sums(results)


@given(RESULTS)
def test_every_event_counts_once_per_row_and_its_cost_in_it(results: list[Any]) -> None:
    rows = _sums(results)
    consumed = [r for r in results if r[0] != "denied"]
    calls = [c for _, _, charges, _ in consumed for c in charges if c[1] == "calls"]
    routes = [v for k, v in rows.items() if k[2] == "route"]
    assert sum(v[0] for v in routes) == sum(c[2] for c in calls)
    assert sum(v[1] for v in routes) == len(calls)
    priced = [c for _, _, charges, _ in consumed for c in charges if c[3] is not None]
    spent = [v for k, v in rows.items() if k[2] == "$spend"]
    assert (sum(v[0] for v in spent), sum(v[1] for v in spent)) == (
        sum(c[3] for c in priced),
        len(priced),
    )


KEY = ("org", "calls", "route", HOUR, "/a")
OTHER = ("org", "calls", "$spend", HOUR, "USD")


def test_judge_names_each_row_that_differs_and_only_those_judged() -> None:
    expected = {KEY: [3, 1], OTHER: [6, 1]}
    assert judge_rollups(expected, {KEY: (3, 1), OTHER: (6, 1)}, lambda key: True) == []
    [violation] = judge_rollups(expected, {KEY: (4, 1), OTHER: (6, 1)}, lambda key: True)
    assert (violation.invariant, violation.subject, violation.limit) == (
        Invariant.ROLLUP_LEDGER,
        "org",
        "calls",
    )
    assert (violation.window_start_us, violation.expected, violation.found) == (
        HOUR,
        "route '/a': used 3, events 1",
        "route '/a': used 4, events 1",
    )
    assert judge_rollups(expected, {KEY: (4, 1)}, lambda key: key != KEY)[0].found == (
        "$spend 'USD': used 0, events 0"  # a row missing is (0, 0)
    )
    assert judge_rollups({}, {KEY: (0, 0)}, lambda key: True) == []  # all of it voided


def test_a_row_the_ledger_cannot_say_is_judged_by_its_sign() -> None:
    [violation] = judge_rollups({KEY: [1, 1]}, {KEY: (-1, 0)}, lambda key: False)
    assert (violation.invariant, violation.expected, violation.found) == (
        Invariant.ROLLUP_LEDGER,
        "route '/a': used >= 0, events >= 0",
        "route '/a': used -1, events 0",
    )
    assert judge_rollups({}, {KEY: (2, 1)}, lambda key: False) == []
    assert judge_rollups({}, {KEY: (-1, 0)}, lambda key: True, lambda key: False) == []


def test_a_row_whose_events_alone_the_ledger_says_is_judged_by_them() -> None:
    def never(key: Any) -> bool:
        return False

    def always(key: Any) -> bool:
        return True

    expected = {KEY: [1, 1]}
    assert judge_rollups(expected, {KEY: (2, 1)}, never, always, always) == []  # used moved
    [violation] = judge_rollups(expected, {KEY: (1, 2)}, never, always, always)
    assert (violation.expected, violation.found) == (
        "route '/a': events 1",
        "route '/a': used 1, events 2",
    )
    [below] = judge_rollups(expected, {KEY: (-1, 1)}, never, always, always)
    assert below.expected == "route '/a': used >= 0, events >= 0"


def test_a_result_counts_when_a_charge_has_a_dimension_or_a_price() -> None:
    found = ledger()
    assert found.counts([charge("org", "plain", 1), charge("org", "calls", 1)])
    assert found.counts([charge("org", "plain", 1, price=0)])
    assert not found.counts([charge("org", "plain", 1)])
    # grants that paid, and no price after them
    assert not found.counts([[*charge("org", "plain", 1), [["g", 1]]]])


def test_each_row_is_judged_by_what_its_key_says() -> None:
    """Judged rows on used and events, counted ones on events, the rest on
    their sign; unsigned ones not at all; in key order, either side missing."""
    rows = {
        name: (name, "api", dimension, 1_000, value)
        for name, dimension, value in [
            ("a", "route", "unsigned"),
            ("b", "route", "/x"),
            ("c", "model", "m"),
            ("d", "other", "v"),
            ("e", "other", "z"),
            ("f", "route", "gone"),
            ("g", "model", "new"),
        ]
    }
    expected = {rows["a"]: (1, 1), rows["b"]: (5, 1), rows["c"]: (3, 1)}
    expected |= {rows["e"]: (1, 1), rows["f"]: (2, 1)}
    found = {rows["a"]: (0, 0), rows["b"]: (4, 1), rows["c"]: (3, 2), rows["d"]: (-1, 0)}
    found |= {rows["e"]: (0, 1), rows["g"]: (0, 1)}
    violations = judge_rollups(
        expected,
        found,
        lambda key: key[2] == "route",
        lambda key: key[4] != "unsigned",
        lambda key: key[2] == "model",
    )
    assert [(v.invariant, v.subject, v.window_start_us) for v in violations] == [
        (Invariant.ROLLUP_LEDGER, name, 1_000) for name in "bcdfg"
    ]
    assert [(v.expected, v.found) for v in violations] == [
        ("route '/x': used 5, events 1", "route '/x': used 4, events 1"),
        ("model 'm': events 1", "model 'm': used 3, events 2"),
        ("other 'v': used >= 0, events >= 0", "other 'v': used -1, events 0"),
        ("route 'gone': used 2, events 1", "route 'gone': used 0, events 0"),
        ("model 'new': events 0", "model 'new': used 0, events 1"),
    ]
