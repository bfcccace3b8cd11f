"""`LimitStore` on SQLite and PostgreSQL: a limit row reads back as the `Limit`
written, whatever its features; every write bumps the limits' version."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from sqlalchemy import Connection, update

from metering import Meter
from metering.domain.limits import Limit, spend_limit
from metering.storage.limits import LimitStore
from metering.storage.tables import limits

T = TypeVar("T")
NOW_US = 1_800_000_000_000_000

LIMITS = [
    Limit("calls", maximum=100, period="1h", thresholds=(50, 80), thresholds_units=(90,)),
    Limit("api", maximum=10, period="10s", algorithm="token_bucket", enforcement="shadow"),
    Limit("seats", maximum=5, period="1mo", window="calendar", distinct="user"),
    Limit("disk", maximum=500, period="1d", aggregation="max"),
    Limit("routes", maximum=500, period="1d", dimensions=("region", "route")),
    Limit("paced", maximum=1_000, period="1d", pacing=True, burst="5%", lateness="1h"),
    spend_limit("spend", "50", "USD", "1mo", window="calendar", enforcement="soft"),
]


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url) as meter:
        yield meter


def _on(meter: Meter, work: Callable[[LimitStore], T]) -> T:
    return meter.database.run(lambda connection: work(LimitStore(connection)))


def _write_all(store: LimitStore) -> None:
    for limit in LIMITS:
        store.upsert_limit(limit, NOW_US)


def test_a_limit_reads_back_as_written(meter: Meter) -> None:
    _on(meter, _write_all)
    by_name = {limit.name: limit for limit in LIMITS}
    assert _on(meter, lambda store: store.load_limits(by_name)) == by_name
    assert _on(meter, lambda store: store.list_limits()) == sorted(
        LIMITS, key=lambda limit: limit.name
    )
    assert _on(meter, lambda store: store.limit_names()) == frozenset(by_name)


def test_loading_takes_only_the_names_asked_that_exist(meter: Meter) -> None:
    _on(meter, _write_all)
    loaded = _on(meter, lambda store: store.load_limits(["calls", "calls", "missing"]))
    assert list(loaded) == ["calls"]
    assert _on(meter, lambda store: store.load_limits([])) == {}


def test_a_write_replaces_the_row_of_its_name(meter: Meter) -> None:
    _on(meter, _write_all)
    smaller = Limit("calls", maximum=7, period="1d")
    _on(meter, lambda store: store.upsert_limit(smaller, NOW_US + 1))
    assert _on(meter, lambda store: store.load_limits(["calls"])) == {"calls": smaller}
    paced_off = Limit("paced", maximum=1_000, period="1d")
    _on(meter, lambda store: store.upsert_limit(paced_off, NOW_US + 1))
    assert _on(meter, lambda store: store.load_limits(["paced"]))["paced"].burst is None


def test_every_write_bumps_the_version(meter: Meter) -> None:
    before = _on(meter, lambda store: store.limits_version())
    _on(meter, lambda store: store.upsert_limit(LIMITS[0], NOW_US))
    assert _on(meter, lambda store: store.limits_version()) == before + 1
    assert _on(meter, lambda store: store.delete_limit("calls")) is True
    assert _on(meter, lambda store: store.limits_version()) == before + 2
    assert _on(meter, lambda store: store.delete_limit("calls")) is False
    assert _on(meter, lambda store: store.limit_names()) == frozenset()


def test_a_bucket_stored_with_a_calendar_window_reads_as_the_bucket_it_is(meter: Meter) -> None:
    bucket = Limit("api", maximum=10, period="10s", algorithm="token_bucket")
    _on(meter, lambda store: store.upsert_limit(bucket, NOW_US))

    def calendar(connection: Connection) -> None:
        connection.execute(update(limits).where(limits.c.name == "api").values(window="calendar"))

    meter.database.run(calendar)
    assert _on(meter, lambda store: store.load_limits(["api"])) == {"api": bucket}


def _definitions(meter: Meter) -> list[tuple[str, int, int, str]]:
    history = _on(meter, lambda store: store.definition_history())
    return [
        (name, d.effective_from_us, d.maximum, d.enforcement)
        for name, found in history.items()
        for d in found
    ]


def _define(meter: Meter, limits: list[Limit], now_us: int) -> None:
    _on(meter, lambda store: store.record_definitions(limits, now_us))


def test_a_definition_is_recorded_only_when_its_maximum_or_enforcement_changes(
    meter: Meter,
) -> None:
    calls = LIMITS[0]
    _define(meter, [calls], NOW_US)
    _define(meter, [calls], NOW_US + 1)  # the same again: nothing
    _define(meter, [dataclasses.replace(calls, thresholds=(70,))], NOW_US + 2)  # nor this
    _define(meter, [dataclasses.replace(calls, maximum=200)], NOW_US + 3)
    _define(meter, [dataclasses.replace(calls, maximum=200, enforcement="soft")], NOW_US + 4)
    assert _definitions(meter) == [
        ("calls", NOW_US, 100, "hard"),
        ("calls", NOW_US + 3, 200, "hard"),
        ("calls", NOW_US + 4, 200, "soft"),
    ]


def test_a_change_at_the_same_instant_replaces_it_and_deletion_keeps_the_history(
    meter: Meter,
) -> None:
    calls = LIMITS[0]
    meter.set_limit(calls)
    _define(meter, [calls, dataclasses.replace(calls, maximum=300)], NOW_US)  # the last wins
    _define(meter, [dataclasses.replace(calls, maximum=400)], NOW_US)
    meter.delete_limit("calls")
    found = _definitions(meter)
    assert found[-1] == ("calls", NOW_US, 400, "hard")
    assert [d[2] for d in found] == [100, 400]
