"""Seats: limits that count distinct metadata values (``Limit(distinct=KEY)``),
on SQLite and PostgreSQL, through `Meter`: costs, enforcement, thresholds and
``limit.denied``, entitlements, grants, voids, resets, reports, the worker's
batches, and bad input that stores nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.events import make_event
from metering.errors import InvalidInput, InvalidLimit
from metering.reports.overage import overage_report, usage_report
from metering.storage.distinct import DistinctStore
from metering.storage.tables import distinct_values, results, webhook_messages

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)


def seats_limit(**overrides: Any) -> Limit:
    fields: dict[str, Any] = {"name": "seats", "maximum": 3, "period": "1mo"}
    return Limit(**{**fields, "window": "calendar", "distinct": "user", **overrides})


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Any:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(seats_limit())
        yield meter


def _seat(meter: Meter, user: object, event_id: str, subject: str = "org-1") -> Any:
    return meter.consume(subject, "seats", metadata={"user": user}, event_id=event_id)


def _used(meter: Meter, subject: str = "org-1") -> list[int]:
    return [counter.used for counter in meter.counters(subject, "seats")]


def _messages(meter: Meter) -> list[str]:
    with meter.sql_engine.connect() as connection:
        query = select(webhook_messages.c.type).order_by(webhook_messages.c.id)
        return list(connection.execute(query).scalars())


def _stored(meter: Meter) -> tuple[int, int]:
    with meter.sql_engine.connect() as connection:
        return (
            connection.execute(select(func.count()).select_from(results)).scalar_one(),
            connection.execute(select(func.count()).select_from(distinct_values)).scalar_one(),
        )


def test_a_value_costs_one_seat_once_per_window(meter: Meter) -> None:
    outcomes = [_seat(meter, user, f"e{n}") for n, user in enumerate(["ann", "ann", "bob", 7])]
    assert [d.charges[0].cost for d in outcomes] == [1, 0, 1, 1]
    assert [d.used for d in outcomes] == [1, 1, 2, 3]
    assert all(d.allowed for d in outcomes)
    assert _seat(meter, "7", "e4").charges[0].cost == 0  # 7 and "7" are one value
    assert _used(meter) == [3]
    assert meter.seats("org-1", "seats") == ["7", "ann", "bob"]


def test_a_new_value_beyond_the_maximum_is_denied_and_a_held_one_still_allowed(
    meter: Meter, clock: FrozenClock
) -> None:
    for n, user in enumerate(["a", "b", "c"]):
        _seat(meter, user, f"e{n}")
    denied = _seat(meter, "d", "e3")
    assert (denied.outcome, denied.denied_by, denied.used) == ("denied", ("seats",), 3)
    assert denied.retry_at == datetime(2026, 12, 1, tzinfo=UTC)
    assert _seat(meter, "b", "e4").outcome == "allowed"
    assert _seat(meter, "e", "e5").outcome == "denied"
    [counter] = meter.counters("org-1", "seats")
    assert (counter.used, counter.denied_count, counter.denied_cost) == (3, 2, 2)
    assert _messages(meter).count("limit.denied") == 1  # once per window
    # The next month is a new window: every value costs a seat again.
    clock.set(datetime(2026, 12, 1, tzinfo=UTC))
    decision = meter.consume("org-1", "seats", metadata={"user": "a"})
    assert (decision.charges[0].cost, decision.used) == (1, 1)


def test_check_tells_a_held_value_from_a_new_one_and_stores_nothing(meter: Meter) -> None:
    for n, user in enumerate(["a", "b", "c"]):
        _seat(meter, user, f"e{n}")
    before = _stored(meter)
    held = meter.check("org-1", "seats", metadata={"user": "a"})
    new = meter.check("org-1", "seats", metadata={"user": "z"})
    assert (held.allowed, held.charges[0].cost) == (True, 0)
    assert (new.allowed, new.denied_by) == (False, ("seats",))
    assert _stored(meter) == before


def test_soft_seats_are_overage_and_shadow_seats_would_deny(meter: Meter) -> None:
    meter.set_limit(seats_limit(name="soft", enforcement="soft", thresholds=(100,)))
    meter.set_limit(seats_limit(name="shadow", enforcement="shadow"))
    for n, user in enumerate(["a", "b", "c", "d", "d", "e"]):
        meter.consume(
            charges=[("org-1", "soft", 1), ("org-1", "shadow", 1)],
            metadata={"user": user},
            event_id=f"e{n}",
        )
    [soft] = meter.counters("org-1", "soft")
    [shadow] = meter.counters("org-1", "shadow")
    assert soft.used == 5
    # d, d and e would be denied: a would-deny takes no seat, so d is new twice.
    assert (shadow.used, shadow.denied_count) == (3, 3)
    [row] = overage_report(meter, period="2026-11", limit="soft")
    assert (row.used, row.maximum, row.overage) == (5, 3, 2)  # overage in seats
    types = _messages(meter)
    assert types.count("limit.threshold") == 1 and types.count("limit.exceeded") == 1


def test_an_entitlement_and_a_grant_give_a_customer_more_seats(meter: Meter) -> None:
    meter.set_entitlement("org-1", "seats", 4, effective_from=NOVEMBER)
    meter.grant("org-1", "seats", 1, grant_id="extra")
    decisions = [_seat(meter, f"u{n}", f"e{n}") for n in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert decisions[4].charges[0].grants == (("extra", 1),)
    assert decisions[0].maximum == 4
    # Lowered below the seats held: held values stay allowed, new ones are denied.
    meter.set_entitlement("org-1", "seats", 2, effective_from=NOW)
    assert _seat(meter, "u1", "again").allowed
    assert not _seat(meter, "u9", "new").allowed


def test_voiding_the_only_event_of_a_value_frees_its_seat(meter: Meter) -> None:
    _seat(meter, "a", "a1")
    _seat(meter, "a", "a2")
    _seat(meter, "b", "b1")
    _seat(meter, "c", "c1")
    first = meter.void("a1", "wrong user")  # a still has a2: no seat comes back
    assert (first.charges[0][2], _used(meter)) == (0, [3])
    assert not _seat(meter, "d", "d1").allowed
    second = meter.void("a2", "wrong user")
    assert (second.charges[0][2], _used(meter)) == (1, [2])
    assert meter.void("a2", "again").duplicate and _used(meter) == [2]
    assert _seat(meter, "d", "d2").allowed
    assert _seat(meter, "a", "a3").charges[0].cost == 1  # a took a seat again


def test_a_value_with_many_live_events_is_freed_by_its_last_void(meter: Meter) -> None:
    # Its row is `HELD`; each void counts the others in the ledger, where the
    # voided events, the same value in another subject and another value do
    # not keep the seat.
    meter.apply([_event(f"a{n}", "a") for n in range(3)] + [_event("b1", "b")])
    _seat(meter, "a", "a3")
    _seat(meter, "a", "x1", subject="org-2")
    for n in range(3):
        assert meter.void(f"a{n}", "test").charges[0][2] == 0
        assert _used(meter) == [2] and "a" in meter.seats("org-1", "seats")
    assert meter.void("a3", "test").charges[0][2] == 1  # the last live event of "a"
    assert (_used(meter), meter.seats("org-1", "seats")) == ([1], ["b"])
    assert _seat(meter, "a", "a4").charges[0].cost == 1  # a new seat again
    with meter.sql_engine.connect() as connection:
        query = select(distinct_values.c.live_events).where(distinct_values.c.value == "a")
        assert sorted(connection.execute(query).scalars()) == [1, 1]


@pytest.mark.parametrize(
    ("subject", "first", "second"),
    [
        ("org-1", "a_b", "a_b"),
        ("org_%1", "a%b", "a%b"),
        ("org-1", "ünï", "ünï"),
        ("örg", 'q"t\\', 'q"t\\'),
        ("org-1", 7, "7"),  # the same value
    ],
)
def test_a_void_finds_a_values_other_live_event_whatever_its_characters(
    meter: Meter, subject: str, first: object, second: object
) -> None:
    _seat(meter, "axb", "x", subject=subject)  # another value, alike to a LIKE
    _seat(meter, first, "e1", subject=subject)
    _seat(meter, second, "e2", subject=subject)
    assert meter.void("e1", "test").charges[0][2] == 0  # e2 holds the seat
    assert meter.void("e2", "test").charges[0][2] == 1
    assert meter.seats(subject, "seats") == ["axb"]


def test_a_seat_paid_by_a_grant_goes_back_to_the_grant_when_voided(meter: Meter) -> None:
    meter.grant("org-1", "seats", 1, grant_id="extra")
    for n, user in enumerate(["a", "b", "c", "d"]):
        _seat(meter, user, f"e{n}")
    assert meter.void("e3", "test").charges[0][4] == (("extra", 1),)
    [grant] = meter.grants("org-1", "seats")
    assert grant.used == 0
    assert _seat(meter, "e", "e4").charges[0].grants == (("extra", 1),)


def test_a_reset_frees_every_seat_of_the_window(meter: Meter) -> None:
    _seat(meter, "a", "e0")
    _seat(meter, "b", "e1")
    meter.reset(subject="org-1", limit="seats")
    assert _seat(meter, "a", "e2").charges[0].cost == 1
    assert _used(meter) == [1]
    meter.void("e0", "before the reset")  # cleared by the reset: gives nothing back
    assert _used(meter) == [1]
    assert meter.seats("org-1", "seats") == ["a"]


def test_a_batch_decides_each_value_as_one_by_one(meter: Meter) -> None:
    users = ["a", "b", "a", "c", "d", "b", "e"]
    events = [
        make_event([("org-1", "seats", 1)], NOW, f"e{n}", {"user": u}) for n, u in enumerate(users)
    ]
    events.insert(3, make_event([("org-1", "seats", 1)], NOW, "bad", {"team": "x"}))
    decided = meter.apply(events, invalid="reject")
    outcomes = [d.outcome for d in decided]  # type: ignore[union-attr]
    assert outcomes == [
        *("allowed", "allowed", "allowed", "rejected", "allowed"),
        *("denied", "allowed", "denied"),
    ]
    assert "must carry it" in (decided[3].reason or "")  # type: ignore[union-attr]
    assert [d.charges[0].cost for d in decided if d.charges] == [1, 1, 0, 1, 1, 0, 1]  # type: ignore[union-attr]
    with meter.sql_engine.connect() as connection:
        assert DistinctStore(connection).live(
            [("seats", "org-1", to_start(), u) for u in "abcde"]
        ) == {
            ("seats", "org-1", to_start(), "a"): 1,
            ("seats", "org-1", to_start(), "b"): 1,
            ("seats", "org-1", to_start(), "c"): 1,
        }


def test_a_large_batch_leaves_held_values_and_makes_the_new_ones(meter: Meter) -> None:
    # More values than a few rows (`postgres.FEW_ROWS`): a held value's row is
    # not written again (`HELD`); one statement for the values with a row at 0
    # (a voided one), one for the values new.
    meter.set_limit(seats_limit(maximum=100))
    first = [f"u{n}" for n in range(10)] + ["u0"]
    meter.apply([_event(f"a{n}", u) for n, u in enumerate(first)])
    meter.void("a1", "test")  # u1's row stays, with no live event
    second = [f"u{n}" for n in range(25)] + ["u20"]
    decided = meter.apply([_event(f"b{n}", u) for n, u in enumerate(second)])
    costs = [d.charges[0].cost for d in decided]  # type: ignore[union-attr]
    assert costs == [0, 1, *[0] * 8, *[1] * 15, 0]
    live = {f"u{n}": 1 for n in range(25)}  # held: 1 whatever their live events
    with meter.sql_engine.connect() as connection:
        found = DistinctStore(connection).live([("seats", "org-1", to_start(), u) for u in live])
    assert found == {("seats", "org-1", to_start(), u): n for u, n in live.items()}
    assert _used(meter) == [25]
    assert meter.seats("org-1", "seats") == sorted(live)


def _event(event_id: str, user: str) -> Any:
    return make_event([("org-1", "seats", 1)], NOW, event_id, {"user": user})


def to_start() -> int:
    return int(NOVEMBER.timestamp()) * 1_000_000


# -- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "cost", "message"),
    [
        (None, 1, "must carry it"),
        ({"team": "x"}, 1, "must carry it"),
        ({"user": ""}, 1, "printable characters"),
        ({"user": 1.5}, 1, "printable characters"),
        ({"user": True}, 1, "printable characters"),
        ({"user": ["a"]}, 1, "printable characters"),
        ({"user": "x" * 201}, 1, "printable characters"),
        ({"user": "a"}, 2, "cost must be 1"),
    ],
)
def test_a_charge_on_a_seat_limit_without_a_good_value_is_refused_and_stores_nothing(
    meter: Meter, metadata: Any, cost: int, message: str
) -> None:
    _seat(meter, "a", "e0")
    before = (_stored(meter), _used(meter))
    with pytest.raises(InvalidInput, match=message):
        meter.consume("org-1", "seats", cost, metadata=metadata)
    with pytest.raises(InvalidInput, match=message):
        meter.check("org-1", "seats", cost, metadata=metadata)
    with pytest.raises(InvalidInput, match=message):  # stacked: the other charge consumes nothing
        meter.consume(charges=[("org-1", "plain", 1), ("org-1", "seats", cost)], metadata=metadata)
    assert (_stored(meter), _used(meter)) == before


def test_a_seat_limit_is_never_reserved(meter: Meter) -> None:
    before = _stored(meter)
    with pytest.raises(InvalidInput, match="do not reserve it"):
        meter.reserve("org-1", "seats", metadata={"user": "a"})
    assert _stored(meter) == before


@pytest.mark.parametrize("first", ["unknown", "cap"])
def test_a_reservation_of_a_seat_limit_is_refused_before_its_other_charges(
    meter: Meter, first: str
) -> None:
    """The fast path refuses the seats before an unknown limit or a spend
    limit charged directly, as the reference engine does."""
    meter.set_limit(spend_limit("cap", "1", "USD", "1d"))
    before = _stored(meter)
    charges = [("org-1", first, 1), ("org-1", "seats", 1)]
    with pytest.raises(InvalidInput, match="do not reserve it"):
        meter.reserve(charges=charges, metadata={"user": "a"})
    assert _stored(meter) == before


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"algorithm": "token_bucket", "period": "10s", "window": "first_use"}, "token bucket"),
        ({"distinct": ""}, "must be 1 to 64"),
        ({"distinct": "a b"}, "must be 1 to 64"),
        ({"distinct": 3}, "must be 1 to 64"),
    ],
)
def test_a_broken_seat_limit_is_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidLimit, match=message):
        seats_limit(**fields)


def test_a_seat_limit_round_trips_through_the_database(meter: Meter) -> None:
    assert meter.get_limit("seats") == seats_limit()
    assert meter.get_limit("seats").to_dict()["distinct"] == "user"
    assert Limit.from_dict(json.loads(json.dumps(seats_limit().to_dict()))) == seats_limit()


@pytest.fixture(autouse=True)
def _plain(request: pytest.FixtureRequest) -> None:
    if "meter" in request.fixturenames:
        meter = request.getfixturevalue("meter")
        meter.set_limit(Limit("plain", maximum=100, period="1mo", window="calendar"))


def test_the_clock_moves_windows(meter: Meter, clock: FrozenClock) -> None:
    _seat(meter, "a", "e0")
    clock.advance(timedelta(days=30))
    assert _seat(meter, "a", "e1").charges[0].cost == 1
    assert _used(meter) == [1, 1]


def test_a_repeated_event_id_counts_its_value_once(meter: Meter) -> None:
    first = _seat(meter, "a", "e0")
    again = _seat(meter, "a", "e0")
    assert (again.duplicate, again.charges[0].cost) == (True, first.charges[0].cost)
    with meter.sql_engine.connect() as connection:
        [live] = connection.execute(select(distinct_values.c.live_events)).scalars()
    assert (live, _used(meter)) == (1, [1])


def test_the_usage_report_shows_seats_per_window(meter: Meter, clock: FrozenClock) -> None:
    for n, user in enumerate(["a", "b", "a"]):
        _seat(meter, user, f"nov-{n}")
    clock.set(datetime(2026, 12, 2, tzinfo=UTC))
    _seat(meter, "c", "dec-0")
    rows = usage_report(meter, "org-1", limit="seats")
    assert [(row.window_start.month, row.used, row.maximum) for row in rows] == [
        (11, 2, 3),
        (12, 1, 3),
    ]
