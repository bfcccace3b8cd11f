"""The backtest's replay (`metering.domain.replay`) against an independent model.

The model is a few lines of arithmetic for one hard calendar window per
subject: an event is denied when the window's allowed usage plus its cost
passes the maximum. A random stream replayed through `Replay` with a
changed maximum must give the model's would-deny counts and costs.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from metering.domain.limits import Limit
from metering.domain.replay import Replay, SimulationRow, StoredEvent
from metering.domain.state import NO_WINDOW, CounterKey

HOUR_US = 3_600_000_000
T0 = 498_000 * HOUR_US  # 2026-10-24 00:00 UTC, on the hour


def model(stream: list[tuple[int, str, int]], maximum: int) -> dict[str, tuple[int, int, int]]:
    """Per subject: (events, events denied, cost denied) under an hourly hard window."""
    used: dict[tuple[str, int], int] = defaultdict(int)
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for at_us, subject, cost in stream:
        hour = at_us // HOUR_US  # calendar hours are aligned to the epoch's hours
        figures = found[subject]
        figures[0] += 1
        if used[(subject, hour)] + cost > maximum:
            figures[1] += 1
            figures[2] += cost
        else:
            used[(subject, hour)] += cost
    return {s: (f[0], f[1], f[2]) for s, f in found.items()}


streams = st.lists(
    st.tuples(
        st.integers(0, 3 * HOUR_US),
        st.sampled_from(["org-1", "org-2", "org-3"]),
        st.integers(1, 7),
    ),
    max_size=60,
).map(lambda events: sorted(events))


@settings(max_examples=60, deadline=None)
@given(streams, st.integers(1, 30))
def test_replay_gives_the_models_would_deny_counts(
    stream: list[tuple[int, str, int]], maximum: int
) -> None:
    replay = Replay({"calls": Limit("calls", maximum=maximum, period="1h", window="calendar")})
    for at_us, subject, cost in stream:
        replay.feed(StoredEvent(T0 + at_us, ((subject, "calls", cost),)))
    expected = model([(T0 + at_us, s, c) for at_us, s, c in stream], maximum)
    got = {r.subject: (r.events, r.would_deny_events, r.would_deny_cost) for r in replay.rows()}
    assert got == expected
    assert replay.replayed == len(stream)


def test_soft_limit_counts_overage_and_denials_then() -> None:
    replay = Replay({"calls": Limit("calls", maximum=3, period="1h", enforcement="soft")})
    for cost, denied in ((2, False), (2, True), (4, False)):
        charge = ["org-1", "calls", cost, not denied, "denied" if denied else "allowed"]
        replay.feed(StoredEvent.of_row(T0, [charge]))
    # 2 + 2 + 4 = 8 allowed against 3: 5 above the maximum, counted once.
    assert replay.rows() == [SimulationRow("org-1", "calls", 3, 0, 0, 5, 1)]


def test_entitlement_history_and_left_out_charges() -> None:
    limits = {"calls": Limit("calls", maximum=1, period="1h")}
    replay = Replay(limits, {("calls", "org-1"): ((T0 + 10, 5),)}, subject="org-1")
    for at in (0, 20, 30):  # before the entitlement: 1; after it: 5
        replay.feed(StoredEvent(T0 + at, (("org-1", "calls", 2), ("org-2", "calls", 1))))
    replay.feed(StoredEvent(T0 + 40, (("org-1", "gone", 1),)))  # a limit no longer in force
    assert replay.rows() == [SimulationRow("org-1", "calls", 3, 1, 2, 0, 0)]
    assert replay.replayed == 3


def test_stacked_event_is_all_or_nothing_and_first_use_windows_open_on_replay() -> None:
    limits = {
        "a": Limit("a", maximum=2, period="1h", window="first_use"),
        "b": Limit("b", maximum=10, period="1h"),
    }
    replay = Replay(limits)
    for at in (0, 1, 2, HOUR_US + 5):
        replay.feed(StoredEvent(T0 + at, (("s", "a", 1), ("s", "b", 1))))
    # The third event is denied by a: b consumes nothing then; the fourth opens a new a window.
    assert [r.to_dict() for r in replay.rows()] == [
        {
            "subject": "s",
            "limit": "a",
            "events": 4,
            "would_deny_events": 1,
            "would_deny_cost": 1,
            "overage": 0,
            "denied_events_then": 0,
        },
        {
            "subject": "s",
            "limit": "b",
            "events": 4,
            "would_deny_events": 0,
            "would_deny_cost": 0,
            "overage": 0,
            "denied_events_then": 0,
        },
    ]


def test_each_limit_kind_has_its_counter() -> None:
    limits = {
        "api": Limit("api", maximum=5, period="5s", algorithm="token_bucket"),
        "cal": Limit("cal", maximum=5, period="1h", window="calendar"),
        "fu": Limit("fu", maximum=5, period="1h", window="first_use"),
    }
    replay = Replay(limits)
    replay.feed(StoredEvent(T0 + 10, (("s", "api", 1), ("s", "cal", 1), ("s", "fu", 1))))
    replay.feed(StoredEvent(T0 + 20, (("s", "fu", 1),)))
    assert set(replay.states) == {
        CounterKey("api", "s", NO_WINDOW, NO_WINDOW),
        CounterKey("cal", "s", T0, T0 + HOUR_US),
        CounterKey("fu", "s", T0 + 10, T0 + 10 + HOUR_US),
    }
    assert replay.windows == {("fu", "s"): (T0 + 10, T0 + 10 + HOUR_US)}
    assert [(r.limit, r.events) for r in replay.rows()] == [("api", 1), ("cal", 1), ("fu", 2)]


def test_charges_left_out_do_not_end_the_event() -> None:
    limits = {
        "lic": Limit("lic", maximum=5, algorithm="concurrent"),
        "seats": Limit("seats", maximum=5, period="1mo", window="calendar", distinct="user"),
        "spend": Limit("spend", maximum=500, period="1mo", window="calendar", currency="EUR"),
        "cal": Limit("cal", maximum=5, period="1h", window="calendar"),
    }
    replay = Replay(limits, subject="s")
    charges = (
        ("s", "lic", 1),
        ("s", "seats", 1),
        ("s", "spend", 1),
        ("t", "cal", 1),
        ("s", "cal", 1),
    )
    replay.feed(StoredEvent(T0, charges))  # no metadata: the seat charge has no value
    assert replay.rows() == [
        SimulationRow("s", "cal", 1, 0, 0, 0, 0),
        SimulationRow("s", "spend", 1, 0, 0, 0, 0),
    ]
    assert replay.replayed == 1


def seat_event(at_us: int, user: str, *more: tuple[str, str, int]) -> StoredEvent:
    return StoredEvent(at_us, (("s", "seats", 1), *more), metadata={"user": user})


def test_a_seat_costs_one_for_a_value_its_window_does_not_hold() -> None:
    seats = Limit("seats", maximum=2, period="1h", window="calendar", distinct="user")
    replay = Replay({"seats": seats})
    for at, user in [(0, "a"), (1, "b"), (2, "a"), (3, "c"), (4, "b"), (HOUR_US, "c")]:
        replay.feed(seat_event(T0 + at, user))
    # c is a third seat in the first hour (denied), a new window's first after it.
    assert replay.rows() == [SimulationRow("s", "seats", 6, 1, 1, 0, 0)]
    assert set(replay.held) == {
        ("seats", "s", T0, "a"),
        ("seats", "s", T0, "b"),
        ("seats", "s", T0 + HOUR_US, "c"),
    }


def test_a_seat_is_taken_only_by_an_allowed_event_that_fits_it() -> None:
    limits = {
        "seats": Limit("seats", maximum=2, period="1d", window="calendar", distinct="user"),
        "calls": Limit("calls", maximum=1, period="1h", window="calendar"),
        "shadow": Limit(
            "shadow",
            maximum=1,
            period="1d",
            window="calendar",
            distinct="user",
            enforcement="shadow",
        ),
    }
    replay = Replay(limits)
    calls = ("s", "calls", 1)
    replay.feed(seat_event(T0, "a", calls))
    replay.feed(seat_event(T0 + 1, "b", calls))  # denied by calls: b takes no seat
    replay.feed(seat_event(T0 + HOUR_US, "c", calls))
    replay.feed(seat_event(T0 + 2 * HOUR_US, "b", calls))  # a third seat: denied
    assert replay.rows() == [
        SimulationRow("s", "calls", 4, 1, 1, 0, 0),
        SimulationRow("s", "seats", 4, 1, 1, 0, 0),
    ]
    # A shadow seat limit's would-deny takes no seat: b would be denied again.
    replay = Replay(limits)
    for at, user in [(0, "a"), (1, "b"), (2, "b")]:
        replay.feed(StoredEvent(T0 + at, (("s", "shadow", 1),), metadata={"user": user}))
    assert replay.rows() == [SimulationRow("s", "shadow", 3, 2, 2, 0, 0)]


def test_a_ledger_rows_metadata_names_its_seat() -> None:
    seats = Limit("seats", maximum=1, period="1h", window="calendar", distinct="user")
    replay = Replay({"seats": seats})
    for user in ("a", "a", "b"):  # b is a second seat: denied
        row = ["s", "seats", 1, True, "allowed"]
        replay.feed(StoredEvent.of_row(T0, [row], {"user": user}))
    assert replay.rows() == [SimulationRow("s", "seats", 3, 1, 1, 0, 0)]


def test_a_spend_cap_replays_the_amounts_recorded() -> None:
    spend = Limit("spend", maximum=500, period="1h", window="calendar", currency="USD")
    replay = Replay({"spend": spend, "calls": Limit("calls", maximum=100, period="1h")})
    for at, cents in enumerate([200, 200, 200, 50]):
        replay.feed(StoredEvent(T0 + at, (("s", "calls", 1), ("s", "spend", cents))))
    # 400 spent, 200 more would pass 500 (the event denied whole), then 50 fits.
    assert replay.rows() == [
        SimulationRow("s", "calls", 4, 0, 0, 0, 0),
        SimulationRow("s", "spend", 4, 1, 200, 0, 0),
    ]


def test_every_denial_then_is_counted() -> None:
    replay = Replay({"calls": Limit("calls", maximum=10, period="1h")})
    for _ in range(3):
        replay.feed(StoredEvent(T0, (("s", "calls", 1),), frozenset({"calls"})))
    assert replay.rows() == [SimulationRow("s", "calls", 3, 0, 0, 0, 3)]


def test_a_soft_charge_of_a_denied_event_adds_no_overage() -> None:
    limits = {
        "soft": Limit("soft", maximum=1, period="1h", enforcement="soft"),
        "hard": Limit("hard", maximum=1, period="1h"),
    }
    replay = Replay(limits)
    for at in range(3):
        replay.feed(StoredEvent(T0 + at, (("s", "soft", 1), ("s", "hard", 1))))
    assert replay.rows() == [
        SimulationRow("s", "hard", 3, 2, 2, 0, 0),
        SimulationRow("s", "soft", 3, 0, 0, 0, 0),
    ]


def test_a_bucket_taking_more_than_its_capacity_over_time_has_no_overage() -> None:
    replay = Replay({"api": Limit("api", maximum=2, period="2s", algorithm="token_bucket")})
    for second in range(5):
        replay.feed(StoredEvent(T0 + second * 1_000_000, (("s", "api", 1),)))
    assert replay.rows() == [SimulationRow("s", "api", 5, 0, 0, 0, 0)]


def test_a_subjects_time_zone_aligns_its_replayed_days() -> None:
    # Kathmandu's days start at 18:15 UTC: 18:10 and 18:20 fall in two of them.
    day = Limit("daily", maximum=1, period="1d", window="calendar")
    evening = 1_775_412_600_000_000  # 2026-04-05T18:10:00Z
    ten_minutes = 600_000_000
    for zones, would_deny in [({}, 1), ({"org": ((0, "Asia/Kathmandu"),)}, 0)]:
        replay = Replay({"daily": day}, zones=zones)
        replay.feed(StoredEvent(evening, (("org", "daily", 1),)))
        replay.feed(StoredEvent(evening + ten_minutes, (("org", "daily", 1),)))
        assert [row.would_deny_events for row in replay.rows()] == [would_deny]
