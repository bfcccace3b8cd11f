"""Gauges through the engines, on SQLite and PostgreSQL.

A gauge (``aggregation="max"`` or ``"latest"``) is decided on the fast path
(`Meter.consume`, `Meter.apply_records`; a single event on PostgreSQL by the
one-trip function) and by the reference engine (the reference path)
alike: the same stream through each, each on its own database, gives the
same results, counters, notifications and corrections, voids of the peak
included. Then the contract, example by example: the peak kept, the latest
replaced, a hard denial keeping ``used``, soft overage in the overage
report, a void recomputing the level, an entitlement lowering the
maximum, a threshold crossed by the level, and the refusals.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from budgets import examples
from decision_paths import apply_reference, refusing
from differential import SETTINGS, reference_events, stored
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.domain.needs import Need
from metering.engine.answers import Declined
from metering.engine.one_trip import ONE_TRIP_IMPLEMENTS, prepare
from metering.errors import InvalidInput
from metering.reports import overage_report
from metering.upkeep.audit import run_audit
from metering.webhooks import Webhooks

START = datetime(2026, 11, 30, 22, 10, tzinfo=UTC)  # a month's end is near
LIMITS = [
    Limit(
        "storage", maximum=100, period="1mo", window="calendar", aggregation="max", thresholds=(80,)
    ),
    Limit(
        "nodes",
        maximum=10,
        period="1h",
        window="calendar",
        enforcement="soft",
        aggregation="latest",
        thresholds=(100,),
    ),
    Limit("largest", maximum=50, period="30m", aggregation="max", thresholds_units=(40,)),
    Limit("seen", maximum=6, period="20m", aggregation="latest"),
    Limit(
        "shadow_nodes",
        maximum=5,
        period="1h",
        window="calendar",
        enforcement="shadow",
        aggregation="max",
    ),
    Limit("calls", maximum=10, period="1h", window="calendar"),
]
NAMES = [limit.name for limit in LIMITS]
SUBJECTS = ["org-1", "org-2"]


# -- the same stream through both engines -------------------------------------------

charge = st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(NAMES), st.integers(0, 120))
event = st.fixed_dictionaries(
    {
        "id": st.integers(0, 30),
        "charges": st.lists(charge, min_size=1, max_size=3, unique_by=lambda c: c[:2]),
        "offset_seconds": st.sampled_from([0, 0, -30, -700, 60]),
    }
)
batch = st.fixed_dictionaries(
    {
        "advance_seconds": st.sampled_from([0, 20, 61, 900, 1900, 3600]),
        "events": st.lists(event, min_size=1, max_size=8),
        "voids": st.lists(st.integers(0, 30), max_size=2),
        "entitlements": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.sampled_from(NAMES),
                st.one_of(st.none(), st.integers(1, 90)),
            ),
            max_size=1,
        ),
    }
)
streams = st.lists(batch, min_size=1, max_size=5)


def _run(fast_url: str, general_url: str, stream: list[dict[str, Any]]) -> None:
    clock = FrozenClock(START)
    with Meter(fast_url, clock=clock) as fast, Meter(general_url, clock=clock) as general:
        for meter in (fast, general):
            meter.set_limits(LIMITS)
        for number, spec in enumerate(stream):
            clock.advance(seconds=spec["advance_seconds"])
            now = clock()
            for subject, limit, maximum in spec["entitlements"]:
                for meter in (fast, general):
                    meter.set_entitlement(subject, limit, maximum)
            events = [
                make_event(
                    [c for c in item["charges"] if c[2] > 0 or c[1] != "calls"],
                    now + timedelta(seconds=item["offset_seconds"]),
                    f"ev-{item['id']}",
                )
                for item in spec["events"]
                if any(c[2] > 0 or c[1] != "calls" for c in item["charges"])
            ]
            records = [e.record() for e in events]
            before = reference_events()
            fast.apply_records(records, invalid="reject")
            if not any(c[1] in ("largest", "seen") for e in spec["events"] for c in e["charges"]):
                assert reference_events() == before, "the fast path left the batch"
            apply_reference(general._engine, records, fast.database.now_us(), "reject", ())
            for index, target in enumerate(spec["voids"]):
                outcomes = [
                    _void(meter, f"ev-{target}", f"c-{number}-{index}") for meter in (fast, general)
                ]
                assert outcomes[0] == outcomes[1]
            assert stored(fast) == stored(general), number
        assert _corrections(fast) == _corrections(general)


def _void(meter: Meter, event_id: str, correction_id: str) -> object:
    try:
        return meter.void(event_id, "test", correction_id=correction_id).to_dict()
    except Exception as exc:  # the same refusal on both sides
        return type(exc).__name__, str(exc)


def _corrections(meter: Meter) -> list[object]:
    return [c.to_dict() for c in meter.corrections()]


@pytest.mark.slow
@settings(SETTINGS, max_examples=examples(40))
@given(stream=streams)
def test_sqlite_fast_path_decides_gauges_as_the_reference(
    sqlite_template: Path, stream: list[dict[str, Any]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        fast = copy_sqlite(sqlite_template, base / "fast.db")
        _run(fast, copy_sqlite(sqlite_template, base / "general.db"), stream)


@contextmanager
def _two_databases(server: PostgresServer, template: str) -> Iterator[tuple[str, str]]:
    with server.copy_of(template, "gauge") as fast, server.copy_of(template, "gauge") as general:
        yield fast, general


@pytest.mark.postgres
@settings(SETTINGS, max_examples=examples(20))
@given(stream=streams)
def test_postgresql_fast_path_decides_gauges_as_the_reference(
    postgres_server: PostgresServer, pg_template_url: str, stream: list[dict[str, Any]]
) -> None:
    with _two_databases(postgres_server, pg_template_url) as (fast_url, general_url):
        _run(fast_url, general_url, stream)


# -- one stream by Meter.consume, against the reference ------------------------------

STEPS: list[tuple[Any, ...]] = [
    ("storage", 40, 0),
    ("storage", 90, 0),  # crosses 80%
    ("storage", 30, 0),  # the peak stays
    ("storage", 120, 0),  # above the maximum: denied, used stays 90
    ("storage", 0, 0),
    ("nodes", 4, 0),
    ("nodes", 12, 0),  # soft: overage 2, crosses 100%
    ("nodes", 3, -30),  # late: allowed, the newer level stays
    ("nodes", 7, 0),
    ("largest", 45, 0),
    ("largest", 60, 0),
    ("shadow_nodes", 9, 0),  # would_deny
]


def _general_url(db_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if db_url.startswith("sqlite"):
        yield copy_sqlite(request.getfixturevalue("sqlite_template"), tmp_path / "general.db")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    with server.copy_of(request.getfixturevalue("pg_template_url"), "gauge") as url:
        yield url


@pytest.fixture
def general_url(db_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from _general_url(db_url, request, tmp_path)


def _refuse(*_args: object) -> None:
    raise AssertionError("the reference engine ran")


def test_consume_decides_gauges_as_the_reference(db_url: str, general_url: str) -> None:
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as fast, Meter(general_url, clock=clock) as general:
        for meter in (fast, general):
            meter.set_limits(LIMITS)
            meter.set_entitlement("org-2", "storage", 50)
        refusing(fast._engine, _refuse)
        for number, (limit, value, offset) in enumerate(STEPS):
            clock.advance(seconds=1)
            for subject in SUBJECTS:
                when = clock() + timedelta(seconds=offset)
                event_id = f"{subject}-{number}"
                fast.consume(subject, limit, value, event_id=event_id, occurred_at=when)
                ev = make_event([(subject, limit, value)], when, event_id)
                apply_reference(general._engine, [ev.record()], general.database.now_us(), "raise")
        assert stored(fast) == stored(general)
        for meter in (fast, general):
            meter.void("org-1-1", "the peak was a mistake", correction_id="c-1")
            meter.void("org-1-8", "the last level too", correction_id="c-2")
        assert stored(fast) == stored(general)
        assert _used(fast, "org-1", "storage") == 40  # 90 voided: 40, 30 and 0 remain
        assert _used(fast, "org-1", "nodes") == 12  # 7 voided; the late 3 is older than 12


# -- the contract, example by example ------------------------------------------------


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(START)) as meter:
        meter.set_limits(LIMITS)
        yield meter


def _used(meter: Meter, subject: str, limit: str) -> int:
    [counter] = meter.counters(subject, limit)
    return counter.used


def _payloads(meter: Meter, kind: str) -> list[dict[str, Any]]:
    return [json.loads(p)["data"] for _, _, p in Webhooks(meter).messages(kind)]


def test_max_keeps_the_peak_and_denies_above_the_maximum(meter: Meter) -> None:
    answers = [meter.consume("org-1", "storage", v) for v in (40, 90, 30, 120, 0)]
    assert [(d.outcome, d.used) for d in answers] == [
        ("allowed", 40),
        ("allowed", 90),
        ("allowed", 90),
        ("denied", 90),
        ("allowed", 90),
    ]
    assert (answers[3].retry_at, answers[3].remaining) == (None, 10)
    [counter] = meter.counters("org-1", "storage")
    assert (counter.used, counter.denied_count, counter.denied_cost) == (90, 1, 120)
    assert [p["threshold"] for p in _payloads(meter, "limit.threshold")] == [80]
    assert len(_payloads(meter, "limit.denied")) == 1


def test_latest_replaces_the_level_and_soft_bills_the_overage(meter: Meter) -> None:
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    for value in (4, 12, 7):
        clock.advance(seconds=1)
        meter.consume("org-1", "nodes", value)
    assert _used(meter, "org-1", "nodes") == 7
    clock.advance(seconds=1)
    late = meter.consume("org-1", "nodes", 15, occurred_at=clock() - timedelta(seconds=10))
    assert (late.outcome, late.used) == ("allowed", 7)  # older than the level: kept
    clock.advance(seconds=1)
    over = meter.consume("org-1", "nodes", 13)
    assert (over.outcome, over.used, over.charges[0].overage) == ("overage", 13, 3)
    [row] = overage_report(meter, period="2026-11", limit="nodes")
    assert (row.used, row.maximum, row.overage, row.denied) == (13, 10, 3, 0)
    assert [p["used"] for p in _payloads(meter, "limit.exceeded")] == [12]  # once per window


def test_a_peak_above_the_maximum_is_the_soft_overage_in_the_report(db_url: str) -> None:
    soft = Limit(
        "disk", maximum=100, period="1mo", window="calendar", enforcement="soft", aggregation="max"
    )
    with Meter(db_url, clock=FrozenClock(START)) as meter:
        meter.set_limit(soft)
        for value in (80, 130, 90):
            meter.consume("org-1", "disk", value)
        [row] = overage_report(meter, period="2026-11", limit="disk")
        assert (row.used, row.overage, row.utilisation_percent) == (130, 30, 130.0)


def test_a_hard_gauge_never_shows_overage_in_the_report(meter: Meter) -> None:
    meter.consume("org-1", "storage", 90)
    meter.consume("org-1", "storage", 150)
    [row] = overage_report(meter, period="2026-11", limit="storage")
    assert (row.used, row.overage, row.denied, row.denied_events) == (90, 0, 150, 1)


def test_a_void_of_the_peak_recomputes_it_from_the_ledger(meter: Meter) -> None:
    for number, value in enumerate((40, 90, 30)):
        meter.consume("org-1", "storage", value, event_id=f"s-{number}")
    meter.consume("org-1", "storage", 120, event_id="denied")
    correction = meter.void("s-1", "wrong reading")
    assert _used(meter, "org-1", "storage") == 40
    assert correction.to_dict()["charges"][0]["cost"] == 90
    meter.void("s-2", "wrong reading")  # not the peak: the peak stays
    assert _used(meter, "org-1", "storage") == 40
    meter.void("s-0", "wrong reading")
    [counter] = meter.counters("org-1", "storage")
    assert (counter.used, counter.denied_count) == (0, 1)  # nothing left; denials stay


def test_a_void_of_the_latest_level_goes_back_to_the_one_before(meter: Meter) -> None:
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    for number, value in enumerate((4, 9, 6)):
        clock.advance(seconds=1)
        meter.consume("org-1", "nodes", value, event_id=f"n-{number}")
    meter.void("n-2", "test")
    assert _used(meter, "org-1", "nodes") == 9
    # The level's instant came back too: a report older than 9's is still too old.
    late = meter.consume(
        "org-1", "nodes", 2, occurred_at=clock() - timedelta(seconds=1, microseconds=1)
    )
    assert late.used == 9


def test_a_void_after_a_reset_ignores_the_reports_the_reset_cleared(meter: Meter) -> None:
    meter.consume("org-1", "storage", 90, event_id="before")
    meter.reset(subject="org-1", limit="storage")
    meter.consume("org-1", "storage", 20, event_id="after-1")
    meter.consume("org-1", "storage", 30, event_id="after-2")
    meter.void("after-2", "test")
    assert _used(meter, "org-1", "storage") == 20  # not 90: the reset cleared it


def test_a_void_in_a_window_over_before_a_gauge_became_a_sum_recomputes_its_peak(
    meter: Meter,
) -> None:
    # November's window holds the peak of 40 and 30; storage adds up from
    # December. Voiding November's reports after that still reads them as
    # levels, by the aggregation their era had, not today's.
    meter.consume("org-1", "storage", 40, event_id="peak")
    meter.consume("org-1", "storage", 30, event_id="lower")
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    clock.advance(hours=2)  # December
    meter.set_limit(Limit("storage", maximum=100, period="1mo", window="calendar"))
    meter.consume("org-1", "storage", 5)
    meter.void("peak", "wrong reading")
    assert [c.used for c in meter.counters("org-1", "storage")] == [30, 5]  # not 0
    meter.void("lower", "wrong reading")
    assert [c.used for c in meter.counters("org-1", "storage")] == [0, 5]
    assert run_audit(meter, full=True).violations == ()


def test_an_entitlement_lowers_the_maximum_in_force(meter: Meter) -> None:
    meter.consume("org-1", "storage", 70)
    meter.set_entitlement("org-1", "storage", 60)
    below = meter.consume("org-1", "storage", 50)
    assert (below.outcome, below.used, below.maximum, below.charges[0].overage) == (
        "allowed",
        70,
        60,
        0,
    )
    above = meter.consume("org-1", "storage", 65)
    assert (above.outcome, above.used, above.maximum) == ("denied", 70, 60)


def test_a_threshold_fires_once_when_the_level_crosses_it(meter: Meter) -> None:
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    for value in (30, 45, 10, 48):  # 40 units crossed at 45, and again at 48 after going down
        clock.advance(seconds=1)
        meter.consume("org-1", "largest", value)
    [notice] = _payloads(meter, "limit.threshold")
    assert (notice["threshold_units"], notice["used"]) == (40, 45)


def test_check_reports_what_a_level_would_do(meter: Meter) -> None:
    meter.consume("org-1", "storage", 70)
    assert meter.check("org-1", "storage", 95).used == 95
    assert meter.check("org-1", "storage", 20).used == 70
    assert not meter.check("org-1", "storage", 101).allowed
    assert _used(meter, "org-1", "storage") == 70


def test_cost_0_is_refused_on_a_sum_on_every_path(meter: Meter) -> None:
    for call in (
        lambda: meter.consume("org-1", "calls", 0),
        lambda: meter.check("org-1", "calls", 0),
        lambda: meter.consume(charges=[("org-1", "storage", 0), ("org-1", "calls", 0)]),
    ):
        with pytest.raises(InvalidInput) as caught:
            call()
        assert str(caught.value) == "cost: must be between 1 and 1000000000000, got 0"
    [answer] = meter.apply_records([make_event([("org-1", "calls", 0)], START, "q-1").record()])
    record = answer.record
    assert record is not None and record.outcome == "rejected"
    assert record.reason == "cost: must be between 1 and 1000000000000, got 0"
    assert meter.counters("org-1") == []


@pytest.mark.parametrize(
    ("action", "words"),
    [
        (lambda m: m.grant("org-1", "storage", 10), "gauge"),
        (lambda m: m.reserve("org-1", "storage", 10), "gauge"),
        (lambda m: m.set_price("storage", "0.01", "USD"), "gauge"),
    ],
    ids=["grant", "reserve", "price"],
)
def test_what_adds_usage_up_is_refused_on_a_gauge(meter: Meter, action: Any, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        action(meter)
    assert words in str(caught.value)
    assert meter.counters("org-1") == []


def test_a_priced_limit_cannot_become_a_gauge(meter: Meter) -> None:
    meter.set_price("calls", "0.01", "USD")
    with pytest.raises(InvalidInput) as caught:
        meter.set_limit(Limit("calls", maximum=10, period="1h", aggregation="max"))
    assert caught.value.field == "aggregation"
    assert not meter.get_limit("calls").is_gauge


def test_a_gauge_is_never_leased_its_reports_are_decided_exactly(meter: Meter) -> None:
    answers = [meter.lease("org-1", "storage", value) for value in (30, 60, 20, 101, 50)]
    assert [(d.outcome, d.used) for d in answers] == [
        ("allowed", 30),
        ("allowed", 60),
        ("allowed", 60),
        ("denied", 60),
        ("allowed", 60),
    ]
    assert meter.settle_leases(everything=True) == 0
    assert _used(meter, "org-1", "storage") == 60


def test_the_one_trip_function_is_called_with_a_gauges_aggregation(sqlite_url: str) -> None:
    with Meter(sqlite_url, clock=FrozenClock(START)) as meter:
        meter.set_limits(LIMITS)
        meter.consume("org-1", "calls")  # the limits are cached now
        cache = meter._engine.limits
        now_us = meter.database.now_us()
        gauge = make_event([("org-1", "storage", 5)], START, "g-1").record()
        plain = make_event([("org-1", "calls", 1)], START, "p-1").record()
        called = prepare(cache, gauge, now_us)
        assert not isinstance(called, Declined) and Need.GAUGE in ONE_TRIP_IMPLEMENTS
        [charge] = json.loads(called[6])
        assert charge[2] == 5 and charge[19] == "max"  # the level reported, kept as the peak
        assert not isinstance(prepare(cache, plain, now_us), Declined)
