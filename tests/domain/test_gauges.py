"""Gauges in the domain: a level per window, not a sum (`windows.gauge_level`).

The general engine's rules (`decide_event` through `evaluate_window`) and
the hot path's (`rules.decide`) must agree on gauges as they do on sums:
the seeded streams of ``test_rules.Engines`` run here over gauge limits
(``max`` and ``latest``; hard, soft with thresholds, shadow; first-use and
calendar; stacked with a sum), with levels of 0 and late reports. Then
examples of each rule, the refusals of `Limit`, and the recomputation a
void makes (`corrections.gauge_after`).
"""

from __future__ import annotations

import json

import pytest
from test_rules import SECOND, START_US, Engines, random_stream

from metering.domain.corrections import gauge_after, gauge_reports
from metering.domain.decisions import ChargeDecision, ChargeInput, decide_event
from metering.domain.events import refuse_free, validate_charge_cost
from metering.domain.limits import Limit
from metering.domain.notifications import notices_for
from metering.domain.rules import Rule, decide, fresh_state
from metering.domain.state import CounterKey, CounterState
from metering.domain.windows import evaluate_window, gauge_level
from metering.errors import InvalidInput, InvalidLimit

GAUGES = [
    Limit("peak", maximum=10, period="1h", window="calendar", aggregation="max"),
    Limit(
        "level",
        maximum=8,
        period="1mo",
        window="calendar",
        enforcement="soft",
        aggregation="latest",
        thresholds=(50, 100),
        thresholds_units=(3,),
    ),
    Limit("fu_peak", maximum=6, period="30m", aggregation="max", thresholds=(80,)),
    Limit("fu_latest", maximum=5, period="10m", aggregation="latest"),
    Limit("shadow_peak", maximum=4, period="1h", enforcement="shadow", aggregation="max"),
    Limit(
        "soft_peak",
        maximum=5,
        period="1h",
        enforcement="soft",
        aggregation="max",
        thresholds=(100,),
    ),
    Limit("sum", maximum=20, period="1h", window="calendar"),
]
STEPS_US = [0, 0, 1, SECOND, 20 * SECOND, 61 * SECOND, 900 * SECOND, 3600 * SECOND]


def _stream(seed: int, events: int) -> Engines:
    return random_stream(
        GAUGES,
        seed,
        events,
        STEPS_US,
        lambda rng, name: rng.choice([1, 2, 3, 7]) if name == "sum" else rng.randint(0, 12),
    )


SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_hot_path_decides_gauges_like_decide_event(seed: int) -> None:
    _stream(seed, events=200)


def test_the_gauge_streams_reach_every_outcome_and_notice() -> None:
    seen: set[str] = set()
    for seed in SEEDS:
        seen |= _stream(seed, events=200).seen
    assert seen >= {
        "allowed",
        "denied",
        "overage",
        "mark denied",
        "mark would_deny",
        "mark threshold:50",
        "mark threshold:100",
        "mark threshold:80",
        "mark units:3",
        "mark exceeded",
        "retry never",
    }


# --------------------------------------------------------------------------- examples

WINDOW = (START_US, START_US + 3600 * SECOND)
KEY = CounterKey("g", "org", *WINDOW)


def _gauge(aggregation: str = "max", enforcement: str = "hard", **options: object) -> Limit:
    return Limit(
        "g",
        maximum=10,
        period="1h",
        window="calendar",
        enforcement=enforcement,  # type: ignore[arg-type]
        aggregation=aggregation,  # type: ignore[arg-type]
        **options,  # type: ignore[arg-type]
    )


def _report(limit: Limit, state: CounterState, value: int, at_us: int = START_US) -> ChargeDecision:
    verdict = decide_event([ChargeInput(limit, KEY, state, value)], at_us)
    return verdict.charges[0]


def _levels(limit: Limit, values: list[int]) -> list[tuple[str, int]]:
    """Each report's (outcome, used), one a second, through both engines."""
    state = CounterState()
    hot = fresh_state()
    rule = Rule.of(limit)
    found = []
    for index, value in enumerate(values):
        at_us = START_US + index * SECOND
        verdict = decide_event([ChargeInput(limit, KEY, state, value)], at_us)
        state = verdict.new_states[0]
        outcome = decide([rule], [("org", "g", value)], [WINDOW], [hot], at_us, None, None)
        assert outcome.rows == [verdict.charges[0].to_row()]
        found.append((verdict.charges[0].outcome, verdict.charges[0].used))
    return found


def test_max_keeps_the_peak() -> None:
    assert _levels(_gauge("max"), [4, 9, 2, 0, 10]) == [
        ("allowed", 4),
        ("allowed", 9),
        ("allowed", 9),
        ("allowed", 9),
        ("allowed", 10),
    ]


def test_latest_takes_the_last_allowed_level_0_included() -> None:
    assert _levels(_gauge("latest"), [4, 9, 2, 0]) == [
        ("allowed", 4),
        ("allowed", 9),
        ("allowed", 2),
        ("allowed", 0),
    ]


def test_hard_denies_a_level_above_the_maximum_and_keeps_used() -> None:
    assert _levels(_gauge("max"), [6, 11, 3]) == [("allowed", 6), ("denied", 6), ("allowed", 6)]
    assert _levels(_gauge("latest"), [6, 11, 3]) == [("allowed", 6), ("denied", 6), ("allowed", 3)]
    denied = _report(_gauge("latest"), CounterState(used=6, tat_us=START_US), 11)
    assert (denied.allowed, denied.retry_at_us, denied.remaining) == (False, None, 4)


def test_a_level_within_a_lowered_maximum_is_allowed_without_overage_when_hard() -> None:
    """An entitlement below the peak: a level that fits is allowed, never overage on hard."""
    lowered = _gauge("max").with_maximum(5)
    charge = _report(lowered, CounterState(used=9), 4)
    assert (charge.outcome, charge.used, charge.overage, charge.remaining) == ("allowed", 9, 0, 0)
    assert _report(lowered, CounterState(used=9), 6).outcome == "denied"


def test_soft_bills_the_level_beyond_the_maximum() -> None:
    assert _levels(_gauge("max", "soft"), [12, 7]) == [("overage", 12), ("overage", 12)]
    assert _levels(_gauge("latest", "soft"), [12, 7]) == [("overage", 12), ("allowed", 7)]
    charge = _report(_gauge("max", "soft"), CounterState(used=8), 13)
    assert (charge.overage, charge.remaining) == (3, 0)


def test_shadow_records_what_hard_would_deny() -> None:
    assert _levels(_gauge("max", "shadow"), [5, 12, 7]) == [
        ("allowed", 5),
        ("would_deny", 5),
        ("allowed", 7),
    ]


def test_a_late_report_does_not_replace_a_newer_latest_level() -> None:
    limit = _gauge("latest")
    level, at = gauge_level("latest", 6, START_US + 10, 2, START_US)
    assert (level, at) == (6, START_US + 10)
    assert gauge_level("latest", 6, START_US + 10, 2, START_US + 10) == (2, START_US + 10)
    assert gauge_level("max", 6, None, 2, START_US) == (6, None)
    evaluation = evaluate_window(limit, CounterState(used=6, tat_us=START_US + 10), 2, WINDOW, 0)
    assert evaluation.fits and evaluation.applied == CounterState(used=6, tat_us=START_US + 10)


def test_thresholds_fire_when_the_level_crosses_them_upwards() -> None:
    limit = _gauge("latest", "soft", thresholds=(50,), thresholds_units=(3,))
    before = CounterState(used=2, tat_us=START_US)
    verdict = decide_event([ChargeInput(limit, KEY, before, 11)], START_US + SECOND)
    notices = notices_for(limit, KEY, before, verdict.new_states[0], verdict.charges[0], "e")
    assert sorted(n.mark for n in notices) == ["exceeded", "threshold:50", "units:3"]
    # Down and up again past the soft maximum: a candidate again (its mark keeps it once).
    over = CounterState(used=12, tat_us=START_US)
    verdict = decide_event([ChargeInput(limit, KEY, over, 4)], START_US + SECOND)
    assert notices_for(limit, KEY, over, verdict.new_states[0], verdict.charges[0], "e") == []


def test_a_void_recomputes_the_level_from_the_reports_left() -> None:
    def row(limit: str, value: int, outcome: str = "allowed") -> list[object]:
        return ["org", limit, value, True, outcome, value, 0, 10, 0, START_US, WINDOW[1], None]

    found = [
        ("a", START_US + 5, 1, json.dumps([row("g", 7)])),
        ("b", START_US + 9, 2, json.dumps([row("g", 3), row("other", 50)])),
        ("c", START_US + 1, 3, json.dumps([row("g", 12, "would_deny")])),
        ("d", START_US + 9, 1, json.dumps([row("g", 4)])),
    ]
    reports = gauge_reports(KEY, found)
    assert sorted(r[2] for r in reports) == ["a", "b", "d"]  # c consumed nothing
    state = CounterState(used=9, denied_count=2, tat_us=START_US + 20)
    assert gauge_after("max", state, reports) == CounterState(used=7, denied_count=2)
    # The latest by event time, ties by decision: b (decided at 2) after d (at 1).
    latest = gauge_after("latest", state, reports)
    assert latest == CounterState(used=3, denied_count=2, tat_us=START_US + 9)
    assert gauge_after("max", state, []) == CounterState(used=0, denied_count=2)


def test_cost_0_is_a_gauge_level_and_refused_elsewhere() -> None:
    assert validate_charge_cost(0) == 0
    for bad in (False, 0.0, -1):
        with pytest.raises(InvalidInput):
            validate_charge_cost(bad)
    assert refuse_free(_gauge("max"), 0) is None
    error = refuse_free(Limit("s", maximum=3, period="1h"), 0)
    assert error is not None and error.field == "cost"
    assert str(error) == "cost: must be between 1 and 1000000000000, got 0"
    assert refuse_free(Limit("s", maximum=3, period="1h"), 1) is None


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"algorithm": "token_bucket"}, "aggregation"),
        ({"distinct": "user"}, "aggregation"),
        ({"currency": "USD"}, "aggregation"),
        ({"dimensions": ("route",)}, "dimensions"),
        ({"aggregation": "avg"}, "aggregation"),
    ],
)
def test_a_gauge_refuses_what_adds_usage_up(options: dict[str, object], field: str) -> None:
    values: dict[str, object] = {"aggregation": "max", **options}
    with pytest.raises(InvalidLimit) as caught:
        Limit("g", maximum=5, period="1h", **values)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_a_concurrent_gauge_is_refused() -> None:
    with pytest.raises(InvalidLimit) as caught:
        Limit("g", maximum=5, algorithm="concurrent", aggregation="latest")
    assert caught.value.field == "aggregation"


def test_aggregation_round_trips_through_a_dict() -> None:
    limit = _gauge("latest", "soft")
    assert limit.to_dict()["aggregation"] == "latest"
    assert Limit.from_dict(limit.to_dict()) == limit
    assert Limit("s", maximum=3, period="1h").to_dict()["aggregation"] == "sum"
    assert Rule.of(limit).gauge == "latest" and Rule.of(Limit("s", 3, "1h")).gauge is None
