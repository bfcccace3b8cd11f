"""The hot path's rules (`metering.domain.rules`) equal `decide_event`, in memory.

`rules.decide` restates `decide_event` over counters held as lists, for
speed. ``tests/engine/test_differential.py`` compares the two through the
databases; this file compares them directly, with no database, so that
mutation testing (``make mutants``) can judge the hot path on the unit
tests alone. The streams are pseudo-random but fixed (seeded), so a
failure names its seed and step and never comes and goes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import pytest

from metering.domain.decisions import ChargeInput, decide_event
from metering.domain.grants import Balance, Pot
from metering.domain.imports import ImportPolicy
from metering.domain.instants import to_us
from metering.domain.limits import Limit, Period
from metering.domain.needs import rule_needs
from metering.domain.notifications import Notice, notices_for
from metering.domain.rules import (
    BUCKET_WINDOW,
    Rule,
    State,
    decide,
    fresh_state,
    grants_low,
    state_of,
)
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.domain.windows import Window, calendar_window, first_use_window

SECOND = 1_000_000
START_US = to_us(datetime(2026, 11, 30, 23, 0, tzinfo=UTC))  # a month's end is near
LIMITS = [
    Limit("cal", maximum=5, period="1h", window="calendar", thresholds=(50, 100)),
    Limit("fu", maximum=4, period="30m"),
    Limit("soft", maximum=3, period="1mo", window="calendar", enforcement="soft", thresholds=(80,)),
    Limit("plain_soft", maximum=2, period="10m", enforcement="soft"),
    Limit("bucket", maximum=3, period="60s", algorithm="token_bucket", thresholds=(100,)),
    Limit("quiet_bucket", maximum=2, period="7s", algorithm="token_bucket"),
    Limit("quiet", maximum=3, period="90s"),
]
SUBJECTS = ["org-1", "org-2", "user-é"]
STEPS_US = [0, 0, 1, SECOND, 3 * SECOND, 20 * SECOND, 61 * SECOND, 900 * SECOND, 3600 * SECOND]


@dataclass
class Engines:
    """The general engine and the hot one (with and without notices), side by side."""

    limits: dict[str, Limit] = field(default_factory=lambda: {lim.name: lim for lim in LIMITS})
    general: dict[CounterKey, CounterState] = field(default_factory=dict)
    hot: dict[tuple[str, str, int], State] = field(default_factory=dict)
    quiet: dict[tuple[str, str, int], State] = field(default_factory=dict)
    first_use: dict[tuple[str, str], Window] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)  # what the stream exercised

    def window(self, limit: Limit, subject: str, at_us: int) -> Window:
        if limit.algorithm == "token_bucket":
            return BUCKET_WINDOW
        if limit.window == "calendar":
            return calendar_window(limit.parsed_period, at_us)
        current = self.first_use.get((limit.name, subject))
        window = first_use_window(limit.parsed_period, at_us, current, None)
        self.first_use[(limit.name, subject)] = window
        return window

    def apply(self, charges: list[tuple[str, str, int]], at_us: int, event_id: str) -> None:
        limits = [self.limits[name] for _, name, _ in charges]
        windows = [
            self.window(lim, subject, at_us)
            for lim, (subject, _, _) in zip(limits, charges, strict=True)
        ]
        keys = [
            CounterKey(name, subject, *window)
            for (subject, name, _), window in zip(charges, windows, strict=True)
        ]

        # The general engine, as `metering.engine.reference` runs it.
        inputs = [
            ChargeInput(lim, key, self.general.get(key, CounterState()), cost)
            for lim, key, (_, _, cost) in zip(limits, keys, charges, strict=True)
        ]
        verdict = decide_event(inputs, at_us)
        expected_notices: list[Notice] = []
        for lim, key, charge_input, new_state, charge in zip(
            limits, keys, inputs, verdict.new_states, verdict.charges, strict=True
        ):
            expected_notices += notices_for(
                lim, key, charge_input.state, new_state, charge, event_id
            )
            self.general[key] = new_state

        # The hot path, as `metering.engine.fast` runs it: once wanting notices, once not.
        rules = [Rule.of(lim) for lim in limits]
        notices: list[Notice] = []
        outcomes = []
        for held, wanted in ((self.hot, notices), (self.quiet, None)):
            states = [
                held.setdefault((key.limit, key.subject, key.window_start_us), fresh_state())
                for key in keys
            ]
            outcomes.append(decide(rules, charges, windows, states, at_us, event_id, wanted))

        for outcome in outcomes:
            assert all(_exact(row) for row in outcome.rows)
            assert outcome.outcome == verdict.outcome
            assert outcome.denied_by == verdict.denied_by
            assert outcome.rows == [c.to_row() for c in verdict.charges]
        assert notices == expected_notices
        self.seen |= {verdict.outcome, *(f"mark {n.mark}" for n in notices)}
        self.seen |= {charge.outcome for charge in verdict.charges}
        if len(verdict.denied_by) > 1:
            self.seen.add("denied by 2")
        if any(not c.allowed and c.retry_at_us is None for c in verdict.charges):
            self.seen.add("retry never")
        for key in keys:
            hot_key = (key.limit, key.subject, key.window_start_us)
            assert _exact(self.hot[hot_key]) and _exact(self.quiet[hot_key])
            assert state_of(self.hot[hot_key]) == self.general[key]
            assert state_of(self.quiet[hot_key]) == self.general[key]


def _exact(values: list[object]) -> bool:
    """No figure is a float: instants beyond 2**53 µs-times-capacity must stay exact."""
    return not any(isinstance(v, float) for v in values)


def _stream(seed: int, events: int) -> Engines:
    rng = random.Random(seed)
    engines = Engines()
    now_us = START_US
    for step in range(events):
        now_us += rng.choice(STEPS_US)
        if rng.random() < 0.08:  # a limit redefined: another maximum, same name
            name = rng.choice(list(engines.limits))
            engines.limits[name] = replace(engines.limits[name], maximum=rng.randint(1, 6))
            engines.seen.add("redefined")
        at_us = now_us - rng.choice([0, 0, 0, 1, 30 * SECOND])  # some events come late
        pairs = rng.sample([(s, lim.name) for s in SUBJECTS for lim in LIMITS], rng.randint(1, 3))
        charges = [(subject, name, rng.choice([1, 1, 1, 2, 3, 7])) for subject, name in pairs]
        try:
            engines.apply(charges, at_us, f"ev-{step}")
        except AssertionError as failure:
            raise AssertionError(f"seed {seed}, step {step}: {charges} at {at_us}") from failure
    return engines


def random_stream(
    limits: list[Limit],
    seed: int,
    events: int,
    steps_us: list[int],
    cost: Callable[[random.Random, str], int],
) -> Engines:
    """``events`` seeded events of one to three charges on ``limits`` (a cost
    drawn by ``cost`` for each limit's name), through `Engines.apply`."""
    rng = random.Random(seed)
    engines = Engines(limits={limit.name: limit for limit in limits})
    now_us = START_US
    for step in range(events):
        now_us += rng.choice(steps_us)
        at_us = now_us - rng.choice([0, 0, 0, 1, 30 * SECOND])  # some events come late
        pairs = rng.sample([(s, lim.name) for s in SUBJECTS for lim in limits], rng.randint(1, 3))
        charges = [(subject, name, cost(rng, name)) for subject, name in pairs]
        try:
            engines.apply(charges, at_us, f"ev-{step}")
        except AssertionError as failure:
            raise AssertionError(f"seed {seed}, step {step}: {charges} at {at_us}") from failure
    return engines


SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_hot_path_decides_like_decide_event(seed: int) -> None:
    _stream(seed, events=150)


def test_the_streams_reach_every_outcome_and_notice() -> None:
    """The comparison above is worth something: every case occurs in the streams."""
    seen: set[str] = set()
    for seed in SEEDS:
        seen |= _stream(seed, events=150).seen
    assert seen >= {
        "allowed",
        "denied",
        "overage",
        "denied by 2",
        "mark denied",
        "mark threshold:50",
        "mark threshold:100",
        "mark threshold:80",
        "mark exceeded",
        "retry never",
        "redefined",
    }


# --------------------------------------------------------------------------- examples


def test_rule_of_unpacks_what_the_arithmetic_reads() -> None:
    bucket = Limit("api", maximum=4, period="2m", algorithm="token_bucket", lateness="1h")
    assert Rule.of(bucket) == Rule(
        limit=bucket,
        name="api",
        maximum=4,
        bucket=True,
        soft=False,
        shadow=False,
        calendar=False,
        period=Period(seconds=120),
        token_us=120 * SECOND,
        lateness_us=3600 * SECOND,
        notifies=False,
        dimensions=(),
    )
    soft = Limit("seats", maximum=9, period="1mo", window="calendar", enforcement="soft")
    assert Rule.of(soft) == Rule(
        limit=soft,
        name="seats",
        maximum=9,
        bucket=False,
        soft=True,
        shadow=False,
        calendar=True,
        period=Period(months=1),
        token_us=0,
        lateness_us=86_400 * SECOND,
        notifies=True,
        dimensions=(),
    )
    routed = Limit("calls", maximum=9, period="1d", dimensions=("route",))
    assert Rule.of(routed).dimensions == ("route",)
    warned = Limit("calls", maximum=9, period="1d", thresholds=(90,))
    assert (Rule.of(warned).notifies, Rule.of(warned).soft, Rule.of(warned).calendar) == (
        True,
        False,
        False,
    )


def test_a_fresh_state_is_an_empty_counter() -> None:
    assert fresh_state() == [0, 0, 0, None, None, 0, 1]
    assert state_of(fresh_state()) == CounterState()
    assert fresh_state() is not fresh_state()  # each counter its own list
    assert BUCKET_WINDOW == (NO_WINDOW, NO_WINDOW)


def test_a_denied_stacked_event_consumes_nothing_and_counts_the_denial_once() -> None:
    hard = Rule.of(Limit("seats", maximum=2, period="1d", window="calendar"))
    soft = Rule.of(Limit("calls", maximum=10, period="1d", window="calendar", enforcement="soft"))
    window = calendar_window(Period(seconds=86_400), START_US)
    seats, calls = [2, 0, 0, None, None, 0, 1], [13, 0, 0, None, None, 0, 1]
    notices: list[Notice] = []
    outcome = decide(
        [hard, soft],
        [("org", "seats", 1), ("org", "calls", 4)],
        [window, window],
        [seats, calls],
        START_US,
        "e1",
        notices,
    )
    assert (outcome.outcome, outcome.denied_by) == ("denied", ("seats",))
    assert outcome.rows == [
        ["org", "seats", 1, False, "denied", 2, 0, 2, 0, window[0], window[1], window[1]],
        ["org", "calls", 4, True, "allowed", 13, 0, 10, 3, window[0], window[1], None],
    ]
    assert seats == [2, 1, 1, START_US, None, 0, 1]
    assert calls == [13, 0, 0, None, None, 0, 1]
    assert [n.mark for n in notices] == ["denied"]


def test_a_bucket_charge_writes_its_arrival_time_exactly() -> None:
    rule = Rule.of(Limit("api", maximum=3, period="10s", algorithm="token_bucket"))
    state = fresh_state()
    outcome = decide([rule], [("s", "api", 2)], [BUCKET_WINDOW], [state], START_US, None, None)
    # Two tokens of 10/3 s each: full again 6.67 s from now, kept as a fraction of 1/3 µs.
    tat_scaled = START_US * 3 + 2 * 10 * SECOND
    assert state == [2, 0, 0, None, *divmod(tat_scaled, 3), 3]
    assert outcome.rows == [
        ["s", "api", 2, True, "allowed", 2, 1, 3, 0, None, -(-tat_scaled // 3), None]
    ]


def test_decide_refuses_rules_that_do_not_line_up_with_the_charges() -> None:
    rule = Rule.of(LIMITS[1])
    window = (START_US, START_US + 1800 * SECOND)
    with pytest.raises(ValueError, match="zip"):
        decide(
            [rule],
            [("a", "fu", 1), ("b", "fu", 1)],
            [window, window],
            [fresh_state(), fresh_state()],
            START_US,
            None,
            None,
        )


# ----------------------------------------------------------- grants, shadow limits, entitlements

MONTH = calendar_window(Period(months=1), START_US)  # November 2026, ending 1 h after START_US
CALLS = Limit("calls", maximum=10, period="1mo", window="calendar", thresholds_units=(12,))
SEATS = Limit("seats", maximum=4, period="1mo", window="calendar")
SOFT_CALLS = Limit("calls", maximum=10, period="1mo", window="calendar", enforcement="soft")
TRIAL = Limit("trial", maximum=3, period="1mo", window="calendar", enforcement="shadow")


def topped_up(granted: int) -> Pot:
    """A grant of 3 left that expires a microsecond after START_US, and one of 2 that never
    does; ``granted`` of the window's usage was paid by grants (0: none yet)."""
    pot = Pot([Balance("g2", 2, 0, 0, None), Balance("g1", 4, 1, 0, START_US + 1)])
    if granted:
        pot.granted[MONTH[0]] = granted
    pot.granted[MONTH[1]] = 50  # the next window's draws: not this one's
    return pot


def both_engines(
    limits: list[Limit],
    charges: list[tuple[str, str, int]],
    states: list[CounterState],
    pots: list[int | None],
    at_us: int = START_US,
) -> tuple[list[list[object]], list[Notice], list[Pot | None]]:
    """`decide` and `decide_event` on the same event, with grants (``pots``: the
    window's granted usage, None: no grants); each engine gets its own pots."""
    general_pots = [None if g is None else topped_up(g) for g in pots]
    keys = [CounterKey(name, subject, *MONTH) for subject, name, _ in charges]
    inputs = [
        ChargeInput(lim, key, state, cost, pot)
        for lim, key, state, (_, _, cost), pot in zip(
            limits, keys, states, charges, general_pots, strict=True
        )
    ]
    verdict = decide_event(inputs, at_us)
    expected: list[Notice] = []
    for lim, key, state, new, charge in zip(
        limits, keys, states, verdict.new_states, verdict.charges, strict=True
    ):
        expected += notices_for(lim, key, state, new, charge, "e1")

    hot_pots: list[Pot | None] = [None if g is None else topped_up(g) for g in pots]
    lists = [[getattr(s, f) for f in CounterState.__slots__] for s in states]
    notices: list[Notice] = []
    rules = [Rule.of(lim) for lim in limits]
    outcome = decide(rules, charges, [MONTH] * len(charges), lists, at_us, "e1", notices, hot_pots)

    assert (outcome.outcome, outcome.denied_by) == (verdict.outcome, verdict.denied_by)
    assert outcome.rows == [c.to_row() for c in verdict.charges]
    assert [state_of(s) for s in lists] == list(verdict.new_states)
    assert notices == expected
    for hot, general in zip(hot_pots, general_pots, strict=True):
        assert (hot is None) == (general is None)
        if hot is not None and general is not None:
            assert hot.granted == general.granted
            assert [(b.grant_id, b.used) for b in hot.balances] == [
                (b.grant_id, b.used) for b in general.balances
            ]
    return outcome.rows, notices, hot_pots


def test_the_hot_path_draws_on_grants_like_decide_event() -> None:
    # used 9 of which 2 granted: own room 3, grants 3 + 2
    rows, notices, pots = both_engines([CALLS], [("org", "calls", 5)], [CounterState(used=9)], [2])
    end = MONTH[1]
    assert rows == [
        ["org", "calls", 5, True, "allowed", 14, 3, 10, 0, MONTH[0], end, None, [["g1", 2]]]
    ]
    assert pots[0] is not None and pots[0].granted == {MONTH[0]: 4, end: 50}
    assert [(n.mark, n.used) for n in notices] == [("units:12", 14)]
    whole, _, _ = both_engines([CALLS], [("org", "calls", 8)], [CounterState(used=9)], [2])
    assert whole[0][4:7] == ["allowed", 17, 0] and whole[0][12] == [["g1", 3], ["g2", 2]]


def test_the_hot_path_denies_what_the_grants_cannot_pay() -> None:
    rows, notices, pots = both_engines([CALLS], [("org", "calls", 9)], [CounterState(used=9)], [2])
    end = MONTH[1]
    assert rows == [["org", "calls", 9, False, "denied", 9, 8, 10, 0, MONTH[0], end, end]]
    assert pots[0] is not None and pots[0].granted == {MONTH[0]: 2, end: 50}
    assert [n.mark for n in notices] == ["denied"]
    never, _, _ = both_engines([CALLS], [("org", "calls", 16)], [CounterState()], [0])
    assert never[0][4:7] == ["denied", 0, 15] and never[0][11] is None  # never fits a window
    whole, _, _ = both_engines([CALLS], [("org", "calls", 10)], [CounterState(used=9)], [2])
    assert whole[0][4:7] == ["denied", 9, 8] and whole[0][11] == end  # the maximum fits later
    # The next window holds its own 10 and the 2 of the grant that never expires: 12 fits then.
    later, _, _ = both_engines([CALLS], [("org", "calls", 12)], [CounterState(used=9)], [2])
    assert later[0][4] == "denied" and later[0][11] == end
    beyond, _, _ = both_engines([CALLS], [("org", "calls", 13)], [CounterState(used=9)], [2])
    assert beyond[0][4] == "denied" and beyond[0][11] is None


def test_the_hot_path_denies_past_a_lowered_maximum_whatever_the_grants() -> None:
    """A downgrade below own usage denies hard charges until the window resets:
    grants add room over the maximum in force, not over the usage past it."""
    lowered = CALLS.with_maximum(8)
    rows, _, pots = both_engines([lowered], [("org", "calls", 1)], [CounterState(used=9)], [0])
    end = MONTH[1]
    assert rows == [["org", "calls", 1, False, "denied", 9, 0, 8, 1, MONTH[0], end, end]]
    assert pots[0] is not None and pots[0].granted == {MONTH[1]: 50}
    # at the lowered maximum exactly, the grants are room again
    full, _, _ = both_engines([lowered], [("org", "calls", 2)], [CounterState(used=8)], [0])
    assert full[0][3:9] == [True, "allowed", 10, 3, 8, 0] and full[0][12] == [["g1", 2]]


def test_the_hot_path_judges_a_grants_expiry_at_the_events_time() -> None:
    late = START_US + 1
    rows, _, _ = both_engines([CALLS], [("org", "calls", 5)], [CounterState(used=9)], [2], late)
    assert rows[0][4:7] == ["allowed", 14, 0] and rows[0][12] == [["g2", 2]]
    denied, _, _ = both_engines([CALLS], [("org", "calls", 6)], [CounterState(used=9)], [2], late)
    assert denied[0][4:7] == ["denied", 9, 5]


def test_the_hot_path_draws_grants_for_a_soft_limit_and_counts_the_rest_as_overage() -> None:
    rows, notices, _ = both_engines(
        [SOFT_CALLS], [("org", "calls", 8)], [CounterState(used=12)], [1]
    )
    # own usage 11 (one past), grants 5: 3 of the 8 go past the maximum
    assert rows[0][3:9] == [True, "overage", 20, 0, 10, 4]
    assert rows[0][12] == [["g1", 3], ["g2", 2]]
    assert notices == []  # the window was past its maximum already
    fresh, crossed, _ = both_engines(
        [SOFT_CALLS], [("org", "calls", 9)], [CounterState(used=8)], [0]
    )
    assert fresh[0][3:9] == [True, "overage", 17, 0, 10, 2]
    assert [n.mark for n in crossed] == ["exceeded"]


def test_grants_pay_nothing_in_the_hot_path_when_another_charge_denies() -> None:
    rows, _, pots = both_engines(
        [SEATS, CALLS],
        [("org", "seats", 1), ("org", "calls", 5)],
        [CounterState(used=4), CounterState(used=9)],
        [None, 2],
    )
    assert [row[4] for row in rows] == ["denied", "allowed"]
    assert len(rows[1]) == 12 and rows[1][5:7] == [9, 8]
    assert pots[1] is not None and pots[1].granted[MONTH[0]] == 2


def test_the_hot_path_records_a_shadow_limits_would_deny_without_denying() -> None:
    rows, notices, _ = both_engines(
        [CALLS, TRIAL],
        [("org", "calls", 2), ("org", "trial", 2)],
        [CounterState(used=1), CounterState(used=2)],
        [None, None],
    )
    end = MONTH[1]
    assert rows == [
        ["org", "calls", 2, True, "allowed", 3, 7, 10, 0, MONTH[0], end, None],
        ["org", "trial", 2, True, "would_deny", 2, 1, 3, 0, MONTH[0], end, end],
    ]
    assert [(n.type, n.mark, n.limit) for n in notices] == [
        ("limit.would_deny", "would_deny", "trial")
    ]
    again, quiet, _ = both_engines(
        [TRIAL],
        [("org", "trial", 2)],
        [CounterState(used=2, denied_count=1, denied_cost=2, first_denied_at_us=MONTH[0])],
        [None],
    )
    assert again[0][4] == "would_deny" and quiet == []  # only the first in the window


def test_a_shadow_limit_beside_a_denying_hard_one_still_says_would_deny() -> None:
    rows, notices, _ = both_engines(
        [SEATS, TRIAL],
        [("org", "seats", 5), ("org", "trial", 4)],
        [CounterState(), CounterState()],
        [None, None],
    )
    assert [row[3:5] for row in rows] == [[False, "denied"], [True, "would_deny"]]
    assert [n.mark for n in notices] == ["denied", "would_deny"]


def test_a_rule_with_a_subjects_own_maximum() -> None:
    rule = Rule.of(CALLS)
    assert rule.with_maximum(10) is rule
    own = rule.with_maximum(7)
    assert own == replace(rule, maximum=7)
    assert own.limit is CALLS and rule.maximum == 10
    # Copied slot by slot: every field of a rule with none at its default.
    paced = Limit("p", maximum=9, period="1d", window="calendar", pacing=True, dimensions=("r",))
    full = replace(Rule.of(paced, priced=True), gauge="max", concurrent=True, distinct=True)
    assert full.with_maximum(3) == replace(full, maximum=3)
    shadow = Rule.of(TRIAL)
    assert (shadow.shadow, shadow.soft, shadow.notifies) == (True, False, False)
    assert Rule.of(CALLS).notifies and not Rule.of(CALLS).shadow


# ----------------------------------------------------------- one charge, written out


def one_and_general(rule: Rule, cost: int, window: Window, state: list[object]) -> tuple:  # type: ignore[type-arg]
    """`decide` of one charge on its written-out path (no pots) and on the
    general one (pots given), from copies of ``state``: both results."""
    found = []
    for pots in (None, [None]):
        held = list(state)
        notices: list[Notice] = []
        outcome = decide(
            [rule], [("org", rule.name, cost)], [window], [held], START_US, "e", notices, pots
        )
        found.append((outcome, held, notices))
    return found[0], found[1]


DAY = calendar_window(Period(seconds=86_400), START_US)
ONE_CHARGE_CASES = [
    (
        Limit("trial", maximum=3, period="1d", window="calendar", enforcement="shadow"),
        4,
        [2, 0, 0, None, None, 0, 1],
    ),
    (
        Limit("trial", maximum=3, period="1d", window="calendar", enforcement="shadow"),
        1,
        [2, 0, 0, None, None, 0, 1],
    ),
    (
        Limit("trial", maximum=3, period="1d", window="calendar", enforcement="shadow"),
        4,
        [2, 1, 4, START_US, None, 0, 1],
    ),
    (Limit("calls", maximum=3, period="1d", window="calendar"), 4, [0, 0, 0, None, None, 0, 1]),
    (
        Limit("calls", maximum=3, period="1d", window="calendar", thresholds=(50,)),
        2,
        [0, 0, 0, None, None, 0, 1],
    ),
    (
        Limit("calls", maximum=3, period="1d", window="calendar", enforcement="soft"),
        2,
        [2, 0, 0, None, None, 0, 1],
    ),
    (
        Limit("api", maximum=2, period="2s", algorithm="token_bucket", enforcement="shadow"),
        3,
        [0, 0, 0, None, None, 0, 1],
    ),
]


@pytest.mark.parametrize(("limit", "cost", "state"), ONE_CHARGE_CASES)
def test_one_charge_written_out_decides_as_the_general_path(
    limit: Limit, cost: int, state: list[object]
) -> None:
    window = BUCKET_WINDOW if limit.algorithm == "token_bucket" else DAY
    one, general = one_and_general(Rule.of(limit), cost, window, state)
    assert one == general


def test_one_shadow_charge_that_does_not_fit_would_deny_and_is_allowed() -> None:
    shadow = Rule.of(ONE_CHARGE_CASES[0][0])
    (outcome, _, notices), _ = one_and_general(shadow, 4, DAY, [2, 0, 0, None, None, 0, 1])
    assert (outcome.outcome, outcome.denied_by) == ("allowed", ())
    assert outcome.rows[0][3:5] == [True, "would_deny"]
    assert [n.mark for n in notices] == ["would_deny"]


def test_a_rule_that_does_not_notify_finds_no_threshold() -> None:
    # An import (`--no-enforce`) records history without announcing it.
    limit = Limit("calls", maximum=4, period="1d", window="calendar", thresholds=(50,))
    quiet = ImportPolicy(enforce=False).rule(Rule.of(limit))
    assert not quiet.notifies
    for pots in (None, [None]):
        notices: list[Notice] = []
        outcome = decide(
            [quiet], [("org", "calls", 3)], [DAY], [fresh_state()], START_US, "e", notices, pots
        )
        assert outcome.outcome == "allowed"
        assert notices == []
    notices = []
    two = [quiet, quiet.with_maximum(4)]
    decide(
        two,
        [("org", "calls", 3), ("org2", "calls", 3)],
        [DAY, DAY],
        [fresh_state(), fresh_state()],
        START_US,
        "e",
        notices,
    )
    assert notices == []


@pytest.mark.parametrize(
    ("rules", "charges", "windows", "states"),
    [(2, 1, 1, 1), (2, 2, 1, 1), (2, 2, 2, 1)],
)
def test_decide_refuses_any_sequence_that_does_not_line_up(
    rules: int, charges: int, windows: int, states: int
) -> None:
    rule = Rule.of(LIMITS[1])
    window = (START_US, START_US + 1800 * SECOND)
    with pytest.raises(ValueError, match="zip"):
        decide(
            [rule] * rules,
            [("a", "fu", 1)] * charges,
            [window] * windows,
            [fresh_state() for _ in range(states)],
            START_US,
            None,
            None,
        )


def test_priced_and_spend_limits_are_money() -> None:
    plain = Limit("calls", maximum=3, period="1d")
    assert not Rule.of(plain).money
    assert Rule.of(plain, priced=True).money
    assert Rule.of(Limit("spend", maximum=500, period="1mo", currency="EUR")).money


def test_a_rule_with_a_subjects_own_thresholds() -> None:
    rule = Rule.of(CALLS)  # thresholds_units (12,): notifies
    own = rule.with_thresholds((50, 90), (3,))
    assert own.limit == replace(CALLS, thresholds=(50, 90), thresholds_units=(3,))
    assert own == replace(rule, limit=own.limit)  # only the limit's thresholds change
    assert rule.limit is CALLS and own.notifies
    silent = rule.with_thresholds((), ())
    assert silent.limit.thresholds == () and silent.limit.thresholds_units == ()
    assert not silent.notifies  # a hard limit with no threshold left: nothing to announce
    assert rule.with_thresholds((80,), ()).notifies
    assert rule.with_thresholds((), (5,)).notifies
    soft = Rule.of(SOFT_CALLS).with_thresholds((), ())
    assert soft.notifies  # a soft limit announces its maximum anyway


def test_grants_low_names_the_drawn_grants_at_or_below_their_threshold() -> None:
    first = Pot([Balance("b", 10, 7, 0, None), Balance("a", 10, 8, 0, None)])
    second = Pot([Balance("c", 5, 1, 0, None), Balance("d", 5, 5, 0, None)])
    pots = {("org", "calls"): first, ("org", "seats"): second}
    watched = {"a": 2, "b": 2, "c": 4, "d": 0, "gone": 9}
    # a: 2 left (at its threshold), b: 3 (above), c: 4 (at), d: 0 (at); sorted
    assert grants_low(pots, watched, ["d", "c", "b", "a"]) == ["a", "c", "d"]
    assert grants_low(pots, watched, iter(["c", "a", "c"])) == ["a", "c"]
    assert grants_low(pots, {"a": 1, "c": 3}, ["a", "c"]) == []  # both above
    assert grants_low(pots, watched, ["b"]) == []
    assert grants_low(pots, {"b": 2}, ["a", "c"]) == []  # drawn, but not watched
    assert grants_low(pots, watched, ["gone"]) == []  # watched, but in no pot
    assert grants_low(pots, watched, []) == []
    assert grants_low({}, watched, ["a"]) == []


def test_grants_pay_in_the_hot_path_beside_another_charge() -> None:
    """An event of two charges, one that grants pay: the general path draws them."""
    rows, _, pots = both_engines(
        [CALLS, SEATS],
        [("org", "calls", 5), ("org", "seats", 1)],
        [CounterState(used=9), CounterState()],
        [2, None],
    )
    assert [row[4] for row in rows] == ["allowed", "allowed"]
    assert rows[0][12] == [["g1", 2]] and len(rows[1]) == 12
    assert pots[0] is not None and pots[0].granted[MONTH[0]] == 4


@pytest.mark.parametrize("pots", [[None], [0]])
def test_a_free_charge_fits_past_a_lowered_maximum_and_adds_no_overage(
    pots: list[int | None],
) -> None:
    """A cost of 0 (a seat already held) fits where usage is past the maximum."""
    for limit in (CALLS.with_maximum(8), replace(SOFT_CALLS, maximum=8)):
        rows, _, _ = both_engines([limit], [("org", "calls", 0)], [CounterState(used=9)], pots)
        assert rows[0][3:5] == [True, "allowed"] and rows[0][8] == 0


def test_a_rule_knows_what_deciding_it_needs() -> None:
    paced = Limit("p", maximum=9, period="1d", window="calendar", pacing=True)
    assert Rule.of(paced).needs == rule_needs(paced, priced=False) != frozenset()
    plain = Limit("calls", maximum=3, period="1d")
    assert Rule.of(plain, priced=True).needs == rule_needs(plain, priced=True)
    assert Rule.of(plain, priced=True).needs != Rule.of(plain).needs
