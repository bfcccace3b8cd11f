"""The single plain event in one round trip (`metering/engine/one_trip.py`):
`prepare` turns an event into the function's call from the cached limits
(each charge's window kind, bounds and enforcement, a seat's value), or declines it (limits
not loaded, an unacceptable event, a need the function lacks); on
PostgreSQL the function then decides the ordinary events (`STATS`)."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from differential import START
from round_trips import count_network_waits
from sqlalchemy import func, select, text

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.breaker import Breaker, released, step
from metering.domain.events import make_event
from metering.domain.needs import Need
from metering.engine.answers import Declined
from metering.engine.one_trip import ONE_TRIP_IMPLEMENTS, STATS, prepare
from metering.storage.rollups import ROLLUPS
from metering.storage.tables import (
    breakers,
    counters,
    distinct_values,
    results,
    usage_rollups,
    webhook_messages,
)

# What the one-trip function decides alone: no dimensions, no price.
ONE_TRIP_LIMITS = [
    Limit("cal", maximum=6, period="1h", window="calendar"),
    Limit("fu", maximum=4, period="30m"),
    Limit("bucket", maximum=3, period="10s", algorithm="token_bucket"),
    Limit("soft", maximum=5, period="1h", window="calendar", enforcement="soft"),
    Limit("units", maximum=9, period="30m", thresholds_units=(3, 7)),
]
SEATS = Limit("seats", maximum=2, period="1h", distinct="u")
ROUTES = Limit("routes", maximum=9, period="1h", dimensions=("route",))
AT = datetime(2026, 11, 22, 12, 20, 15, tzinfo=UTC)
HOUR = 3_600_000_000
HOUR_US = int(datetime(2026, 11, 22, 12, tzinfo=UTC).timestamp()) * 1_000_000


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(AT)) as meter:
        meter.set_limits([*ONE_TRIP_LIMITS, SEATS, ROUTES])
        meter.consume("org-0", "cal")  # caches the limits
        yield meter


def _prepared(meter: Meter, charges: list[Any], metadata: Any = None) -> Any:
    event = make_event(charges, AT, "e-1", metadata).record()
    return prepare(meter._engine.limits, event, meter.database.now_us())


def _reload(meter: Meter) -> None:
    """What the engine does when the database's limits are newer than its cache."""
    meter.database.run(meter._engine.limits.refresh)


def _charges(parameters: tuple[Any, ...]) -> list[list[Any]]:
    return json.loads(parameters[6])


def test_each_charge_is_called_with_its_window_and_enforcement(meter: Meter) -> None:
    parameters = _prepared(meter, [("org", "cal", 2), ("org", "fu", 1), ("org", "bucket", 1)])
    version, event_id, _, at_us, now_us, metadata = parameters[:6]
    assert (event_id, at_us, metadata) == ("e-1", int(AT.timestamp()) * 1_000_000, None)
    assert version >= 0 and now_us == meter.database.now_us()
    cal, fu, bucket = _charges(parameters)
    assert cal[:6] + cal[7:9] == ["cal", "org", 2, "c", 6, "hard", HOUR_US, HOUR_US + HOUR]
    assert fu[:6] + fu[7:9] == ["fu", "org", 1, "f", 4, "hard", 0, HOUR // 2]  # its period
    assert bucket[:6] + bucket[7:9] == ["bucket", "org", 1, "b", 3, "hard", 0, 0]
    assert parameters[7] == [3, 1, 2]  # charges locked in (limit, subject) order


def test_soft_and_unit_thresholds_travel_with_the_charge(meter: Meter) -> None:
    soft, units = _charges(_prepared(meter, [("org", "soft", 1), ("org", "units", 1)]))
    assert soft[5] == "soft" and soft[10:] == [None, None]
    assert units[10:] == [[], [3, 7]]


def test_a_seat_charge_carries_its_value_and_its_row_at_cost_0(meter: Meter) -> None:
    [seat] = _charges(_prepared(meter, [("org", "seats", 1)], {"u": 7}))
    assert seat[:3] == ["seats", "org", 1] and seat[9] == '"org","seats",1'
    # The value as `value_of` spells it; no stamp it is known held at yet (23).
    assert seat[12:] == ["7", '"org","seats",0', False, None, *[None] * 8]
    [plain] = _charges(_prepared(meter, [("org", "cal", 1)], {"u": 7}))
    assert len(plain) == 12


def test_a_charge_with_dimensions_carries_their_values(meter: Meter) -> None:
    [routed] = _charges(_prepared(meter, [("org", "routes", 1)], {"route": "/a"}))
    assert routed[12:] == [None, None, False, None, None, [["route", "/a"]]]
    [none] = _charges(_prepared(meter, [("org", "routes", 1)]))
    assert none[17] == [["route", ""]]  # no value: `rollups.NO_VALUE`


def test_a_paced_charge_carries_its_burst_in_units_unless_granted(meter: Meter) -> None:
    meter.set_limit(Limit("paced", maximum=40, period="1h", pacing=True, burst="10%"))
    _reload(meter)
    [paced] = _charges(_prepared(meter, [("org", "paced", 1)]))
    assert paced[16:] == [None, None, 4]  # 10% of 40
    meter.grant("org", "paced", 5)  # grants are not paced: the fast path's
    _reload(meter)
    declined = _prepared(meter, [("org", "paced", 1)])
    assert isinstance(declined, Declined) and declined.need == Need.PACING


def test_it_declines_what_the_function_does_not_decide(meter: Meter) -> None:
    missing = _prepared(meter, [("org", "seats", 1)], {"v": "ada"})
    assert isinstance(missing, Declined) and missing.need == Need.INVALID
    unknown = _prepared(meter, [("org", "nope", 1)])
    assert isinstance(unknown, Declined) and unknown.need == Need.INVALID
    meter.grant("org", "cal", 5)
    meter.grant("org", "fu", 5, every="1mo")  # issued now, the next in a month
    _reload(meter)
    [granted] = _charges(_prepared(meter, [("org", "cal", 1)]))
    assert granted[12:] == [None, None, True, None]
    [issued] = _charges(_prepared(meter, [("org", "fu", 1)]))
    assert issued[12:] == [None, None, True, None]
    later = AT + timedelta(days=40)
    event = make_event([("org", "fu", 1)], later, "e-2").record()
    due = prepare(meter._engine.limits, event, int(later.timestamp()) * 1_000_000)
    assert isinstance(due, Declined) and due.need == Need.RECURRING
    [other] = _charges(_prepared(meter, [("other", "cal", 1)]))
    assert len(other) == 12


def test_limits_not_loaded_yet_are_declined_as_stale(meter: Meter) -> None:
    cache = meter._engine.limits
    cache.current = (-1, {}, cache.current[2])
    declined = _prepared(meter, [("org", "cal", 1)])
    assert isinstance(declined, Declined) and declined.stale


def test_a_subjects_own_maximum_and_thresholds_are_the_functions_to_apply(
    meter: Meter,
) -> None:
    assert {Need.ENTITLEMENTS, Need.OWN_THRESHOLDS, Need.SEATS, Need.GRANTS} <= ONE_TRIP_IMPLEMENTS
    meter.set_entitlement("org", "cal", 2, effective_from=AT - timedelta(hours=1))
    meter.set_alert("org", "fu", ["50%"])
    _reload(meter)
    cal, fu = _charges(_prepared(meter, [("org", "cal", 1), ("org", "fu", 1)]))
    assert cal[4] == 2  # the subject's own maximum, not the limit's 6
    assert fu[10] == [50]


def test_an_ordinary_event_takes_one_trip(pg_url: str) -> None:
    """Calendar, first-use, bucket and stacked events: the function decides each."""
    clock = FrozenClock(START)
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits(ONE_TRIP_LIMITS)
        meter.consume("org-1", "cal")  # caches the limits
        before = STATS["applied"]
        for name in ["cal", "fu", "bucket", "soft", "units"]:
            assert meter.consume("org-2", name).allowed
        assert meter.consume(charges=[("org-2", "cal", 1), ("org-2", "fu", 1)]).allowed
        assert STATS["applied"] - before == 6


def test_own_thresholds_take_one_trip_until_one_is_crossed(pg_url: str) -> None:
    """The function decides a subject with thresholds of its own (they only
    choose when it declines), and declines the event that crosses one
    (``notify``): the fast path decides it and announces the crossing."""
    with Meter(pg_url, clock=FrozenClock(START)) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
        meter.set_alert("org", "calls", ["50%"])
        meter.consume("other", "calls")  # caches the limits
        before = STATS.copy()
        assert meter.consume("org", "calls", 2).used == 2
        assert meter.consume("org", "calls", 2).used == 4  # below 50%: nothing to announce
        assert STATS["applied"] - before["applied"] == 2
        assert meter.consume("org", "calls", 2).used == 6  # crosses 50%
        assert STATS["applied"] - before["applied"] == 2
        assert STATS["declined:notify"] - before["declined:notify"] == 1
        with meter.sql_engine.connect() as connection:
            kinds = connection.execute(select(webhook_messages.c.type)).scalars().all()
        assert kinds == ["limit.threshold"]


def test_seats_take_one_trip(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new value costs 1 and a held one 0, each decided by the function in
    one round trip, which keeps the values' live events; the first denial
    announces itself (``notify``: the fast path decides it), the next is the
    function's again; a held seat fits past a lowered maximum."""
    with Meter(pg_url, clock=FrozenClock(START)) as meter:
        meter.set_limit(Limit("seats", maximum=2, period="1h", window="calendar", distinct="u"))
        meter.consume("other", "seats", metadata={"u": "x"})  # caches the limits
        before = STATS.copy()
        waits = count_network_waits(monkeypatch)
        used = [
            (found.used, found.charges[0].cost)
            for found in (
                meter.consume("org", "seats", metadata={"u": user})
                for user in ["ada", "ada", "bob", "ada"]
            )
        ]
        assert used == [(1, 1), (1, 0), (2, 1), (2, 0)] and waits[0] == 4
        assert STATS["applied"] - before["applied"] == 4
        assert not meter.consume("org", "seats", metadata={"u": "cy"}).allowed  # notify
        assert not meter.consume("org", "seats", metadata={"u": "dee"}).allowed
        assert meter.consume("org", "seats", metadata={"u": "bob"}).allowed
        assert STATS["applied"] - before["applied"] == 6
        meter.set_entitlement("org", "seats", 1)  # below the 2 held: a held seat still fits
        held = meter.consume("org", "seats", metadata={"u": "ada"})
        assert (held.outcome, held.charges[0].cost, held.charges[0].overage) == ("allowed", 0, 0)
        assert STATS["applied"] - before["applied"] == 7
        with meter.sql_engine.connect() as connection:
            rows = connection.execute(
                select(distinct_values.c.value, distinct_values.c.live_events)
                .where(distinct_values.c.subject == "org")
                .order_by(distinct_values.c.value)
            ).all()
        assert [tuple(row) for row in rows] == [("ada", 1), ("bob", 1)]  # held: `HELD`


def test_grants_take_one_trip(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The own allowance pays first, then the grants by priority, each event
    decided by the function in one round trip with its draws written; the
    first denial announces itself (the fast path decides it)."""
    with Meter(pg_url, clock=FrozenClock(START)) as meter:
        meter.set_limit(Limit("calls", maximum=1, period="1h", window="calendar"))
        meter.grant("org", "calls", 2, grant_id="late", priority=200)
        meter.grant("org", "calls", 1, grant_id="first", priority=10)
        meter.consume("other", "calls")  # caches the limits
        before = STATS.copy()
        waits = count_network_waits(monkeypatch)
        paid = [meter.consume("org", "calls", 1).charges[0].grants for _ in range(3)]
        assert paid == [(), (("first", 1),), (("late", 1),)] and waits[0] == 3
        assert meter.consume("org", "calls", 2).charges[0].remaining == 1  # denied: 1 left
        assert not meter.consume("org", "calls", 2).allowed
        assert meter.consume("org", "calls", 1).charges[0].grants == (("late", 1),)
        assert STATS["applied"] - before["applied"] == 5
        assert {g.grant_id: g.used for g in meter.grants("org", "calls")} == {
            "first": 1,
            "late": 2,
        }
        with meter.sql_engine.connect() as connection:  # the draws on the counter's row
            granted = connection.execute(
                select(counters.c.granted).where(counters.c.subject == "org")
            ).scalar_one()
        assert granted == 3


def test_an_event_drawing_on_two_grants_takes_one_trip(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A charge its first grant cannot pay draws on the next too, both grants
    written by the function (the draws in grant id order), a single draw too."""
    with Meter(pg_url, clock=FrozenClock(START)) as meter:
        meter.set_limit(Limit("calls", maximum=1, period="1h", window="calendar"))
        meter.grant("org", "calls", 2, grant_id="b-first", priority=10)
        meter.grant("org", "calls", 5, grant_id="a-late", priority=200)
        meter.consume("other", "calls")  # caches the limits
        before = STATS.copy()
        waits = count_network_waits(monkeypatch)
        paid = [meter.consume("org", "calls", cost).charges[0].grants for cost in (4, 1)]
        assert paid == [(("b-first", 2), ("a-late", 1)), (("a-late", 1),)] and waits[0] == 2
        assert STATS["applied"] - before["applied"] == 2
        assert {g.grant_id: g.used for g in meter.grants("org", "calls")} == {
            "b-first": 2,
            "a-late": 2,
        }


def test_a_grant_in_force_beside_spent_expired_and_later_ones_draws_as_on_sqlite(
    pg_url: str, sqlite_url: str
) -> None:
    """The function reads the grants' sums with the lone live grant in force,
    drawn from that read (a spent and an expired grant beside it), and draws two
    or more in force, or one beside a later one, in order: every decision (draws,
    room, retry) and every grant's use is SQLite's."""
    steps = [(0, 1), (0, 1), (1, 1), (20, 1), (20, 1), (25, 0), (35, 2), (35, 9), (35, 9)]
    found: dict[str, Any] = {}
    for url in (pg_url, sqlite_url):
        clock = FrozenClock(START)
        with Meter(url, clock=clock) as meter:
            meter.set_limit(Limit("calls", maximum=1, period="1h", window="calendar"))
            meter.grant("org", "calls", 1, grant_id="spent", priority=10)
            meter.grant("org", "calls", 2, START + timedelta(minutes=10), grant_id="expiring")
            meter.grant("org", "calls", 3, grant_id="now", priority=200)
            meter.consume("other", "calls")  # caches the limits
            before = STATS.copy()
            decided = []
            for minutes, cost in steps:
                clock.set(START + timedelta(minutes=minutes))
                if (minutes, cost) == (25, 0):  # a second live grant, in force from 30
                    later = START + timedelta(minutes=30)
                    meter.grant(
                        "org", "calls", 4, grant_id="later", effective_from=later, priority=300
                    )
                    continue
                decided.append(meter.consume("org", "calls", cost).charges)
            used = {g.grant_id: g.used for g in meter.grants("org", "calls")}
            found[url] = (decided, used, STATS["applied"] - before["applied"])
    (on_pg, pg_used, applied), (on_sqlite, sqlite_used, _) = found[pg_url], found[sqlite_url]
    assert on_pg == on_sqlite and pg_used == sqlite_used
    assert [charges[0].grants for charges in on_pg[:6]] == [
        (),
        (("spent", 1),),
        (("expiring", 1),),
        (("now", 1),),  # the lone live grant: "expiring" expired unused, "spent" spent
        (("now", 1),),
        (("now", 1), ("later", 1)),  # "later" in force, after "now" (priority 200)
    ]
    assert pg_used == {"spent": 1, "expiring": 1, "now": 3, "later": 1}
    assert applied >= 6  # the draws decided by the function (a first denial notifies)


def test_a_flat_price_and_its_spend_cap_take_one_trip(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spend charge is added to the event before the call and decided
    with it, all or nothing; a consumed priced charge's row carries its
    price."""
    with Meter(pg_url, clock=FrozenClock(START)) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1h", window="calendar"),
                spend_limit("spend", "0.05", "USD", "1mo", window="calendar"),
            ]
        )
        meter.set_price("calls", "0.02", "USD")
        meter.consume("other", "calls")  # caches the limits
        before = STATS.copy()
        waits = count_network_waits(monkeypatch)
        first = meter.consume("org", "calls", 2)
        assert waits[0] == 1 and STATS["applied"] - before["applied"] == 1
        calls, spend = first.charges
        assert (calls.price, spend.limit, spend.cost, spend.used) == (("USD", 4), "spend", 4, 4)
        denied = meter.consume("org", "calls", 1)  # 2 cents more than the cap's 1 left
        assert denied.denied_by == ("spend",) and denied.charges[0].price is None
        assert STATS["applied"] - before["applied"] == 1  # a first denial notifies
        assert not meter.consume("org", "calls", 1).allowed
        assert STATS["applied"] - before["applied"] == 2
        assert STATS["applied"] - before["applied"] == 2


# (minutes on, charges (limit, cost)): across tiers' ends, a window's first
# charge (its flat fee), half cents and the spend cap's last cents.
TIERED_EVENTS = [
    (0, [("grad", 2)]),  # flat fee 5 + 2 x 1
    (1, [("grad", 1)]),  # to the tier's end: 1
    (0, [("grad", 3)]),  # 3 x 0.4 = 1.2: 1
    (0, [("grad", 1)]),  # 2.4 -> 2 less 1: 1
    (0, [("vol", 4)]),  # a first-use window: 4 x 2 = 8
    (1, [("vol", 1)]),  # 5 x 1 = 5 < 8: 0
    (0, [("vol", 7)]),  # the highest: 10 x 1 = 10 (12 x 0.3 = 3.6): 2
    (0, [("pack", 1)]),  # a package: 5
    (0, [("pack", 2), ("grad", 1)]),  # no new package; 4.6 -> 5 to 5.0: 0
    (1, [("pack", 1), ("unit", 3)]),  # a package; flat fee 2 + 4.5 -> 4
    (0, [("unit", 1)]),  # 6.0 to 7.5 -> 8: 2, 38 of the cap's 40
    (0, [("pack", 30)]),  # 10 packages: past the cap, all denied (notify)
    (0, [("pack", 3), ("unit", 1)]),  # 5 + 2: still past it
    (0, [("pack", 1), ("unit", 1)]),  # 0 + 2: the cap's last 2 cents
    (0, [("grad", 1)]),  # 5.0 to 5.4 -> 5: 0 fits a full cap
    (0, [("grad", 1)]),  # 5.4 to 5.8 -> 6: a cent past it
    (58, [("grad", 2)]),  # a new hour: its flat fee past it
]


def test_tiered_prices_take_one_trip_as_the_reference_decides(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Graduated, volume and package prices and flat fees: the function prices
    each charge by its counter's total before the event, as the reference
    engine does, and the spend cap stops at the right cent, all or nothing."""
    clock = FrozenClock(START - timedelta(minutes=30))
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("grad", maximum=100, period="1h", window="calendar"),
                Limit("vol", maximum=100, period="30m"),
                Limit("pack", maximum=100, period="1h", window="calendar"),
                Limit("unit", maximum=100, period="1h", window="calendar"),
                spend_limit("spend", "0.40", "USD", "1mo", window="calendar"),
            ]
        )
        at = START - timedelta(days=1)
        tiers = {"model": "graduated", "tiers": ["3:0.01", "inf:0.004"], "flat_fee": "0.05"}
        meter.set_price("grad", None, "USD", at, **tiers)
        tiers = {"model": "volume", "tiers": ["4:0.02", "10:0.01", "inf:0.003"]}
        meter.set_price("vol", None, "USD", at, **tiers)
        meter.set_price("pack", None, "USD", at, model="package", package=3, per_package="0.05")
        meter.set_price("unit", "0.015", "USD", at, flat_fee="0.02")
        meter.consume("other", "grad")  # caches the limits
        reference = meter._engine.path("reference")
        before = STATS.copy()
        waits = count_network_waits(monkeypatch)
        found = []
        for number, (minutes, charges) in enumerate(TIERED_EVENTS):
            clock.advance(minutes=minutes)
            made = [("org", name, cost) for name, cost in charges]
            event = make_event(made, clock(), f"e-{number}")
            expected = reference.check(event, meter.database.now_us())
            trips = waits[0]
            decided = meter.consume(charges=made, event_id=f"e-{number}")
            trips = waits[0] - trips
            assert (decided.outcome, decided.charges) == (expected.outcome, expected.charges)
            spend = decided.charges[-1]
            prices = [c.price[1] if c.price else None for c in decided.charges[:-1]]
            found.append((trips, decided.outcome, prices, spend.cost, spend.used))
        assert STATS["applied"] - before["applied"] == len(TIERED_EVENTS) - 1
    allowed = [(7, 7), (1, 8), (1, 9), (1, 10), (8, 18), (0, 18), (2, 20), (5, 25)]
    assert found[:8] == [(1, "allowed", [amount], amount, used) for amount, used in allowed]
    assert found[8:] == [
        *[(1, "allowed", [0, 0], 0, 25), (1, "allowed", [5, 6], 11, 36)],
        *[(1, "allowed", [2], 2, 38), (3, "denied", [None], 50, 38)],
        *[(1, "denied", [None, None], 7, 38), (1, "allowed", [0, 2], 2, 40)],
        *[(1, "allowed", [0], 0, 40), (1, "denied", [None], 1, 40), (1, "denied", [None], 7, 40)],
    ]


# (seconds on, cost, released first): a breaker past 2x its floor for a
# minute trips; its quarantine holds the subject to 3; released, it steps
# again after gaps whose decay is subnormal (12 h) and 0 (13 h), then forgotten.
BREAKER_EVENTS = [
    (0, 1, False),  # past the bound: over since now
    (30, 1, False),
    (31, 1, False),  # a minute past it: trips (notify, decided by the fast path)
    (1, 2, False),  # held to 3 of which 3 are used: denied (a first denial: notify)
    (1, 1, False),  # denied again
    (60, 1, True),  # released: its history starts again
    (43_000, 4, False),  # a new window; e^-716.7: a subnormal decay
    (46_800, 2, False),  # e^-780: 0
    (4_400_000, 1, False),  # past 50 days: forgotten
]


def test_a_breaker_is_stepped_by_the_function_as_python_steps_it(pg_url: str) -> None:
    """The function reads the breaker under lock after the counters, holds a
    quarantined subject to its quarantine, and steps the rates in the same
    float arithmetic as `breaker.step` (equal to the last bit, through the
    decays that underflow); the charge that trips it is declined, and the fast
    path sends ``limit.quarantined``."""
    clock = FrozenClock(START)
    limit = Limit(
        "runaway",
        maximum=1000,
        period="1h",
        window="calendar",
        breaker="2x",
        breaker_floor=0.001,
        quarantine_max=3,
    )
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits([limit])
        meter.consume("other", "runaway")  # caches the limits
        reference = meter._engine.path("reference")
        before = STATS.copy()
        expected: Breaker | None = None
        found = []
        for number, (seconds, cost, release) in enumerate(BREAKER_EVENTS):
            clock.advance(seconds=seconds)
            now_us = meter.database.now_us()
            if release:
                meter.release_quarantine("org", "runaway")
                assert expected is not None
                expected = released(expected, now_us)
            event = make_event([("org", "runaway", cost)], clock(), f"e-{number}")
            checked = reference.check(event, now_us)
            decided = meter.consume("org", "runaway", cost, event_id=f"e-{number}")
            assert (decided.outcome, decided.charges) == (checked.outcome, checked.charges)
            if decided.allowed:
                expected, _ = step(expected, cost, now_us, 2, 0.001)
            with meter.sql_engine.connect() as connection:
                row = connection.execute(select(breakers).where(breakers.c.subject == "org")).one()
            assert row[2:] == tuple(expected), number
            found.append((decided.outcome, decided.charges[0].maximum))
        applied = STATS["applied"] - before["applied"]
        with meter.sql_engine.connect() as connection:
            notices = connection.execute(select(webhook_messages.c.type)).scalars().all()
    assert found == [
        *[("allowed", 1000), ("allowed", 1000), ("allowed", 1000), ("denied", 3), ("denied", 3)],
        *[("allowed", 1000), ("allowed", 1000), ("allowed", 1000), ("allowed", 1000)],
    ]
    assert applied == len(BREAKER_EVENTS) - 2  # the trip and the first denial notify
    assert notices.count("limit.quarantined") == 1


def test_a_subject_with_a_time_zone_takes_one_trip(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its window of days starts at its local midnight and its counters bill in
    its local month: both worked out before the call, decided by the function."""
    clock = FrozenClock(START - timedelta(days=3))
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("day", maximum=5, period="1d", window="calendar"),
                Limit("fu", maximum=4, period="30m"),
            ]
        )
        meter.set_time_zone("org", "Asia/Kathmandu")  # +05:45: 2026-12-01 04:45 at START
        clock.set(START)
        meter.consume("other", "day")  # caches the limits
        before = STATS.copy()
        waits = count_network_waits(monkeypatch)
        day = meter.consume("org", "day", 2).charges[0]
        assert meter.consume("org", "fu").allowed
        assert waits[0] == 2 and STATS["applied"] - before["applied"] == 2
        midnight = datetime(2026, 11, 30, 18, 15, tzinfo=UTC)
        assert (day.window_start, day.resets_at) == (midnight, midnight + timedelta(days=1))
        with meter.sql_engine.connect() as connection:
            months = connection.execute(
                select(counters.c.limit_name, counters.c.billing_month)
                .where(counters.c.subject == "org")
                .order_by(counters.c.limit_name)
            ).all()
        assert [tuple(row) for row in months] == [("day", "2026-12"), ("fu", "2026-12")]


def test_dimensions_take_one_trip(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumed charge's cost and event go to its dimensions' hourly rollups
    in the function's statement; a denied event adds nothing."""
    with Meter(pg_url, clock=FrozenClock(START)) as meter:
        meter.set_limit(Limit("calls", maximum=5, period="1h", dimensions=("route", "model")))
        meter.consume("other", "calls")  # caches the limits
        before = STATS.copy()
        waits = count_network_waits(monkeypatch)
        for route in ["/a", "/a", "/b", None]:
            assert meter.consume("org", "calls", metadata={"route": route, "model": 1}).allowed
        assert waits[0] == 4 and STATS["applied"] - before["applied"] == 4
        assert not meter.consume("org", "calls", 3, metadata={"route": "/a"}).allowed
        rollups = ROLLUPS.c
        with meter.sql_engine.connect() as connection:
            rows = connection.execute(
                select(
                    rollups.dimension,
                    rollups.value,
                    func.sum(rollups.used),
                    func.sum(rollups.events),
                )
                .where(rollups.subject == "org")
                .group_by(rollups.dimension, rollups.value)
                .order_by(rollups.dimension, rollups.value)
            ).all()
            # Appended, as the batches' (no rollup row upserted, so none locked).
            keyed = connection.execute(select(func.count()).select_from(usage_rollups)).scalar()
        assert keyed == 0
        assert [tuple(row) for row in rows] == [
            ("model", "1", 4, 4),
            ("route", "", 1, 1),
            ("route", "/a", 2, 2),
            ("route", "/b", 1, 1),
        ]


def test_a_result_written_by_the_function_carries_the_reset_clocks_tick(pg_url: str) -> None:
    """Its result's ``reset_tick`` is the clock's when it is written, as the
    column's default gives every other writer: a void then knows the reset
    came before or after it."""
    with Meter(pg_url, clock=FrozenClock(START)) as meter:
        meter.set_limit(Limit("calls", maximum=5, period="1h"))
        meter.consume("other", "calls")  # caches the limits
        before = STATS.copy()
        meter.consume("org", "calls", event_id="before")
        assert meter.reset(subject="org") == 1
        meter.consume("org", "calls", event_id="after")
        assert STATS["applied"] - before["applied"] == 2
        with meter.sql_engine.connect() as connection:
            ticks = connection.execute(
                select(results.c.event_id, results.c.reset_tick)
                .where(results.c.event_id.in_(["before", "after"]))
                .order_by(results.c.reset_tick)
            ).all()
        (_, tick), (_, later) = ticks  # (the limit's definition ticked the clock too)
        assert [event_id for event_id, _ in ticks] == ["before", "after"] and later == tick + 1
        assert meter.void("before", "refund").charges == ()
        assert [c[2] for c in meter.void("after", "refund").charges] == [1]


def test_a_zoned_first_use_counter_of_an_older_window_is_declined(pg_url: str) -> None:
    """Its billing month is that of the window's start, which Python does not
    know: the function declines it (``zone``) and the fast path decides it."""
    clock = FrozenClock(START - timedelta(days=3))
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limit(Limit("fu", maximum=4, period="1h"))
        meter.set_time_zone("org", "Asia/Kathmandu")
        clock.set(START)
        assert meter.consume("org", "fu").used == 1  # the window opens: the function's
        with meter.sql_engine.begin() as connection:  # its counter goes, the window stays
            connection.execute(counters.delete())
        clock.advance(minutes=5)
        before = STATS.copy()
        assert meter.consume("org", "fu").used == 1
        assert STATS["declined:zone"] - before["declined:zone"] == 1
        with meter.sql_engine.connect() as connection:
            months = connection.execute(select(counters.c.billing_month)).scalars().all()
        assert months == ["2026-12"]


# (minutes on, limit, cost): the paced limits' events, from 23:10 in the hour's window.
PACED_EVENTS = [
    (0, "paced", 10),  # the pace is 10 of 60 + a burst of 2
    (0, "paced", 3),  # 13 > 12: denied, back on pace at 23:11 (a first denial: notify)
    (0, "paced", 2),
    (5, "paced", 1),
    (0, "paced", 9),  # 22 > 17: denied, back on pace at 23:20
    (0, "soft", 30),  # past its pace of 15, within 60: ahead_of_pace
    (0, "soft", 40),  # overage (the first: notify)
    (0, "fu", 2),  # a first-use window opens: a burst of 3
    (0, "fu", 5),  # denied (notify)
    (3, "fu", 5),  # 7 > 6: denied, back on pace 4 minutes into its window
    (1, "fu", 3),
]


def test_paced_limits_take_one_trip_as_the_reference_decides(pg_url: str) -> None:
    """A paced window's allowance at the event is its pace; a denial retries
    when usage is back on pace, and a soft limit's charge past it is
    ``ahead_of_pace``: each charge as the reference engine decides it, the
    function deciding all but what notifies."""
    clock = FrozenClock(START + timedelta(minutes=10))
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("paced", maximum=60, period="1h", window="calendar", pacing=True, burst=2),
                Limit(
                    "soft",
                    maximum=60,
                    period="1h",
                    window="calendar",
                    enforcement="soft",
                    pacing=True,
                    burst=0,
                ),
                Limit("fu", maximum=30, period="30m", pacing=True, burst="10%"),
            ]
        )
        meter.consume("other", "paced")  # caches the limits
        reference = meter._engine.path("reference")
        before = STATS.copy()
        found = []
        for number, (minutes, name, cost) in enumerate(PACED_EVENTS):
            clock.advance(minutes=minutes)
            event = make_event([("org", name, cost)], clock(), f"e-{number}")
            expected = reference.check(event, meter.database.now_us())
            decided = meter.consume("org", name, cost, event_id=f"e-{number}")
            assert (decided.outcome, decided.charges) == (expected.outcome, expected.charges)
            found.append((decided.charges[0].outcome, decided.charges[0].retry_at))
        assert STATS["applied"] - before["applied"] == 8
    at = START.replace(minute=11), START.replace(minute=20), START.replace(minute=19)
    print(found)
    assert found == [
        *[("allowed", None), ("denied", at[0]), ("allowed", None), ("allowed", None)],
        *[("denied", at[1]), ("ahead_of_pace", None), ("overage", None), ("allowed", None)],
        *[("denied", at[2]), ("denied", at[2]), ("allowed", None)],
    ]


# (minutes on, gauge, level, seconds late): reports of a peak and of a last level.
GAUGE_EVENTS = [
    (0, "peak", 3, 0),
    (1, "peak", 2, 0),  # the peak stays 3
    (0, "peak", 9, 0),  # past 6: denied (a first denial: notify)
    (1, "peak", 8, 0),  # denied again
    (0, "peak", 6, 0),
    (0, "level", 4, 0),  # a first-use window opens
    (1, "level", 0, 0),  # a level of 0
    (0, "level", 7, 30),  # older than the level's instant: the level stays 0
    (1, "level", 9, 0),  # soft: overage starts (notify)
    (1, "level", 10, 0),  # still over
    (0, "level", 2, 0),
]


def test_gauges_take_one_trip_as_the_reference_decides(pg_url: str) -> None:
    """A report's level is the peak or the last (unless older than it); hard
    fits iff the level is within the maximum, soft bills the overage: each
    charge as the reference engine decides it, the function deciding all but
    what notifies, and the counters holding the levels."""
    clock = FrozenClock(START + timedelta(minutes=10))
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("peak", maximum=6, period="1h", window="calendar", aggregation="max"),
                Limit("level", maximum=5, period="30m", aggregation="latest", enforcement="soft"),
            ]
        )
        meter.consume("other", "peak")  # caches the limits
        reference = meter._engine.path("reference")
        before = STATS.copy()
        used = []
        for number, (minutes, name, level, late) in enumerate(GAUGE_EVENTS):
            clock.advance(minutes=minutes)
            at = clock() - timedelta(seconds=late)
            event = make_event([("org", name, level)], at, f"e-{number}")
            expected = reference.check(event, meter.database.now_us())
            decided = meter.consume("org", name, level, event_id=f"e-{number}", occurred_at=at)
            assert (decided.outcome, decided.charges) == (expected.outcome, expected.charges)
            used.append((decided.outcome, decided.charges[0].used))
        assert STATS["applied"] - before["applied"] == 9
        with meter.sql_engine.connect() as connection:
            rows = connection.execute(
                select(counters.c.limit_name, counters.c.used, counters.c.denied_count)
                .where(counters.c.subject == "org")
                .order_by(counters.c.limit_name)
            ).all()
    assert used == [
        *[("allowed", 3), ("allowed", 3), ("denied", 3), ("denied", 3), ("allowed", 6)],
        *[("allowed", 4), ("allowed", 0), ("allowed", 0), ("overage", 9), ("overage", 10)],
        ("allowed", 2),
    ]
    assert [tuple(row) for row in rows] == [("level", 2, 0), ("peak", 6, 2)]


@pytest.mark.parametrize("seed", [1, 2])
def test_two_meters_drawing_on_one_grant_never_pass_it(pg_url: str, seed: int) -> None:
    """Events of this hour and late ones of the last draw on the same grant
    under two counters' locks: the function reads the grant unlocked, so a
    draw that another transaction changed meanwhile must fail its statement
    (the fast path then decides). The grant is never overdrawn, and its
    draws are what the allowed events' rows say."""
    clock = FrozenClock(START + timedelta(minutes=30))
    amount = 30
    with (
        Meter(pg_url, clock=clock, group_commit=False) as a,
        Meter(pg_url, clock=clock, group_commit=False) as b,
    ):
        a.set_limit(Limit("calls", maximum=1, period="1h", window="calendar"))
        a.grant("org", "calls", amount, grant_id="pool")
        before = STATS.copy()
        errors: list[BaseException] = []

        def hammer(meter: Meter, rng: random.Random) -> None:
            try:
                for _ in range(25):
                    late = timedelta(hours=rng.choice([0, 1]))
                    meter.consume("org", "calls", occurred_at=clock() - late)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=hammer, args=(meter, random.Random(seed * 10 + n)))
            for n, meter in enumerate((a, b, a, b))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        [grant] = a.grants("org", "calls")
        paid = 0
        with a.sql_engine.connect() as connection:
            for (event_id,) in connection.execute(
                select(results.c.event_id).where(results.c.outcome == "allowed")
            ):
                decision = a.result(event_id)
                assert decision is not None
                paid += sum(n for _, n in decision.charges[0].grants)
    assert grant.used == paid == amount  # 100 events, 2 windows of 1 and 30 granted: all drawn
    assert STATS["applied"] - before["applied"] > 0


def test_a_draw_leaving_a_grant_at_its_low_threshold_is_declined_as_a_notice(
    pg_url: str,
) -> None:
    """The function draws on a grant with a low threshold while it stays above
    it; the draw that leaves it at the threshold is declined (``notify``: the
    fast path announces ``grant.low``) and drawn once, by the fast path."""
    with Meter(pg_url, clock=FrozenClock(START)) as meter:
        meter.set_limit(Limit("calls", maximum=1, period="1h", window="calendar"))
        meter.grant("org", "calls", 10, grant_id="g", low=7)
        meter.consume("org", "calls")  # the own allowance; the limits cached
        before = STATS.copy()
        paid = [meter.consume("org", "calls", 1).charges[0].grants for _ in range(3)]
        assert paid == [(("g", 1),)] * 3
        assert STATS["applied"] - before["applied"] == 2
        assert STATS["declined:notify"] - before["declined:notify"] == 1
        assert [g.used for g in meter.grants("org", "calls")] == [3]


def test_a_grant_drawn_on_while_the_function_decides_fails_its_statement(pg_url: str) -> None:
    """Another transaction spends the grant after the function read it
    (unlocked) and before its draw: the draw, guarded by the ``used`` it
    read, finds it changed and fails the statement, writing nothing (the
    grant would have room for it: only the figures would be stale); the
    fast path decides the event again on the balance as it is now."""
    with Meter(pg_url, clock=FrozenClock(START), group_commit=False) as meter:
        meter.set_limit(Limit("calls", maximum=1, period="1h", window="calendar"))
        meter.grant("org", "calls", 10, grant_id="g")
        meter.consume("org", "calls")  # the own allowance: the next are the grant's
        raw = meter.sql_engine.raw_connection()
        try:
            other = raw.cursor()
            other.execute("UPDATE grants SET used = 3 WHERE grant_id = 'g'")  # uncommitted
            before = STATS.copy()
            found: list[Any] = []
            worker = threading.Thread(
                target=lambda: found.append(meter.consume("org", "calls", 5, event_id="e"))
            )
            worker.start()
            with meter.sql_engine.connect() as watch:  # the function waits on the grant's lock
                waiting = text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE '%metering_consume_one%'"
                )
                for _ in range(2000):
                    if watch.execute(waiting).scalar():
                        break
                    watch.rollback()
                    threading.Event().wait(0.005)
            raw.commit()
            worker.join()
        finally:
            raw.close()
        [decision] = found
        assert STATS["declined:error"] - before["declined:error"] == 1
        assert decision.allowed and decision.remaining == 2  # of 7 left, not of 10
        assert [g.used for g in meter.grants("org", "calls")] == [8]


def _call(meter: Meter, charges: list[Any], at: datetime, metadata: Any = None) -> Any:
    """`prepare`'s call for ``charges`` at ``at`` (now too), with the plans kept."""
    event = make_event(charges, at, f"e-{random.getrandbits(32)}", metadata).record()
    return prepare(meter._engine.limits, event, int(at.timestamp() * 1_000_000))


def _planned_and_afresh(meter: Meter, charges: list[Any], at: datetime) -> tuple[Any, Any]:
    """The call with the plans kept, and the call with none (the plans forgotten)."""
    event = make_event(charges, at, "e-same").record()
    cache, now_us = meter._engine.limits, int(at.timestamp() * 1_000_000)
    planned = prepare(cache, event, now_us)
    kept = dict(cache.plans)
    cache.plans.clear()
    afresh = prepare(cache, event, now_us)
    cache.plans.update(kept)
    return planned, afresh


def test_a_plan_serves_every_cost_of_its_subjects_and_limits(meter: Meter) -> None:
    charges = [("org", "cal", 2), ("org", "fu", 1), ("org", "seats", 1)]
    _call(meter, charges, AT, {"u": 7})
    plans = dict(meter._engine.limits.plans)
    for cost in (5, 1, 3):
        charges = [("org", "cal", cost), ("org", "fu", cost + 1), ("org", "seats", 1)]
        event = make_event(charges, AT, "e-same", {"u": cost}).record()
        planned = prepare(meter._engine.limits, event, meter.database.now_us())
        assert meter._engine.limits.plans == plans  # the one plan, met again
        meter._engine.limits.plans.clear()
        assert planned == prepare(meter._engine.limits, event, meter.database.now_us())
        cal, fu, seat = _charges(planned)
        assert (cal[2], cal[9], fu[2]) == (cost, f'"org","cal",{cost}', cost + 1)
        assert seat[12] == str(cost)


def test_a_plan_is_not_used_past_its_calendar_window(meter: Meter) -> None:
    end = datetime(2026, 11, 22, 13, tzinfo=UTC)
    _call(meter, [("org", "cal", 1)], end - timedelta(microseconds=1))
    planned, afresh = _planned_and_afresh(meter, [("org", "cal", 1)], end)
    assert planned == afresh and _charges(planned)[0][7:9] == [HOUR_US + HOUR, HOUR_US + 2 * HOUR]


def test_a_plan_is_not_used_past_a_change_of_the_subjects_maximum(meter: Meter) -> None:
    change = AT + timedelta(minutes=30)
    meter.set_entitlement("org", "cal", 2, effective_from=change)
    _reload(meter)
    [before] = _charges(_call(meter, [("org", "cal", 1)], change - timedelta(microseconds=1)))
    planned, afresh = _planned_and_afresh(meter, [("org", "cal", 1)], change)
    assert before[4] == 6 and planned == afresh and _charges(planned)[0][4] == 2
    # A late event, before the change, after the plan from it on.
    late = change - timedelta(minutes=1)
    planned, afresh = _planned_and_afresh(meter, [("org", "cal", 1)], late)
    assert planned == afresh and _charges(planned)[0][4] == 6


def test_a_plan_is_not_used_past_a_change_of_price(meter: Meter) -> None:
    change = AT + timedelta(minutes=30)
    meter.set_limit(spend_limit("spend", "1000", "USD", "1h", window="calendar"))
    meter.set_price("cal", "0.01", "USD", effective_from=AT - timedelta(hours=1))
    meter.set_price("cal", "0.02", "USD", effective_from=change)
    _reload(meter)
    cache = meter._engine.limits
    [cal, _] = _charges(_call(meter, [("org", "cal", 3)], change - timedelta(microseconds=1)))
    [kept] = cache.plans.values()
    planned, afresh = _planned_and_afresh(meter, [("org", "cal", 3)], change)
    # (The price is applied per call: the plan is made again from the change on all the same.)
    assert planned == afresh and [kept] != list(cache.plans.values())
    assert cal[15] != _charges(planned)[0][15]  # its (currency, amount)


def test_a_plan_does_not_hide_a_recurring_grants_issue_due_by_now(meter: Meter) -> None:
    meter.grant("org", "fu", 5, every="1mo")  # issued now, the next in a month
    _reload(meter)
    assert not isinstance(_call(meter, [("org", "fu", 1)], AT), Declined)
    plans = dict(meter._engine.limits.plans)
    due = _call(meter, [("org", "fu", 1)], AT + timedelta(days=40))
    assert isinstance(due, Declined) and due.need == Need.RECURRING
    assert meter._engine.limits.plans == plans  # the plan met again: the due time checked


def test_plans_are_forgotten_with_their_version_and_past_their_number(
    meter: Meter, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = meter._engine.limits
    _call(meter, [("org", "cal", 1)], AT)
    assert cache.plans
    old = dict(cache.plans)
    meter.set_limit(Limit("cal", maximum=8, period="1h", window="calendar"))
    _reload(meter)
    assert not cache.plans
    cache.plans.update(old)  # (as a thread that read the older version may leave one)
    assert _charges(_call(meter, [("org", "cal", 1)], AT))[0][4] == 8
    monkeypatch.setattr("metering.engine.one_trip.PLANS_KEPT", 3)
    for n in range(7):
        _call(meter, [(f"org-{n}", "cal", 1)], AT)
        assert 1 <= len(cache.plans) <= 3
