"""Which path decides what, and what crosses processes: the cases the
differential suite (``test_differential.py``) does not reach.

Ordinary batches, checks, priced events and seat events never reach the
reference engine (it is made to refuse, or its metric stays put); four
processes (one on the fast path) charging one hard limit get exactly its
maximum; seat events add no round trip; a limit or a price changed in
another process applies to the very next decision and check; a repeat of a
stored id is judged against the stored result.
"""

from __future__ import annotations

import json
import multiprocessing
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from decision_paths import refusing
from differential import BATCH_LIMITS, START, SUBJECTS, reference_events, stored
from round_trips import count_round_trips
from sqlalchemy import func, select
from test_differential import on_path

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.events import make_event
from metering.engine.one_trip import STATS
from metering.storage.tables import counters, results, webhook_deliveries
from metering.webhooks import Webhooks

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
LIMITS = [limit for limit in BATCH_LIMITS if limit.name in ("cal", "fu", "bucket")]
SEAT_LIMITS = [
    Limit("seats", maximum=2, period="1h", window="calendar", distinct="user"),
    Limit("fu_seats", maximum=2, period="30m", distinct="user"),
    Limit("calls", maximum=5, period="1h", window="calendar"),
]


# -- batches and checks ----------------------------------------------------------

# A check on the direct path's own connections, or on SQLAlchemy's (`OnConnection`:
# in-memory SQLite, SQLite URLs with options), with the same statements.
VIAS = ["direct", "connection"]


def checking_on(meter: Meter, via: str) -> None:
    """``meter`` checks on the path ``via``: the ones before it are taken away."""
    if via == "connection":
        paths = meter._engine.paths
        meter._engine.paths = [p for p in paths if p.name in ("connection", "reference")]


def test_a_check_of_an_in_memory_database_never_reaches_the_general_engine() -> None:
    clock = FrozenClock(START)
    with Meter("sqlite://", clock=clock) as meter:
        meter.set_limits(LIMITS)
        meter.consume(charges=[("org-1", "fu", 3), ("org-1", "cal", 2)])
        refusing(meter._engine, _refuse, applies=False)
        decision = meter.check(charges=[("org-1", "fu", 1), ("org-1", "cal", 1)])
        assert [c.used for c in decision.charges] == [4, 3]
        assert meter.check("org-1", "cal", 9).denied_by == ("cal",)


def test_the_hot_path_runs_for_ordinary_batches(sqlite_url: str) -> None:
    """Not every batch falls back: an ordinary one never reaches the general engine."""
    clock = FrozenClock(START)
    with Meter(sqlite_url, clock=clock) as meter:
        meter.set_limits(LIMITS)

        def refuse(*_args: object) -> None:
            raise AssertionError("the general engine ran")

        refusing(meter._engine, refuse, checks=False)
        events = [make_event([(s, "fu", 1), (s, "cal", 1)], clock()) for s in SUBJECTS]
        answers = meter.apply_records([e.record() for e in events])
        assert [answer.kind for answer in answers] == ["new"] * len(SUBJECTS)


def _tighten(url: str) -> None:
    with Meter(url, clock=FrozenClock(START)) as other:
        other.set_limit(Limit("cal", maximum=1, period="1h", window="calendar"))


def test_a_limit_changed_in_another_process_applies_to_the_next_decision(db_url: str) -> None:
    import multiprocessing

    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        assert meter.consume("org-1", "cal").allowed  # the limits are now cached here
        process = multiprocessing.get_context("fork").Process(target=_tighten, args=(db_url,))
        process.start()
        process.join(60)
        assert process.exitcode == 0
        decision = meter.consume("org-1", "cal")
        assert (decision.outcome, decision.maximum) == ("denied", 1)


def test_a_repeat_of_a_stored_id_is_judged_against_the_stored_result(sqlite_url: str) -> None:
    """ev-0 is stored; a batch reuses it with other charges, then with the stored ones."""
    clock = FrozenClock(START)
    with Meter(sqlite_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        meter.apply([make_event([("org-2", "cal", 1)], clock(), "ev-0")])
        batch = [
            make_event([("org-1", "cal", 1)], clock(), "ev-0"),
            make_event([("org-2", "cal", 1)], clock(), "ev-0"),
        ]
        answers = meter.apply_records([e.record() for e in batch])
        assert [answer.kind for answer in answers] == ["conflict", "duplicate"]


@pytest.mark.parametrize("via", VIAS)
def test_an_ordinary_check_never_reaches_the_general_engine(db_url: str, via: str) -> None:
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        checking_on(meter, via)
        meter.set_limits(LIMITS)
        meter.consume(charges=[("org-1", "fu", 3), ("org-1", "cal", 2)])

        def refuse(*_args: object) -> None:
            raise AssertionError("the general engine ran")

        refusing(meter._engine, refuse, applies=False)
        decision = meter.check(
            charges=[("org-1", "fu", 1), ("org-1", "cal", 1), ("org-1", "bucket", 1)]
        )
        assert decision.allowed
        assert decision.event_id is None
        assert [c.used for c in decision.charges] == [4, 3, 1]
        assert meter.check("org-1", "fu", 2).denied_by == ("fu",)
        # Nothing was consumed.
        assert [c.used for c in meter.counters("org-1") if c.limit == "fu"] == [3]


def test_a_limit_changed_in_another_process_applies_to_the_next_check(db_url: str) -> None:
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        assert meter.consume("org-1", "cal").allowed
        assert meter.check("org-1", "cal").allowed  # the limits are now cached here
        process = multiprocessing.get_context("fork").Process(target=_tighten, args=(db_url,))
        process.start()
        process.join(60)
        assert process.exitcode == 0
        decision = meter.check("org-1", "cal")
        assert (decision.outcome, decision.maximum) == ("denied", 1)


@pytest.mark.parametrize("via", VIAS)
def test_a_check_of_a_breaker_limit_never_reaches_the_general_engine(db_url: str, via: str) -> None:
    """Quarantined or not, a subject's check of a limit with a breaker is the
    fast path's, and steps no breaker."""
    clock = FrozenClock(START)
    guarded = Limit(
        "guarded",
        maximum=100_000,
        period="1h",
        window="calendar",
        breaker="10x",
        breaker_floor=0.1,
        quarantine_max=5,
    )
    with Meter(db_url, clock=clock) as meter:
        checking_on(meter, via)
        meter.set_limits([*LIMITS, guarded])
        for _ in range(62):  # 60 a second for a minute and more: org-1 trips
            assert meter.consume("org-1", "guarded", 60).allowed
            clock.advance(seconds=1)
        assert [q.subject for q in meter.quarantines()] == ["org-1"]
        before = meter.quarantines()
        checked = reference_events("check")
        assert not meter.check("org-1", "guarded", 1).allowed  # held to 5
        assert meter.check("org-2", "guarded", 60).allowed
        assert meter.check(charges=[("org-1", "cal", 1), ("org-2", "guarded", 1)]).allowed
        assert reference_events("check") == checked
        assert meter.quarantines() == before


@pytest.mark.parametrize("via", VIAS)
def test_a_check_of_a_granted_subject_never_reaches_the_general_engine(
    db_url: str, via: str
) -> None:
    """A grant (and an entitlement) pays what a check asks beyond the maximum;
    the fast path answers, and draws nothing."""
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        checking_on(meter, via)
        meter.set_limits(LIMITS)
        meter.set_entitlement("org-2", "cal", 7)
        meter.consume("org-1", "cal", 2)
        meter.grant("org-1", "cal", 3)
        refusing(meter._engine, _refuse)
        assert meter.check("org-1", "cal", 6).allowed  # 3 left of the maximum, then the grant's 3
        assert meter.check("org-1", "cal", 7).denied_by == ("cal",)
        assert meter.check("org-2", "cal", 7).allowed
        assert meter.check("org-2", "cal", 8).denied_by == ("cal",)
        assert [g.used for g in meter.grants("org-1")] == [0]


@pytest.mark.parametrize("via", VIAS)
def test_checks_change_nothing_stored(db_url: str, via: str) -> None:
    """Checks of every feature the fast check reads (counters, prices and a
    spend cap, seats, grants, a quarantine, thresholds crossed, denials)
    leave every table as it was."""
    clock = FrozenClock(START)
    guarded = Limit(
        "guarded",
        maximum=100_000,
        period="1h",
        window="calendar",
        breaker="10x",
        breaker_floor=0.1,
        quarantine_max=5,
    )
    with Meter(db_url, clock=clock) as meter:
        checking_on(meter, via)
        meter.set_limits(
            [
                *LIMITS,
                *SEAT_LIMITS,
                guarded,
                Limit("marked", maximum=10, period="1h", window="calendar", thresholds=(50,)),
                spend_limit("cap", "0.10", "USD", "1d", window="calendar"),
            ]
        )
        meter.set_price("calls", "0.01", "USD")
        meter.grant("org-1", "cal", 3, low=2)
        for _ in range(62):  # org-1 trips its breaker
            meter.consume("org-1", "guarded", 60)
            clock.advance(seconds=1)
        meter.consume(charges=[("org-1", "fu", 1), ("org-1", "cal", 1), ("org-1", "marked", 4)])
        meter.consume("org-1", "seats", metadata={"user": "a"})
        meter.consume("org-1", "calls", 4)
        before = stored(meter)
        refusing(meter._engine, _refuse)
        asked = [
            meter.check("org-1", "marked", 2),  # crosses 50 %
            meter.check("org-1", "marked", 20),  # denied: a first denial
            meter.check("org-1", "cal", 7),  # draws on the grant
            meter.check("org-1", "seats", metadata={"user": "b"}),  # a new seat
            meter.check("org-1", "calls", 7),  # denied by the cap
            meter.check("org-1", "guarded", 6),  # past its quarantine
            meter.check(charges=[("org-2", "fu", 1), ("org-2", "bucket", 1)]),  # new rows
        ]
        assert [d.allowed for d in asked] == [True, False, True, True, False, False, True]
        assert stored(meter) == before


# -- money ----------------------------------------------------------------------


def test_priced_events_are_decided_by_the_fast_path(db_url: str) -> None:
    """consume, apply and check of priced usage never reach the reference
    engine (the one-trip function decides the flat-priced single consumes on
    PostgreSQL); the cap denies all or nothing."""
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1h", window="calendar"),
                Limit("tokens", maximum=10**6, period="1d"),
                spend_limit("cap", "0.10", "USD", "1d", window="calendar"),
            ]
        )
        meter.set_price("calls", "0.01", "USD")
        meter.set_price("tokens", "0.001", "USD")
        applied, checked, one_trip = reference_events(), reference_events("check"), dict(STATS)
        assert meter.check("org-1", "calls", 3).allowed
        first = meter.consume(charges=[("org-1", "calls", 3), ("org-1", "tokens", 2)])
        assert first.allowed
        assert [(c.limit, c.price) for c in first.charges] == [
            ("calls", ("USD", 3)),
            ("tokens", ("USD", 0)),
            ("cap", None),
        ]
        assert first.charges[2].used == 3
        [denied] = meter.apply([make_event([("org-1", "calls", 8)], NOW, "e-2")])
        assert denied.denied_by == ("cap",)
        assert [(c.limit, c.used, c.price) for c in denied.charges] == [
            ("calls", 3, None),
            ("cap", 3, None),
        ]
        assert meter.consume("org-1", "calls", 7).allowed
        assert meter.check("org-1", "calls", 1).denied_by == ("cap",)
        assert meter.consume("org-2", "calls").charges[-1].used == 1
        assert reference_events() == applied
        assert reference_events("check") == checked
        decided_by_function = STATS["applied"] - one_trip.get("applied", 0)
        assert decided_by_function == (3 if db_url.startswith("postgresql") else 0)  # the consumes
        # What the fast path leaves (an event before its first-use window) is counted.
        late = meter.consume("org-1", "tokens", 1, occurred_at=NOW - timedelta(minutes=30))
        assert [(c.limit, c.price) for c in late.charges] == [("tokens", None)]  # before its price
        assert reference_events() == applied + 1


# -- notices, forecasts and breakers ------------------------------------------------


def test_notices_forecasts_and_breakers_are_decided_by_the_direct_path(db_url: str) -> None:
    """With the direct path alone: a runaway breaker trips (its row, its
    ``limit.quarantined`` with a release link, its first secret made, the
    quarantine's ``limit.denied``), a
    threshold crossed tells its forecast, a forecast lead's ``limit.forecast``
    and a grant's ``grant.low`` go out, each delivered to the endpoint; no
    other path is asked."""
    clock = FrozenClock(NOW)
    with Meter(db_url, clock=clock) as meter:
        engine = meter._engine
        engine.paths = [engine.path("direct")]
        meter.set_limits(
            [
                Limit(
                    "api",
                    maximum=100_000,
                    period="1d",
                    window="calendar",
                    breaker="10x",
                    breaker_floor=0.1,
                    quarantine_max=1000,
                ),
                Limit(
                    "calls",
                    maximum=1_000,
                    period="1d",
                    window="calendar",
                    thresholds=(50,),
                    forecast_lead="1h",
                ),
            ]
        )
        webhooks = Webhooks(meter)
        webhooks.add("https://example.com/hook")
        meter.grant("org-2", "calls", 10, low=5)
        denied_at = None
        for second in range(120):
            if not meter.consume("org-1", "api", 60).allowed:
                denied_at = second
                break
            clock.advance(seconds=1)
        assert denied_at == 62
        assert [(q.subject, q.limit) for q in meter.quarantines()] == [("org-1", "api")]
        meter.consume("org-1", "calls", 360)
        clock.advance(seconds=60)
        meter.consume("org-1", "calls", 360)  # crosses 50 %, runs out within the hour
        meter.consume("org-2", "calls", 1_000)
        meter.consume("org-2", "calls", 6)  # paid by the grant: 4 left, at or below 5
        found: dict[str, dict[str, Any]] = {}
        for _, kind, payload in webhooks.messages():
            data = json.loads(payload)["data"]
            if kind == "grant.low" or data["subject"] == "org-1":
                found[kind] = data
        kinds = {"limit.quarantined", "limit.denied", "limit.threshold", "limit.forecast"}
        assert set(found) == {*kinds, "grant.low"}
        assert str(found["limit.quarantined"]["release_path"]).startswith("/quarantine/release?")
        assert found["limit.threshold"]["exhausts_at"] == found["limit.forecast"]["exhausts_at"]
        assert (found["grant.low"]["subject"], found["grant.low"]["left"]) == ("org-2", 4)
        messages = len(webhooks.messages())
        with meter.sql_engine.connect() as connection:
            delivered = connection.execute(select(func.count()).select_from(webhook_deliveries))
            assert delivered.scalar_one() == messages


def _change_price(url: str) -> None:
    with Meter(url, clock=FrozenClock(NOW)) as other:
        other.set_price("calls", "0.05", "USD")


def test_a_price_changed_in_another_process_applies_to_the_next_decision(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1h", window="calendar"),
                spend_limit("cap", "1", "USD", "1d", window="calendar"),
            ]
        )
        meter.set_price("calls", "0.01", "USD", effective_from=NOW - timedelta(hours=1))
        assert meter.consume("org-1", "calls").charges[0].price == ("USD", 1)  # cached here
        process = multiprocessing.get_context("fork").Process(target=_change_price, args=(db_url,))
        process.start()
        process.join(60)
        assert process.exitcode == 0
        assert meter.consume("org-1", "calls").charges[0].price == ("USD", 5)
        assert meter.check("org-1", "calls").charges[0].price == ("USD", 5)


# -- seats ----------------------------------------------------------------------


def _refuse(*_args: object) -> None:
    raise AssertionError("the general engine ran")


def test_the_hot_path_decides_seat_events(db_url: str) -> None:
    """New values, repeats in a batch and across batches, a first-use and a
    calendar window, a denial and a repeat past the maximum: none reaches
    the general engine, on either database (and `check` neither)."""
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(SEAT_LIMITS)
        refusing(meter._engine, _refuse)
        users = ["a", "b", "a", "c", "b"]
        batch = [
            make_event(
                [("org-1", "seats", 1), ("org-1", "fu_seats", 1)], clock(), None, {"user": u}
            )
            for u in users
        ]
        answers = meter.apply_records([e.record() for e in batch])
        assert [a.record.outcome for a in answers if a.record] == [
            "allowed",
            "allowed",
            "allowed",
            "denied",  # a third value: both limits hold 2
            "allowed",
        ]
        assert meter.check("org-1", "seats", metadata={"user": "a"}).allowed
        assert meter.check("org-1", "seats", metadata={"user": "c"}).denied_by == ("seats",)
        meter.set_entitlement("org-1", "seats", 1)
        repeat = meter.consume("org-1", "seats", metadata={"user": "b"})
        assert (repeat.outcome, repeat.charges[0].cost, repeat.charges[0].overage) == (
            "allowed",
            0,
            0,
        )
        assert meter.seats("org-1", "seats") == ["a", "b"]
        clock.advance(seconds=3600)  # both windows roll over
        assert meter.consume("org-1", "fu_seats", metadata={"user": "c"}).allowed
        assert meter.seats("org-1", "fu_seats") == ["c"]


@pytest.mark.postgres
def test_seats_add_no_round_trip_on_postgresql(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The values' live events ride in the read's pipeline and the write's:
    a batch of seat events (first-use and calendar, new values and repeats)
    is two round trips, as any batch; a `check` is one."""
    trips = count_round_trips(monkeypatch)
    clock = FrozenClock(START)
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits(SEAT_LIMITS)
        meter.consume("org-1", "calls")  # warm: the limits are cached
        events = [
            make_event(
                [(f"org-{n % 7}", "seats", 1), (f"org-{n % 7}", "fu_seats", 1)],
                clock(),
                f"e{n}",
                {"user": f"u{n % 2}"},  # no denial: it would notify, after the write
            )
            for n in range(40)
        ]
        trips[0] = 0
        answers = meter.apply_records([e.record() for e in events])
        assert trips[0] == 2
        assert {a.record.outcome for a in answers if a.record} == {"allowed"}
        assert meter.seats("org-1", "fu_seats") == ["u0", "u1"]
        trips[0] = 0
        assert meter.check("org-1", "seats", metadata={"user": "u0"}).allowed
        assert trips[0] == 1


# -- processes on the one-trip function ----------------------------------------


def _hammer(url: str, index: int, calls: int, queue: Any) -> None:
    allowed = 0
    STATS.clear()
    with Meter(url) as meter:
        on_path("direct" if index == 3 else "one_trip", meter)  # one on the fast path alongside
        stacked = [("shared", "hard", 1), ("shared", "wide", 1)]
        for _ in range(calls):
            allowed += meter.consume(charges=stacked).allowed
    queue.put((index, allowed, STATS["applied"]))


def test_processes_consuming_one_hard_limit_get_exactly_the_maximum(pg_url: str) -> None:
    """Four processes (one of them on the old path) charge one hard limit and
    a first-use limit stacked: exactly the maximum is allowed, all or nothing,
    and the counters equal the ledger."""
    with Meter(pg_url) as meter:
        meter.set_limits(
            [
                Limit("hard", maximum=150, period="1d", window="calendar"),
                Limit("wide", maximum=10**6, period="1d"),
            ]
        )
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = [
        context.Process(target=_hammer, args=(pg_url, index, 60, queue)) for index in range(4)
    ]
    for process in processes:
        process.start()
    found = [queue.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert sum(allowed for _, allowed, _ in found) == 150
    assert sum(applied for _, _, applied in found) >= 120  # the function decided most
    with Meter(pg_url) as meter, meter.sql_engine.connect() as connection:
        used = dict(
            connection.execute(
                select(counters.c.limit_name, func.sum(counters.c.used)).group_by(
                    counters.c.limit_name
                )
            ).all()
        )
        ledger = connection.execute(
            select(func.count()).select_from(results).where(results.c.outcome == "allowed")
        ).scalar_one()
    assert used == {"hard": 150, "wide": 150}
    assert ledger == 150
