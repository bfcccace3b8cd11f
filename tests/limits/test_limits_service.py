"""Limit administration (`metering/limits/service.py`) on SQLite: limits stored all or
none, the product's own names kept apart, a priced limit never made a
kind that refuses its price, and what is missing named; on PostgreSQL, a
change of a limit judged after the decisions under way."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from lock_waits import wait_until_blocked, wait_until_waiting
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.errors import InvalidInput, ReservedLimit, UnknownLimit
from metering.limits.service import (
    delete_limit,
    get_limit,
    list_limits,
    load_limits,
    set_limits,
    set_product_limit,
)
from metering.reservations import Reservation


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url) as meter:
        yield meter


def test_limits_are_stored_read_and_deleted(meter: Meter) -> None:
    calls, api = Limit("calls", maximum=5, period="1h"), Limit("api", maximum=9, period="1d")
    assert set_limits(meter.database, [calls, api]) == [calls, api]
    assert get_limit(meter.database, "calls") == calls
    assert list_limits(meter.database) == [api, calls]
    delete_limit(meter.database, "calls")
    assert list_limits(meter.database) == [api]
    with pytest.raises(UnknownLimit):
        get_limit(meter.database, "calls")
    with pytest.raises(UnknownLimit):
        delete_limit(meter.database, "calls")


def test_limits_are_stored_all_or_none(meter: Meter) -> None:
    with pytest.raises(InvalidInput, match="expected a Limit, got dict"):
        set_limits(meter.database, [Limit("calls", maximum=5, period="1h"), {"name": "x"}])  # type: ignore[list-item]
    with pytest.raises(ReservedLimit):
        set_limits(
            meter.database,
            [Limit("calls", maximum=5, period="1h"), Limit("metering.x", maximum=1, period="1s")],
        )
    assert list_limits(meter.database) == []


def test_the_products_own_limits_are_set_only_as_such(meter: Meter) -> None:
    own = Limit("metering.api.requests", maximum=100, period="1m")
    with pytest.raises(ReservedLimit):
        delete_limit(meter.database, own.name)
    assert set_product_limit(meter.database, own) == own
    assert get_limit(meter.database, own.name) == own
    with pytest.raises(ReservedLimit):
        set_product_limit(meter.database, Limit("calls", maximum=5, period="1h"))
    with pytest.raises(ReservedLimit):
        delete_limit(meter.database, own.name)


def test_a_limit_with_a_price_in_force_does_not_become_a_gauge(meter: Meter) -> None:
    set_limits(meter.database, [Limit("disk", maximum=50, period="1d")])
    meter.set_price("disk", "0.01", "USD")
    gauge = Limit("disk", maximum=50, period="1d", aggregation="max")
    with pytest.raises(InvalidInput, match="has a price") as raised:
        set_limits(meter.database, [gauge])
    assert raised.value.field == "aggregation"
    meter.remove_price("disk", "USD")
    assert set_limits(meter.database, [gauge]) == [gauge]


CALENDAR = Limit("calls", maximum=100, period="1mo", window="calendar")


@pytest.mark.parametrize(
    ("changed", "field", "kind"),
    [
        (Limit("calls", 100, "1mo", window="calendar", distinct="user"), "distinct", "seat limit"),
        (Limit("calls", 100, algorithm="concurrent"), "algorithm", "concurrent limit"),
        (spend_limit("calls", "50.00", "EUR", "1mo"), "currency", "spend limit"),
        (
            Limit("calls", 100, "1mo", window="calendar", enforcement="shadow"),
            "enforcement",
            "shadow limit",
        ),
    ],
)
def test_a_priced_limit_does_not_become_a_kind_that_is_not_priced(
    meter: Meter, changed: Limit, field: str, kind: str
) -> None:
    set_limits(meter.database, [CALENDAR])
    meter.set_price("calls", "0.01", "USD")
    with pytest.raises(InvalidInput, match=rf"has a price in USD: .* {kind}") as raised:
        set_limits(meter.database, [changed])
    assert raised.value.field == field
    assert get_limit(meter.database, "calls") == CALENDAR
    meter.remove_price("calls", "USD")
    assert set_limits(meter.database, [changed]) == [changed]


def test_a_flat_fee_is_not_charged_again_by_a_limit_made_a_token_bucket(meter: Meter) -> None:
    # A flat fee is charged once a window. A bucket has no window: made one,
    # its next charge would pay the month's fee a second time.
    set_limits(meter.database, [CALENDAR, spend_limit("spend", "50.00", "USD", "1mo")])
    meter.set_price(
        "calls", None, "USD", model="graduated", tiers=["10:0.01", "inf:0.005"], flat_fee="20"
    )
    first = meter.consume("s1", "calls", 3)
    assert first.charges[1].used == 2003  # the fee and three units
    bucket = Limit("calls", maximum=100, period="1h", algorithm="token_bucket")
    with pytest.raises(InvalidInput, match=r"has a price in USD: .* token bucket") as raised:
        set_limits(meter.database, [bucket])
    assert raised.value.field == "algorithm"
    assert meter.consume("s1", "calls", 3).charges[1].used == 2006  # no second fee
    # A price per unit prices a bucket's charges as they come: it may become one.
    meter.set_price("calls", "0.01", "USD")
    assert set_limits(meter.database, [bucket]) == [bucket]


def test_a_price_set_for_later_is_a_price_of_the_limit(meter: Meter) -> None:
    clock = FrozenClock(datetime(2026, 3, 2, tzinfo=UTC))
    with Meter(meter.url, clock=clock) as timed:
        set_limits(timed.database, [CALENDAR])
        timed.set_price("calls", "0.01", "USD", effective_from=clock() + timedelta(days=3))
        gauge = Limit("calls", 100, "1mo", window="calendar", aggregation="max")
        with pytest.raises(InvalidInput, match="has a price in USD"):
            set_limits(timed.database, [gauge])
        timed.remove_price("calls", "USD", effective_from=clock() + timedelta(days=5))
        with pytest.raises(InvalidInput, match="has a price in USD"):
            set_limits(timed.database, [gauge])
        clock.advance(timedelta(days=6))  # priced from day 3 to day 5: no price now or later
        assert set_limits(timed.database, [gauge]) == [gauge]


@pytest.mark.parametrize(
    ("changed", "field", "kind"),
    [
        (Limit("calls", 100, "1mo", window="calendar", aggregation="max"), "aggregation", "gauge"),
        (Limit("calls", 100, "1mo", window="calendar", distinct="user"), "distinct", "seat limit"),
    ],
)
def test_a_limit_with_held_reservations_is_not_made_a_kind_that_holds_nothing(
    meter: Meter, changed: Limit, field: str, kind: str
) -> None:
    # A cancel gives a hold's cost back to its counter: a gauge's level or a
    # seat count would lose units it never had (a level of 50 read as 20).
    set_limits(meter.database, [CALENDAR, Limit("other", 100, "1mo", window="calendar")])
    held = meter.reserve("s1", "calls", 30)
    meter.reserve("s1", "other", 5)
    with pytest.raises(InvalidInput, match=rf"held reservations: .* {kind}$") as raised:
        set_limits(meter.database, [changed])
    assert raised.value.field == field
    assert get_limit(meter.database, "calls") == CALENDAR
    meter.cancel_reservation(held.id)
    assert set_limits(meter.database, [changed]) == [changed]


GAUGE = Limit("calls", 100, "1mo", window="calendar", aggregation="max")


def _made_a_gauge_meanwhile(
    pg_url: str, meter: Meter, lock: str, first: Callable[[], object]
) -> list[InvalidInput]:
    """``first`` runs while another transaction holds what ``lock`` locks,
    and waits for it; then the limit is redefined as `GAUGE` (waiting, or
    not); then the lock goes. What the redefinition raised."""
    outside = create_engine(pg_url, poolclass=NullPool)  # (not the meter's few connections)
    refused: list[InvalidInput] = []

    def change() -> None:
        try:
            set_limits(meter.database, [GAUGE])
        except InvalidInput as exc:
            refused.append(exc)

    blocker = outside.raw_connection()
    try:
        cursor = blocker.cursor()
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
        cursor.execute(lock)
        work = [threading.Thread(target=first), threading.Thread(target=change)]
        with outside.connect() as watch:
            work[0].start()
            wait_until_blocked(watch, pid, "the first")
            work[1].start()
            wait_until_waiting(watch, 2, "the first and the change", thread=work[1])
        blocker.commit()
        for thread in work:
            thread.join()
    finally:
        blocker.close()
        outside.dispose()
    return refused


def test_a_limit_is_made_a_gauge_only_after_the_reservations_being_decided(
    pg_url: str,
) -> None:
    # A reservation read the limits' version and waits for its counter when
    # the limit is redefined as a gauge: the change waits for it, finds its
    # hold and is refused, rather than leave a hold on a gauge.
    with Meter(pg_url, group_commit=False) as meter:
        set_limits(meter.database, [CALENDAR])
        meter.reserve("s1", "calls", 1).cancel()  # makes the counter, nothing used
        held: list[Reservation] = []
        counter = "SELECT used FROM counters WHERE limit_name = 'calls' FOR UPDATE"
        refused = _made_a_gauge_meanwhile(
            pg_url, meter, counter, lambda: held.append(meter.reserve("s1", "calls", 4))
        )
        assert held[0].allowed
        assert [str(exc) for exc in refused] == [
            "aggregation: 'calls' has held reservations: commit or cancel them before making "
            "the limit a gauge"
        ]
        assert get_limit(meter.database, "calls") == CALENDAR
        held[0].cancel()
        assert set_limits(meter.database, [GAUGE]) == [GAUGE]


def test_a_limit_priced_meanwhile_is_not_made_a_gauge(pg_url: str) -> None:
    # A price is being set (its check done, its write waiting for the
    # limits' version row) when the limit is redefined as a gauge: the
    # change waits for the price, finds it and is refused.
    with Meter(pg_url, group_commit=False) as meter:
        set_limits(meter.database, [CALENDAR])
        version = "UPDATE limits_version SET version = version WHERE id = 1"
        refused = _made_a_gauge_meanwhile(
            pg_url, meter, version, lambda: meter.set_price("calls", "0.01", "USD")
        )
        assert [exc.field for exc in refused] == ["aggregation"]
        assert get_limit(meter.database, "calls") == CALENDAR
        assert meter.prices("calls")


def test_the_same_definition_again_waits_for_no_decision(pg_url: str) -> None:
    # A transaction that read the limits' version stays open (a decision
    # under way): a file of limits loaded again unchanged goes through.
    with Meter(pg_url, group_commit=False) as meter:
        set_limits(meter.database, [CALENDAR])
        reader = meter.sql_engine.raw_connection()
        try:
            reader.cursor().execute("SELECT version FROM limits_version")
            assert set_limits(meter.database, [CALENDAR]) == [CALENDAR]
        finally:
            reader.rollback()
            reader.close()


def test_a_limit_with_usage_in_a_window_not_over_keeps_what_it_counts_in() -> None:
    # Made a spend limit, its counter's 3 units would be read as 3 cents of
    # the cap; a spend limit made plain would read cents as units; a sum
    # made a gauge would read its sum as a peak.
    clock = FrozenClock(datetime(2026, 3, 2, tzinfo=UTC))
    with Meter("sqlite://", clock=clock) as meter:
        set_limits(meter.database, [CALENDAR, spend_limit("spend", "50.00", "USD", "1mo")])
        meter.consume("org", "calls", 3)
        meter.set_price("calls", "0.01", "USD")
        meter.consume("org", "calls", 2)  # 2 cents of spend
        meter.remove_price("calls", "USD")
        changes = [
            spend_limit("calls", "50.00", "USD", "1mo"),
            Limit("spend", 5000, "1mo"),
            spend_limit("spend", "50.00", "EUR", "1mo"),
            Limit("calls", 100, "1mo", window="calendar", aggregation="max"),
        ]
        was = ["units", "USD", "USD", "units"]
        now = ["USD", "units", "EUR", "peak levels"]
        fields = ["currency"] * 3 + ["aggregation"]
        for changed, before, after, field in zip(changes, was, now, fields, strict=True):
            with pytest.raises(InvalidInput, match=f"counted in {before} .* read in {after}") as e:
                set_limits(meter.database, [changed])
            assert e.value.field == field
        assert get_limit(meter.database, "calls") == CALENDAR
        raised_cap = spend_limit("spend", "80.00", "USD", "1mo")  # the same currency: kept
        assert set_limits(meter.database, [raised_cap]) == [raised_cap]
        clock.advance(timedelta(days=31))  # both windows over
        assert set_limits(meter.database, changes[:2]) == changes[:2]
        assert set_limits(meter.database, changes[3:]) == changes[3:]


def test_a_file_of_limits_is_stored(meter: Meter, tmp_path: Path) -> None:
    path = tmp_path / "limits.toml"
    path.write_text('[[limits]]\nname = "calls"\nmaximum = 5\nperiod = "1h"\n')
    assert load_limits(meter.database, path) == [Limit("calls", maximum=5, period="1h")]
    assert list_limits(meter.database) == [Limit("calls", maximum=5, period="1h")]
