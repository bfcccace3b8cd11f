"""Recurring grants, grant priorities, ``grant.low`` and per-subject alert
thresholds (issue 22, points 4 and 5), on SQLite and PostgreSQL, with a
frozen clock (no beat, no sleep)."""

from __future__ import annotations

import json
import threading
from collections import Counter as Tally
from datetime import UTC, datetime, timedelta

import pytest
from decision_paths import apply_reference
from sqlalchemy import func, select

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.events import make_event
from metering.domain.instants import to_us
from metering.errors import GrantConflict, InvalidInput, UnknownLimit
from metering.storage.limits import LimitStore
from metering.storage.tables import alert_thresholds, grant_schedules, grants, webhook_messages
from metering.webhooks import Webhooks

NOV = datetime(2026, 11, 20, 12, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)
JAN = datetime(2027, 1, 1, tzinfo=UTC)
CALLS = Limit("api_calls", maximum=10, period="1mo", window="calendar", lateness="7d")


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOV)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Meter:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(CALLS)
        yield meter


def _messages(meter: Meter, kind: str) -> list[dict[str, object]]:
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(
            select(webhook_messages.c.payload)
            .where(webhook_messages.c.type == kind)
            .order_by(webhook_messages.c.created_at_us, webhook_messages.c.id)
        )
        return [json.loads(payload)["data"] for (payload,) in rows]


def _grants(meter: Meter) -> dict[str, tuple[int, int]]:
    return {g.grant_id: (g.amount, g.used) for g in meter.grants()}


def _rows(meter: Meter, table: object) -> int:
    with meter.sql_engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(table)).scalar_one())


# -- recurring grants ------------------------------------------------------------


def test_the_frozen_clock_sees_a_due_issue_without_a_beat(meter: Meter, clock: FrozenClock) -> None:
    first = meter.grant("org", "api_calls", 5, every="1mo", grant_id="monthly")
    assert (first.effective_from, first.expires_at, first.issue) == (NOV, DEC, 1)
    assert meter.consume("org", "api_calls", 15).allowed  # 10 own + 5 granted
    assert not meter.consume("org", "api_calls", 1).allowed
    clock.set(DEC + timedelta(days=1))  # nothing runs in between: no beat, no worker
    assert meter.check("org", "api_calls", 15).allowed  # reading the window issued it
    decision = meter.consume("org", "api_calls", 15)
    assert decision.allowed
    assert decision.charges[0].grants == (("monthly/2", 5),)
    assert _grants(meter) == {"monthly": (5, 5), "monthly/2": (5, 5)}
    [recurring] = meter.recurring_grants()
    assert (recurring.last_issue, recurring.next_issue_at) == (2, JAN)


def test_the_unused_part_rolls_over_up_to_its_maximum(meter: Meter, clock: FrozenClock) -> None:
    meter.grant("org", "api_calls", 8, every="1mo", rollover_max=3, grant_id="m")
    meter.consume("org", "api_calls", 12)  # 2 of the grant: 6 left, 3 carry over
    clock.set(DEC + timedelta(hours=1))
    meter.consume("org", "api_calls", 10)  # own allowance only: the issue stays whole
    clock.set(JAN + timedelta(hours=1))
    assert _grants(meter) == {"m": (8, 2), "m/2": (11, 0), "m/3": (11, 0)}
    clock.set(datetime(2027, 4, 2, tzinfo=UTC))  # three months unread: made in one reading
    assert [g.amount for g in meter.grants()] == [8, 11, 11, 11, 11, 11]
    assert [g.issue for g in meter.grants()] == [1, 2, 3, 4, 5, 6]


def test_no_rollover_without_a_maximum_and_no_issue_from_until_on(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.grant("org", "api_calls", 4, every="1mo", grant_id="m", until=JAN + timedelta(days=10))
    clock.set(datetime(2027, 3, 1, tzinfo=UTC))
    found = {g.grant_id: (g.amount, g.expires_at) for g in meter.grants()}
    assert found == {
        "m": (4, DEC),
        "m/2": (4, JAN),
        "m/3": (4, JAN + timedelta(days=10)),  # cut at until
    }
    [recurring] = meter.recurring_grants()
    assert recurring.next_issue_at is None


def test_a_recurring_grant_is_idempotent_by_its_id(meter: Meter, clock: FrozenClock) -> None:
    meter.grant("org", "api_calls", 5, every="1mo", rollover_max=2, grant_id="m")
    clock.set(DEC + timedelta(days=3))
    again = meter.grant("org", "api_calls", 5, every="1mo", rollover_max=2, grant_id="m")
    assert again.duplicate
    assert _rows(meter, grant_schedules) == 1
    with pytest.raises(GrantConflict):
        meter.grant("org", "api_calls", 5, every="1mo", rollover_max=3, grant_id="m")
    with pytest.raises(GrantConflict):
        meter.grant("org", "api_calls", 5, grant_id="m")  # a one-off under its id
    meter.grant("org", "api_calls", 5, grant_id="one-off")
    with pytest.raises(GrantConflict):
        meter.grant("org", "api_calls", 5, every="1mo", grant_id="one-off")


def test_grants_are_drawn_by_priority_then_earliest_expiry(meter: Meter) -> None:
    meter.grant("org", "api_calls", 3, NOV + timedelta(days=2), grant_id="soon")
    meter.grant("org", "api_calls", 3, grant_id="urgent", priority=10)
    meter.grant("org", "api_calls", 3, NOV + timedelta(days=1), grant_id="sooner")
    meter.grant("org", "api_calls", 3, every="1mo", grant_id="monthly", priority=200)
    decision = meter.consume("org", "api_calls", 10 + 11)
    assert decision.charges[0].grants == (
        ("urgent", 3),  # priority 10 first
        ("sooner", 3),  # then the default priority, earliest expiring first
        ("soon", 3),
        ("monthly", 2),  # priority 200 last
    )


def test_exactly_one_issue_under_concurrent_reads(db_url: str) -> None:
    clock = FrozenClock(NOV)
    with Meter(db_url, clock=clock) as setup:
        setup.set_limit(CALLS)
        setup.grant("org", "api_calls", 6, every="1mo", rollover_max=4, grant_id="m")
        setup.consume("org", "api_calls", 12)  # 2 of 6: 4 carry over
    clock.set(DEC + timedelta(hours=2))
    meters = [Meter(db_url, clock=clock) for _ in range(8)]
    barrier = threading.Barrier(len(meters))
    errors: list[BaseException] = []
    decisions = []

    def read(meter: Meter, index: int) -> None:
        try:
            barrier.wait()
            if index % 2:
                decisions.append(meter.consume("org", "api_calls", 1, event_id=f"e{index}"))
            else:
                meter.check("org", "api_calls", 1)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(m, i)) for i, m in enumerate(meters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert all(d.allowed for d in decisions)
        assert _grants(meters[0]) == {"m": (6, 2), "m/2": (10, 0)}
        assert [g.issue for g in meters[0].grants()] == [1, 2]
    finally:
        for meter in meters:
            meter.close()


# -- grant.low --------------------------------------------------------------------


def test_grant_low_is_sent_once_per_issue(meter: Meter, clock: FrozenClock) -> None:
    meter.grant("org", "api_calls", 10, every="1mo", grant_id="m", low="20%")
    meter.grant("org", "api_calls", 5, grant_id="units", low=4, priority=500)
    meter.consume("org", "api_calls", 10 + 7)  # 3 left of 10: not yet low (2 or less)
    assert _messages(meter, "grant.low") == []
    meter.consume("org", "api_calls", 1)  # 2 left: low
    meter.consume("org", "api_calls", 1)  # 1 left: already announced
    meter.consume("org", "api_calls", 2)  # m empty, 1 from "units": 4 left, low
    low = [(d["grant_id"], d["left"], d["low_at"]) for d in _messages(meter, "grant.low")]
    assert sorted(low) == [("m", 2, 2), ("units", 4, 4)]  # one instant: in no order
    clock.set(DEC + timedelta(hours=1))
    meter.consume("org", "api_calls", 10 + 9)  # the new issue: 1 left
    low = [(d["grant_id"], d["left"]) for d in _messages(meter, "grant.low")]
    assert sorted(low) == [("m", 2), ("m/2", 1), ("units", 4)]


def test_grant_low_is_delivered_to_an_endpoint_that_asks_for_it(meter: Meter) -> None:
    hooks = Webhooks(meter)
    endpoint, _ = hooks.add("https://example.com/hook", types=["grant.low"])
    meter.grant("org", "api_calls", 4, grant_id="g", low=1)
    meter.consume("org", "api_calls", 13)
    [delivery] = hooks.deliveries(endpoint_id=endpoint.id)
    assert delivery.message_type == "grant.low"


# -- per-subject alert thresholds ---------------------------------------------------


def test_a_subjects_own_thresholds_replace_the_limits(meter: Meter, clock: FrozenClock) -> None:
    meter.set_limit(
        Limit("calls", maximum=100, period="1mo", window="calendar", thresholds=(50, 90))
    )
    alert = meter.set_alert("vip", "calls", ["80%", 30])
    assert alert.at == ["80%", "30"]
    for subject in ("vip", "plain"):
        for _ in range(10):
            meter.consume(subject, "calls", 10)
    fired = {
        (d["subject"], d["threshold"], d["threshold_units"])
        for d in _messages(meter, "limit.threshold")
    }
    assert fired == {
        ("plain", 50, None),
        ("plain", 90, None),
        ("vip", 80, None),
        ("vip", None, 30),
    }
    assert [(a.subject, a.limit) for a in meter.alerts()] == [("vip", "calls")]
    assert meter.remove_alert("vip", "calls")
    assert not meter.remove_alert("vip", "calls")
    clock.set(DEC + timedelta(hours=1))
    for _ in range(6):
        meter.consume("vip", "calls", 10)
    assert Tally(d["subject"] for d in _messages(meter, "limit.threshold")) == {
        "plain": 2,
        "vip": 3,  # 80%, 30 in November; the limit's 50% in December
    }


# -- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"every": "1mo", "rollover_max": -1}, "rollover_max"),
        ({"rollover_max": 5}, "rollover_max"),  # a rollover without every
        ({"until": JAN}, "until"),
        ({"every": "1mo", "until": NOV - timedelta(days=1)}, "until"),
        ({"every": "1mo", "expires_at": JAN}, "expires_at"),
        ({"every": "1mo", "effective_from": NOV}, "effective_from"),
        ({"every": "monthly"}, "every"),
        ({"every": "0d"}, "every"),
        ({"priority": -1}, "priority"),
        ({"priority": 1001}, "priority"),
        ({"low": "120%"}, "low"),
        ({"low": "lots"}, "low"),
        ({"low": -3}, "low"),
    ],
)
def test_recurring_grants_refuse_bad_input_and_change_nothing(
    meter: Meter, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidInput) as raised:
        meter.grant("org", "api_calls", 5, **kwargs)  # type: ignore[arg-type]
    assert raised.value.field == field
    assert (_rows(meter, grants), _rows(meter, grant_schedules)) == (0, 0)


def test_every_on_a_token_bucket_or_a_negative_amount_is_refused(meter: Meter) -> None:
    meter.set_limit(Limit("burst", maximum=5, period="1m", algorithm="token_bucket"))
    with pytest.raises(InvalidInput, match="token bucket"):
        meter.grant("org", "burst", 5, every="1mo")
    with pytest.raises(InvalidInput) as raised:
        meter.grant("org", "api_calls", -5, every="1mo")
    assert raised.value.field == "amount"
    with pytest.raises(UnknownLimit):
        meter.grant("org", "nope", 5, every="1mo")
    assert (_rows(meter, grants), _rows(meter, grant_schedules)) == (0, 0)


@pytest.mark.parametrize("at", [[], ["0%"], ["1001%"], ["80"], ["eighty"], [0], [True], ["5%x"]])
def test_alerts_refuse_bad_thresholds_and_change_nothing(meter: Meter, at: list[object]) -> None:
    if at == ["80"]:  # a bare number is an amount, and valid
        meter.set_alert("org", "api_calls", at)  # type: ignore[arg-type]
        assert meter.remove_alert("org", "api_calls")
        return
    with pytest.raises(InvalidInput) as raised:
        meter.set_alert("org", "api_calls", at)  # type: ignore[arg-type]
    assert raised.value.field == "at"
    with pytest.raises(UnknownLimit):
        meter.set_alert("org", "nope", ["80%"])
    assert _rows(meter, alert_thresholds) == 0


@pytest.mark.parametrize("way", ["consume", "check", "reference"])
def test_the_due_issue_of_a_spend_limits_grant_pays_a_priced_event(
    db_url: str, clock: FrozenClock, way: str
) -> None:
    """A spend limit is charged only through prices: a priced event's charge
    of it makes its recurring grant's due issue, which pays, on the fast
    path, in `check` and in the reference engine."""
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1h", window="calendar"),
                spend_limit("cap", "0.05", "USD", "1d", window="calendar"),
            ]
        )
        meter.set_price("calls", "0.01", "USD", effective_from=NOV - timedelta(days=1))
        meter.grant("org", "cap", 3, every="1h", grant_id="m")
        assert meter.consume("org", "calls", 8).allowed  # 5 of the cap, the 3 of m
        clock.advance(seconds=3600)  # m/2 is due
        if way == "consume":
            outcome = meter.consume("org", "calls", 3).outcome
        elif way == "check":
            outcome = meter.check("org", "calls", 3).outcome
        else:
            record = make_event([("org", "calls", 3)], clock(), "e-2").record()
            now_us = meter.database.now_us()
            [answer] = apply_reference(meter._engine, [record], now_us, "raise")
            found = answer.record
            assert found is not None
            outcome = found.outcome
        assert outcome == "allowed"


# -- recurring grants at local boundaries, and the limits' cache -------------------


def _version(meter: Meter) -> int:
    return meter.database.run(lambda connection: LimitStore(connection).limits_version())


PATHS = {
    "fast": ("one_trip", "direct", "connection", "reference"),
    "reference": ("reference",),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_calendar_issues_start_at_the_subjects_local_midnight(db_url: str, path: str) -> None:
    clock = FrozenClock(datetime(2026, 3, 1, tzinfo=UTC))
    with Meter(db_url, clock=clock) as meter:
        engine = meter._engine
        engine.paths = [p for p in engine.paths if p.name in PATHS[path]]
        meter.set_limits([CALLS, Limit("daily", maximum=10, period="1d", window="calendar")])
        meter.set_time_zone("org-np", "Asia/Kathmandu")
        meter.set_time_zone("org-de", "Europe/Berlin")
        clock.set(NOV)
        monthly = meter.grant("org-np", "api_calls", 5, every="1mo", grant_id="np")
        # Kathmandu's December starts on 30 November at 18:15 UTC.
        local_dec = datetime(2026, 11, 30, 18, 15, tzinfo=UTC)
        assert monthly.expires_at == local_dec
        clock.set(local_dec + timedelta(minutes=1))
        assert meter.consume("org-np", "api_calls", 15).charges[0].grants == (("np/2", 5),)
        [second] = [g for g in meter.grants("org-np") if g.issue == 2]
        assert (second.effective_from, second.expires_at) == (
            local_dec,
            datetime(2026, 12, 31, 18, 15, tzinfo=UTC),
        )
        # Berlin's 29 March 2026 lasts 23 hours: its issue too.
        clock.set(datetime(2026, 3, 28, 12, tzinfo=UTC))
        daily = meter.grant("org-de", "daily", 2, every="1d", grant_id="de")
        assert daily.expires_at == datetime(2026, 3, 28, 23, tzinfo=UTC)
        clock.set(datetime(2026, 3, 29, 12, tzinfo=UTC))
        assert meter.check("org-de", "daily", 12).allowed  # the check issues it
        [issue] = [g for g in meter.grants("org-de") if g.issue == 2]
        assert (issue.effective_from, issue.expires_at) == (
            datetime(2026, 3, 28, 23, tzinfo=UTC),
            datetime(2026, 3, 29, 22, tzinfo=UTC),
        )
        assert meter.consume("org-de", "daily", 12).charges[0].grants == (("de/2", 2),)


@pytest.mark.parametrize("path", list(PATHS))
def test_an_issue_leaves_the_limits_cache_as_it_is(db_url: str, path: str) -> None:
    clock = FrozenClock(NOV)
    with Meter(db_url, clock=clock) as meter:
        engine = meter._engine
        engine.paths = [p for p in engine.paths if p.name in PATHS[path]]
        meter.set_limit(CALLS)
        meter.grant("org", "api_calls", 5, every="1mo", grant_id="monthly")
        meter.consume("org", "api_calls", 1)
        version = _version(meter)
        clock.set(DEC + timedelta(hours=1))
        assert meter.consume("org", "api_calls", 15).charges[0].grants == (("monthly/2", 5),)
        assert _version(meter) == version  # no reload of every worker's limits
        clock.set(JAN + timedelta(hours=1))
        assert meter.check("org", "api_calls", 1).allowed  # the general engine's issue
        assert _version(meter) == version
        assert [g.issue for g in meter.grants()] == [1, 2, 3]
        # The cache learns the next issue from the schedules it locks.
        meter.consume("org", "api_calls", 1)
        cache = engine.limits.current
        assert cache[0] == version
        if path == "fast":
            due = cache[2].due[("api_calls", "org")]
            assert due == to_us(datetime(2027, 2, 1, tzinfo=UTC))
        clock.set(datetime(2027, 2, 1, 1, tzinfo=UTC))
        assert meter.consume("org", "api_calls", 15).charges[0].grants == (("monthly/4", 5),)
        assert _version(meter) == version
