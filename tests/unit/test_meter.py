"""`Meter`, the synchronous facade (`metering/meter.py`): where it finds its
database and horizon, how it builds an event from a call (the clock's now, a
generated id, one charge or several), what `check` leaves untouched, batches
in order, and that closing it settles its leases."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.errors import EventConflict, InvalidInput

NOW = datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(sqlite_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=3, period="1h", window="calendar"))
        meter.set_limit(Limit("tokens", maximum=100, period="1h", window="calendar"))
        yield meter


def test_a_meter_takes_its_correction_horizon_from_the_settings_it_is_given(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker and the API hand `Meter` their settings' horizon; only a
    `Meter` given none reads METERING_CORRECTION_HORIZON_DAYS."""
    monkeypatch.setenv("METERING_CORRECTION_HORIZON_DAYS", "90")
    url = sqlite_url
    with Meter(url, correction_horizon_days=10) as given, Meter(url) as default:
        assert given.correction_horizon == 10 * 86_400
        assert default.correction_horizon == 90 * 86_400
    with pytest.raises(InvalidInput, match="correction_horizon_days"):
        Meter(url, correction_horizon_days=0)


def test_a_meter_given_no_url_opens_the_environments_database_with_its_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'from-env.db'}"
    monkeypatch.setenv("METERING_DATABASE_URL", url)
    with Meter() as meter:
        assert meter.url == url
        assert meter.list_limits() == []  # the schema is there
        assert meter.connections_in_use() is None  # SQLite keeps no count
    assert (tmp_path / "from-env.db").exists()


def test_a_call_without_id_or_time_gets_a_new_id_and_the_clocks_now(
    meter: Meter, clock: FrozenClock
) -> None:
    first = meter.consume("org", "calls")
    clock.advance(seconds=5)
    second = meter.consume("org", "calls")
    assert first.event_id and second.event_id and first.event_id != second.event_id
    assert (first.occurred_at, second.occurred_at) == (NOW, NOW + timedelta(seconds=5))
    earlier = NOW - timedelta(seconds=20)
    assert meter.consume("org", "calls", event_id="e3", occurred_at=earlier).occurred_at == earlier
    assert meter.decided([first.event_id, "e3", "e4"]) == {first.event_id, "e3"}


def test_one_charge_by_subject_and_limit_or_several_as_charges_never_both(
    meter: Meter,
) -> None:
    several = meter.consume(charges=[("org", "calls", 1), ("org", "tokens", 40)])
    assert [(c.limit, c.cost) for c in several.charges] == [("calls", 1), ("tokens", 40)]
    with pytest.raises(InvalidInput, match="not both"):
        meter.consume("org", "calls", charges=[("org", "tokens", 1)])
    with pytest.raises(InvalidInput, match="give subject and limit"):
        meter.consume("org")
    with pytest.raises(InvalidInput):
        meter.consume("org", "calls", cost=0)
    assert meter.count_results() == 1  # the refused calls stored nothing


def test_a_reused_id_is_the_stored_result_and_other_charges_conflict(meter: Meter) -> None:
    first = meter.consume("org", "calls", event_id="e1")
    again = meter.consume("org", "calls", event_id="e1")
    assert again.duplicate and not first.duplicate and again.outcome == first.outcome
    with pytest.raises(EventConflict):
        meter.consume("org", "calls", 2, event_id="e1")
    assert meter.result("e1") == first
    assert meter.result("e2") is None
    assert [c.used for c in meter.counters("org", "calls")] == [1]


def test_check_answers_what_consume_would_and_records_nothing(meter: Meter) -> None:
    meter.consume("org", "calls", 2)
    assert meter.check("org", "calls").allowed
    denied = meter.check("org", "calls", 2)
    assert not denied.allowed and denied.denied_by == ("calls",)
    assert meter.count_results() == 1
    assert [(c.used, c.denied_count) for c in meter.counters("org", "calls")] == [(2, 0)]


def test_a_batch_is_decided_in_order_with_each_events_answer(meter: Meter) -> None:
    events = [make_event([("org", "calls", 2)], NOW, f"b{n}") for n in range(3)]
    decided = meter.apply([*events, events[0]])
    assert [(d.event_id, d.outcome) for d in decided] == [  # type: ignore[union-attr]
        ("b0", "allowed"),
        ("b1", "denied"),
        ("b2", "denied"),
        ("b0", "allowed"),
    ]
    assert decided[3].duplicate  # type: ignore[union-attr]
    conflict = make_event([("org", "calls", 1)], NOW, "b1")
    assert isinstance(meter.apply([conflict])[0], EventConflict)
    assert meter.outcome_counts() == {"allowed": 1, "denied": 2}
    record = make_event([("org", "tokens", 5)], NOW, "r1").record()
    assert [a.kind for a in meter.apply_records([record, record])] == ["new", "duplicate"]
    assert meter.result("r1") is not None


def test_reset_clears_the_current_counters_and_keeps_the_results(meter: Meter) -> None:
    meter.consume("org", "calls", 3)
    meter.consume("other", "calls")
    assert meter.reset(subject="org") == 1
    assert meter.consume("org", "calls", 3).allowed
    assert meter.count_results() == 3


def test_closing_a_meter_settles_its_leases(sqlite_url: str, clock: FrozenClock) -> None:
    meter = Meter(sqlite_url, clock=clock)
    meter.set_limit(Limit("api", maximum=100, period="1h", window="calendar"))
    for _ in range(10):  # 7 exact, then a block of 2, then a block of 4 (one used)
        meter.lease("ada", "api")
    with pytest.raises(InvalidInput):
        meter.lease("ada", "api", 0)
    assert sum(c.used for c in meter.counters("ada", "api")) == 13
    meter.close()
    with Meter(sqlite_url, clock=clock) as reopened:
        assert sum(c.used for c in reopened.counters("ada", "api")) == 10
