"""Entitlements, grants, corrections, absolute thresholds and shadow limits,
on SQLite and on PostgreSQL, with a frozen clock."""

from __future__ import annotations

import json
from collections import Counter as Tally
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.instants import MICROSECOND
from metering.storage.tables import counters, grants, webhook_messages

MONTH = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
CALLS = Limit("api_calls", maximum=250, period="1mo", window="calendar", lateness="7d")


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(MONTH)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Meter:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(CALLS)
        yield meter


def _used(meter: Meter, subject: str, limit: str = "api_calls") -> list[int]:
    return [counter.used for counter in meter.counters(subject, limit)]


def _messages(meter: Meter) -> list[tuple[str, dict[str, object]]]:
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(
            select(webhook_messages.c.type, webhook_messages.c.payload).order_by(
                webhook_messages.c.created_at_us, webhook_messages.c.id
            )
        )
        return [(kind, json.loads(payload)) for kind, payload in rows]


# -- entitlements --------------------------------------------------------------


def test_a_mid_window_upgrade_applies_from_its_time_and_usage_carries_over(
    meter: Meter, clock: FrozenClock
) -> None:
    """org-42 keeps the default; org-7 bought 1,000 and upgrades to 2,000 on
    the 12th. A sequential model judges every event with the maximum in
    effect at its own time, late events included."""
    meter.set_entitlement("org-7", "api_calls", 1000, effective_from=MONTH)
    meter.set_entitlement("org-7", "api_calls", 2000, effective_from=MONTH + 11 * DAY)
    history = [(MONTH, 1000), (MONTH + 11 * DAY, 2000)]
    plan = [  # (day of the month the event happened, day it is decided, cost)
        (2, 2, 400),
        (5, 5, 500),
        (9, 9, 200),  # 1,100 > 1,000: denied
        (12, 12, 900),  # after the upgrade: 1,800 <= 2,000
        (10, 13, 150),  # late, from before the upgrade: judged against 1,000
        (14, 14, 200),  # 2,000: allowed
        (15, 15, 1),  # 2,001: denied
    ]
    used = 0
    for happened, decided, cost in plan:
        clock.set(MONTH + (decided - 1) * DAY + timedelta(hours=1))
        at = MONTH + (happened - 1) * DAY
        maximum = [m for start, m in history if start <= at][-1]
        allowed = used + cost <= maximum
        used += cost if allowed else 0
        decision = meter.consume("org-7", "api_calls", cost, occurred_at=at)
        assert (decision.allowed, decision.maximum, decision.used) == (allowed, maximum, used)
        assert decision.remaining == max(maximum - used, 0)
    assert _used(meter, "org-7") == [used] == [2000]
    assert meter.consume("org-42", "api_calls", 251).allowed is False
    assert meter.consume("org-42", "api_calls", 250).maximum == 250


def test_a_downgrade_below_usage_denies_until_the_window_resets(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_entitlement("org-7", "api_calls", 1000, effective_from=MONTH)
    assert meter.consume("org-7", "api_calls", 800).allowed
    clock.advance(days=3)
    meter.set_entitlement("org-7", "api_calls", 500)
    denied = meter.consume("org-7", "api_calls", 1)
    assert (denied.allowed, denied.used, denied.remaining, denied.maximum) == (False, 800, 0, 500)
    assert _used(meter, "org-7") == [800]  # nothing allowed is taken back
    clock.set(MONTH + 31 * DAY)  # December: the new maximum from the start
    assert meter.consume("org-7", "api_calls", 500).allowed
    assert not meter.consume("org-7", "api_calls", 1).allowed


def test_a_token_bucket_has_a_per_subject_capacity(meter: Meter) -> None:
    meter.set_limit(Limit("burst", maximum=2, period="10s", algorithm="token_bucket"))
    meter.set_entitlement("big", "burst", 5, effective_from=MONTH)
    assert [meter.consume("big", "burst").allowed for _ in range(6)] == [True] * 5 + [False]
    assert [meter.consume("small", "burst").allowed for _ in range(3)] == [True, True, False]


# -- grants ----------------------------------------------------------------------


def test_usage_draws_on_the_own_allowance_then_the_earliest_expiring_grant(
    meter: Meter, clock: FrozenClock
) -> None:
    end = MONTH + 30 * DAY
    meter.grant("org-42", "api_calls", 100, None, grant_id="forever")
    meter.grant("org-42", "api_calls", 50, end, grant_id="month-end")
    meter.grant("org-42", "api_calls", 30, MONTH + 10 * DAY, grant_id="ten-days")
    first = meter.consume("org-42", "api_calls", 240, event_id="a")
    assert (first.charges[0].grants, first.remaining) == ((), 10 + 180)
    second = meter.consume("org-42", "api_calls", 60, event_id="b")
    assert second.charges[0].grants == (("ten-days", 30), ("month-end", 20))
    third = meter.consume("org-42", "api_calls", 120, event_id="c")
    assert third.charges[0].grants == (("month-end", 30), ("forever", 90))
    assert third.remaining == 10
    denied = meter.consume("org-42", "api_calls", 11)
    assert (denied.allowed, denied.remaining, denied.retry_at) == (False, 10, end)
    used = {g.grant_id: (g.used, g.left) for g in meter.grants("org-42")}
    assert used == {"forever": (90, 10), "month-end": (50, 0), "ten-days": (30, 0)}
    assert meter.result("b").charges[0].grants == (("ten-days", 30), ("month-end", 20))


def test_a_grant_expires_at_the_exact_microsecond(meter: Meter, clock: FrozenClock) -> None:
    expires = MONTH + 5 * DAY
    meter.grant("org-42", "api_calls", 10, expires, grant_id="g")
    meter.consume("org-42", "api_calls", 250)
    clock.set(expires)
    last = expires - MICROSECOND
    assert meter.consume("org-42", "api_calls", 1, occurred_at=last).charges[0].grants == (
        ("g", 1),
    )
    at_expiry = meter.consume("org-42", "api_calls", 1, occurred_at=expires)
    assert (at_expiry.allowed, at_expiry.remaining) == (False, 0)
    assert meter.grants()[0].used == 1  # the other 9 are gone


def test_a_window_reset_does_not_renew_a_grant(meter: Meter, clock: FrozenClock) -> None:
    meter.grant("org-42", "api_calls", 20, grant_id="g")
    assert meter.consume("org-42", "api_calls", 260).allowed
    clock.set(MONTH + 31 * DAY)  # the next window
    assert meter.consume("org-42", "api_calls", 255).charges[0].grants == (("g", 5),)
    assert not meter.consume("org-42", "api_calls", 6).allowed
    meter.reset(subject="org-42")
    assert meter.consume("org-42", "api_calls", 250).allowed
    assert not meter.consume("org-42", "api_calls", 6).allowed  # 5 left, not 20
    assert meter.grants()[0].left == 5


def test_a_soft_limit_bills_overage_only_beyond_its_grants(meter: Meter) -> None:
    meter.set_limit(Limit("seats", maximum=10, period="1mo", window="calendar", enforcement="soft"))
    meter.grant("org", "seats", 5, grant_id="g")
    within = meter.consume("org", "seats", 14)
    assert (within.outcome, within.charges[0].overage, within.charges[0].grants) == (
        "allowed",
        0,
        (("g", 4),),
    )
    over = meter.consume("org", "seats", 3)
    assert (over.outcome, over.charges[0].overage, over.charges[0].grants) == (
        "overage",
        2,
        (("g", 1),),
    )
    assert [kind for kind, _ in _messages(meter)] == ["limit.exceeded"]


# -- corrections -----------------------------------------------------------------


def test_a_void_in_a_past_window_reverses_that_windows_counter(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("org-42", "api_calls", 40, event_id="twice-1")
    meter.consume("org-42", "api_calls", 40, event_id="twice-2")
    clock.set(MONTH + 31 * DAY)  # December
    meter.consume("org-42", "api_calls", 7)
    correction = meter.void("twice-2", "recorded twice by a buggy client")
    assert _used(meter, "org-42") == [40, 7]
    assert (correction.event_id, correction.duplicate) == ("twice-2", False)
    assert correction.charges[0][:3] == ("org-42", "api_calls", 40)
    assert meter.result("twice-2").allowed  # the original result stays
    kinds = [(kind, doc["data"]["event_id"]) for kind, doc in _messages(meter)]  # type: ignore[index]
    assert kinds == [("usage.corrected", "twice-2")]


def test_a_void_gives_back_active_grants_but_not_expired_ones(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.grant("org-42", "api_calls", 10, MONTH + 5 * DAY, grant_id="short")
    meter.grant("org-42", "api_calls", 10, grant_id="long")
    meter.consume("org-42", "api_calls", 250)
    meter.consume("org-42", "api_calls", 15, event_id="paid")
    clock.set(MONTH + 6 * DAY)
    correction = meter.void("paid", "refund")
    assert correction.charges[0][4] == (("long", 5),)
    left = {g.grant_id: g.left for g in meter.grants()}
    assert left == {"short": 0, "long": 10}
    assert _used(meter, "org-42") == [250]
    with meter.sql_engine.connect() as connection:
        assert connection.execute(select(counters.c.granted)).scalars().all() == [0]
    assert meter.consume("org-42", "api_calls", 10).allowed  # the long grant again
    assert not meter.consume("org-42", "api_calls", 1).allowed


# -- thresholds ------------------------------------------------------------------


def test_absolute_and_percentage_thresholds_fire_once_per_window(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_limit(
        Limit(
            "calls",
            maximum=100,
            period="1mo",
            window="calendar",
            thresholds=(50,),
            thresholds_units=(70, 120),
        )
    )
    meter.set_entitlement("org", "calls", 200, effective_from=MONTH)
    for _ in range(30):
        meter.consume("org", "calls", 5)  # 150 of 200
    fired = {
        (doc["data"]["used"], doc["data"]["threshold"], doc["data"]["threshold_units"])  # type: ignore[index]
        for kind, doc in _messages(meter)
        if kind == "limit.threshold"
    }
    # 50% of the subject's own maximum (200) is 100.
    assert fired == {(70, None, 70), (100, 50, None), (120, None, 120)}
    clock.set(MONTH + 31 * DAY)
    for _ in range(30):
        meter.consume("org", "calls", 5)
    assert Tally(kind for kind, _ in _messages(meter)) == {"limit.threshold": 6}


# -- shadow limits ---------------------------------------------------------------


def test_a_shadow_limit_never_denies_and_promotion_keeps_its_counters(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_limit(
        Limit("trial", maximum=3, period="1mo", window="calendar", enforcement="shadow")
    )
    outcomes = [meter.consume("org", "trial", 1) for _ in range(5)]
    assert all(d.allowed for d in outcomes)
    assert [d.would_deny for d in outcomes] == [()] * 3 + [("trial",)] * 2
    [counter] = meter.counters("org", "trial")
    assert (counter.used, counter.denied_count, counter.denied_cost) == (3, 2, 2)
    assert [kind for kind, _ in _messages(meter)] == ["limit.would_deny"]
    stacked = meter.consume(charges=[("org", "trial", 1), ("org", "api_calls", 251)])
    assert (stacked.allowed, stacked.denied_by) == (False, ("api_calls",))
    meter.set_limit(Limit("trial", maximum=3, period="1mo", window="calendar"))  # hard now
    promoted = meter.consume("org", "trial", 1)
    assert (promoted.allowed, promoted.used) == (False, 3)
    [counter] = meter.counters("org", "trial")
    assert (counter.used, counter.denied_count) == (3, 4)


def test_grant_rows_are_kept_apart_per_grant(meter: Meter) -> None:
    meter.grant("org-42", "api_calls", 5, grant_id="g1")
    meter.consume("org-42", "api_calls", 253)
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(select(grants.c.grant_id, grants.c.used)).all()
    assert [tuple(r) for r in rows] == [("g1", 3)]


def test_a_cancelled_reservation_gives_back_what_it_drew_on_grants(meter: Meter) -> None:
    meter.grant("org-42", "api_calls", 30, grant_id="g")
    meter.consume("org-42", "api_calls", 240)
    with meter.reserve("org-42", "api_calls", 25) as reservation:
        assert reservation.allowed
        assert meter.grants()[0].used == 15
        reservation.cancel()
    assert meter.grants()[0].used == 0
    assert _used(meter, "org-42") == [240]
    assert meter.consume("org-42", "api_calls", 40).allowed  # 10 own and 30 granted
    assert not meter.consume("org-42", "api_calls", 1).allowed


@pytest.mark.postgres
def test_entitlements_and_grants_add_no_round_trip(
    pg_url: str, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted at the driver (`round_trips.count_round_trips`), per `consume` on PostgreSQL."""
    from round_trips import count_round_trips

    trips = count_round_trips(monkeypatch)
    with Meter(pg_url, clock=clock, group_commit=False) as meter:
        meter.set_limit(CALLS)
        meter.set_entitlement("entitled", "api_calls", 500)
        meter.grant("granted", "api_calls", 5)

        def round_trips(subject: str) -> int:
            meter.consume(subject, "api_calls")  # warm: the first one caches the limits
            trips[0] = 0
            meter.consume(subject, "api_calls")
            return trips[0]

        plain = round_trips("plain")
        assert plain == 1  # one statement: metering_consume_one
        assert round_trips("entitled") == plain  # the entitled maximum is a parameter
        # Grants are left to the fast path, which speculates on the rows the
        # subject's last event wrote: one round trip (two from a cold cache:
        # tests/engine/test_batch_round_trips.py).
        assert round_trips("granted") == 1


def test_a_void_and_a_shadows_would_deny_leave_the_usage_by_dimension_right(
    meter: Meter,
) -> None:
    from metering.reports import usage_by_dimension

    meter.set_limit(
        Limit(
            "trial",
            maximum=3,
            period="1mo",
            window="calendar",
            enforcement="shadow",
            dimensions=("route",),
        )
    )
    for n, route in enumerate(["/a", "/a", "/b", "/b", "/b"]):
        meter.consume("org", "trial", 1, event_id=f"t{n}", metadata={"route": route})
    meter.void("t0", "recorded twice")

    def figures() -> dict[str | None, tuple[int, int]]:
        report = usage_by_dimension(meter, subject="org", key="route", period="2026-11")
        return {row.value: (row.used, row.events) for row in report.rows()}

    # t3 and t4 would have been denied: nothing consumed; t0 was voided.
    assert figures() == {"/a": (1, 1), "/b": (1, 1)}
    assert [c.used for c in meter.counters("org", "trial")] == [2]


def test_a_denied_charge_with_grants_says_when_it_fits_again(meter: Meter) -> None:
    """Own allowance 10 a window plus a grant of 5 that never expires: a
    charge of 11 does not fit now (own room 1, grant 5), but fits in the
    next window (own 10 + 4 left of the grant), so it has a retry time."""
    meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
    meter.grant("org", "calls", 5, grant_id="g")
    assert meter.consume("org", "calls", 10).allowed
    assert meter.consume("org", "calls", 1).charges[0].grants == (("g", 1),)
    denied = meter.consume("org", "calls", 11)
    assert (denied.allowed, denied.retry_at) == (False, MONTH + timedelta(hours=1))
    never = meter.consume("org", "calls", 15)  # 10 + 4 left: never fits
    assert (never.allowed, never.retry_at) == (False, None)


def test_a_shadow_buckets_would_deny_notifies_again_once_the_bucket_is_full(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_limit(
        Limit("burst", maximum=2, period="10s", algorithm="token_bucket", enforcement="shadow")
    )
    from metering.webhooks.delivery import sweep_resets

    for _ in range(3):
        meter.consume("org", "burst")
    clock.advance(seconds=30)  # full again: the next would-deny is news
    sweep_resets(meter)
    for _ in range(3):
        meter.consume("org", "burst")
    kinds = [kind for kind, _ in _messages(meter)]
    assert kinds == ["limit.would_deny", "limit.would_deny"]


@pytest.mark.postgres
def test_a_draw_on_a_balance_spent_meanwhile_is_decided_again(
    pg_url: str, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PostgreSQL hot path reads balances without a lock. Another
    transaction spends the grant between this one's read and its write: the
    grants' check refuses the write, and the event is decided again, on the
    balance as it is now."""
    from sqlalchemy import update

    from metering.engine.paths import Direct
    from metering.storage.hot.postgres import PostgresHotStore

    with Meter(pg_url, clock=clock, group_commit=False) as meter:
        meter.set_limit(CALLS)
        meter.grant("org-42", "api_calls", 10, grant_id="g")
        meter.consume("org-42", "api_calls", 250)
        read = PostgresHotStore.read_rows
        spent = []

        def read_then_spend(self: PostgresHotStore, *args: object, **kwargs: object) -> object:
            snapshot = read(self, *args, **kwargs)  # type: ignore[arg-type]
            if not spent:  # another worker spends 8 of the 10 in the meantime
                spent.append(True)
                with meter.sql_engine.begin() as other:
                    other.execute(update(grants).values(used=8))
            return snapshot

        monkeypatch.setattr(PostgresHotStore, "read_rows", read_then_spend)
        # The fast path's read (the one-trip function reads in its own statement).
        engine = meter._engine
        engine.paths = [path for path in engine.paths if path.name != "one_trip"]
        direct = meter._engine.path("direct")
        assert isinstance(direct, Direct) and direct.rows is not None
        direct.rows.clear()  # read, not speculated on the rows the 250 wrote
        decision = meter.consume("org-42", "api_calls", 5, event_id="late")
        assert spent and not decision.allowed  # 2 left, not 10
        assert (decision.remaining, meter.grants()[0].used) == (2, 8)
        assert meter.consume("org-42", "api_calls", 2).charges[0].grants == (("g", 2),)
