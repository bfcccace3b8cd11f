"""The runaway breaker through `Meter`, on SQLite and PostgreSQL, on a frozen
clock, by the fast path and by the reference engine (`on`): a synthetic burst
trips a minute after the now rate ran past the multiple, not before; a subject
with under a day of history never trips without a floor; a quarantined
subject is held to the quarantine maximum (no grants), on `consume` and
`check`; ``limit.quarantined`` goes out once per quarantine; a release ends
it without tripping again at once; a batch stores `step`'s floats, to the
bit. `tests/engine/test_differential.py` holds every path to the reference
engine with breaker limits in the streams."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from decision_paths import check_reference
from differential import reference_events
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.breaker import Breaker, step
from metering.domain.events import make_event
from metering.domain.instants import to_us
from metering.storage.tables import breakers
from metering.webhooks import Webhooks

START = datetime(2026, 11, 2, tzinfo=UTC)
FLOORED = Limit(
    "api",
    maximum=100_000,
    period="1d",
    window="calendar",
    breaker="10x",
    breaker_floor=0.1,
    quarantine_max=1000,
)
PATHS = ["fast", "reference"]


@pytest.fixture(params=PATHS)
def meter(request: pytest.FixtureRequest, db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(START)) as meter:
        if request.param == "reference":
            engine = meter._engine
            engine.paths = [engine.path("reference")]
        meter.set_limit(FLOORED)
        yield meter


def _clock(meter: Meter) -> FrozenClock:
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    return clock


def _burst(meter: Meter, subject: str, limit: str, seconds: int, cost: int) -> int | None:
    """A charge of ``cost`` each second for ``seconds``: the second it was
    first denied (None: never)."""
    clock = _clock(meter)
    for n in range(seconds):
        if not meter.consume(subject, limit, cost).allowed:
            return n
        clock.advance(seconds=1)
    return None


def _quarantined(meter: Meter) -> list[dict[str, object]]:
    return [json.loads(p)["data"] for _, _, p in Webhooks(meter).messages("limit.quarantined")]


def test_a_burst_trips_after_a_minute_and_is_held_to_the_quarantine(meter: Meter) -> None:
    # 10 x the 0.1 floor is 1 a second: 60 a second is past it from the
    # second charge on (the first is 60/60 a second); the charge a minute
    # later trips (second 61), and the next is held to 1,000 (used: 62 x 60).
    denied_at = _burst(meter, "org-1", "api", 120, 60)
    assert denied_at == 62
    assert [(q.limit, q.subject) for q in meter.quarantines()] == [("api", "org-1")]
    held = meter.consume("org-1", "api", 1)
    assert held.outcome == "denied" and held.used == 62 * 60
    assert held.charges[0].maximum == 1000
    assert not meter.check("org-1", "api", 1).allowed
    assert meter.consume("org-2", "api", 60).allowed  # another subject is not held
    [notice] = _quarantined(meter)
    assert (notice["subject"], notice["limit"]) == ("org-1", "api")
    assert str(notice["release_path"]).startswith("/quarantine/release?token=v1.")


def test_the_quarantine_maximum_holds_a_fresh_window_and_grants_do_not_pay(
    meter: Meter,
) -> None:
    meter.set_limit(
        Limit(
            "small",
            maximum=100_000,
            period="1h",
            window="calendar",
            breaker="10x",
            breaker_floor=0.1,
            quarantine_max=5,
        )
    )
    meter.grant("org-1", "small", 500, grant_id="top-up")
    assert _burst(meter, "org-1", "small", 120, 60) == 62
    assert [q.subject for q in meter.quarantines()] == ["org-1"]
    held = meter.consume("org-1", "small", 1)  # used 3,720 > 5; no grant pays
    assert not held.allowed and held.charges[0].grants == ()
    _clock(meter).set(START + timedelta(hours=1))  # a fresh window: 5 of it
    fresh = meter.consume("org-1", "small", 5)
    assert fresh.allowed and fresh.charges[0].maximum == 5
    assert not meter.consume("org-1", "small", 1).allowed
    assert len(_quarantined(meter)) == 1  # once per quarantine


def _breaker_rows(meter: Meter) -> list[tuple[object, ...]]:
    with meter.sql_engine.connect() as connection:
        return [
            tuple(row) for row in connection.execute(select(breakers).order_by(breakers.c.subject))
        ]


def test_a_quarantined_subject_is_checked_against_the_quarantine_maximum(meter: Meter) -> None:
    """`check` holds a quarantined subject to the quarantine maximum (no
    grants) as the reference engine's check does, and steps no breaker."""
    meter.set_limit(
        Limit(
            "small",
            maximum=100_000,
            period="1h",
            window="calendar",
            breaker="10x",
            breaker_floor=0.1,
            quarantine_max=5,
        )
    )
    meter.grant("org-1", "small", 500, grant_id="top-up")
    assert _burst(meter, "org-1", "small", 120, 60) == 62
    clock = _clock(meter)
    clock.set(START + timedelta(hours=1))  # a fresh window: 5 of it
    assert meter.consume("org-1", "small", 2).allowed
    before, checked = _breaker_rows(meter), reference_events("check")
    for subject, cost, allowed in [("org-1", 3, True), ("org-1", 4, False), ("org-2", 60, True)]:
        decision = meter.check(subject, "small", cost)
        assert decision.allowed is allowed, (subject, cost)
        made = make_event([(subject, "small", cost)], clock(), "check")
        expected = check_reference(meter._engine, made, meter.database.now_us())
        assert decision == expected
    held = meter.check("org-1", "small", 4)
    assert held.charges[0].maximum == 5 and held.charges[0].grants == ()
    assert _breaker_rows(meter) == before  # a check steps no breaker
    # PostgreSQL's fast path checks (on SQLite the reference engine does).
    paths = [path.name for path in meter._engine.paths]
    if meter.sql_engine.dialect.name == "postgresql" and "direct" in paths:
        assert reference_events("check") == checked + 3  # ``check_reference``'s alone


def test_a_subject_with_under_a_day_of_history_never_trips_without_a_floor(
    meter: Meter,
) -> None:
    meter.set_limit(Limit("plain", maximum=100_000, period="1d", breaker="10x"))
    assert _burst(meter, "org-1", "plain", 300, 50) is None
    assert meter.quarantines() == [] and _quarantined(meter) == []


def test_a_day_of_history_then_a_burst_trips(meter: Meter) -> None:
    meter.set_limit(Limit("plain", maximum=10**9, period="1d", breaker="10x", quarantine_max=1000))
    clock = _clock(meter)
    for _ in range(26 * 6):  # 600 units every 10 minutes: a unit a second, 26 hours
        assert meter.consume("org-1", "plain", 600).allowed
        clock.advance(minutes=10)
    assert meter.quarantines() == []  # each lump fell back under the multiple
    # 20 a second: the now rate, 20 x (1 - exp(-t / 60 s)), passes 10 x the
    # baseline (about 0.66 a second after 26 hours) some 24 seconds in; it
    # trips a minute after that, and the next charge is held.
    denied_at = _burst(meter, "org-1", "plain", 200, 20)
    assert denied_at is not None and 80 < denied_at < 90
    assert [q.subject for q in meter.quarantines()] == ["org-1"]


def test_a_release_ends_the_quarantine_and_does_not_trip_again_at_once(meter: Meter) -> None:
    assert _burst(meter, "org-1", "api", 120, 60) == 62
    released = meter.release_quarantine("org-1", "api")
    assert (released.subject, released.limit) == ("org-1", "api")
    assert meter.quarantines() == []
    # Its now rate starts from nothing: still past the multiple, it trips
    # again a minute later, not at once.
    assert _burst(meter, "org-1", "api", 120, 60) == 62
    assert len(_quarantined(meter)) == 2


def test_a_commit_above_its_estimate_steps_the_breaker_as_a_consume(meter: Meter) -> None:
    """A reservation of 1 committed at 60 each second trips as consuming 60 does."""
    clock = _clock(meter)
    for second in range(120):
        held = meter.reserve("org-1", "api", cost=1, event_id=f"r-{second}")
        if not held.allowed:
            break
        held.commit(actual=60)
        clock.advance(seconds=1)
    assert second == 62
    assert [(q.subject, q.limit) for q in meter.quarantines()] == [("org-1", "api")]


def test_a_batchs_charges_store_the_floats_of_a_step_per_charge(meter: Meter) -> None:
    # A batch's charges of a few subjects, interleaved, in batches 1 s apart
    # (one past the multiple: 10 x the 0.1 floor): each stored breaker is
    # `step` after `step` from the one before, to the bit.
    costs = [60, 1, 300, 7, 60, 2, 45, 60]
    subjects = ["org-1", "org-2", "org-3"]
    expected: dict[str, Breaker | None] = dict.fromkeys(subjects)
    clock = _clock(meter)
    for batch in range(3):
        now_us = to_us(clock())
        events = []
        for n, cost in enumerate(costs):
            subject = subjects[n % len(subjects)]
            events.append(make_event([(subject, "api", cost)], clock(), f"b{batch}-{n}"))
            expected[subject], tripped = step(expected[subject], cost, now_us, 10, 0.1)
            assert not tripped
        decided = meter.apply(events)
        assert all(d.allowed for d in decided)
        stored = {row[1]: Breaker(*row[2:]) for row in _breaker_rows(meter)}
        assert {s: _bits(b) for s, b in stored.items()} == {
            s: _bits(b) for s, b in expected.items() if b is not None
        }
        clock.advance(seconds=1)


def _bits(breaker: Breaker) -> tuple[object, ...]:
    return tuple(v.hex() if isinstance(v, float) else v for v in breaker)
