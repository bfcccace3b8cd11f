"""Read-only answers for the HTTP API (`metering/usage/current.py`), on SQLite: the
stored results of decided ids, and a subject's usage now by limit."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import InvalidInput
from metering.usage.current import subject_usage
from metering.usage.results import stored_results

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(sqlite_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=3, period="1h", window="calendar"))
        meter.set_limit(Limit("api", maximum=2, period="10s", algorithm="token_bucket"))
        meter.set_limit(Limit("unused", maximum=1, period="1d"))
        yield meter


def test_stored_results_are_the_decided_ids_as_duplicates(meter: Meter) -> None:
    meter.consume("org", "calls", event_id="e1")
    found = stored_results(meter.database, ["e1", "e2"])
    assert list(found) == ["e1"]
    assert found["e1"].fingerprint == '[["org","calls",1]]'
    assert found["e1"].decision.duplicate and found["e1"].decision.outcome == "allowed"
    assert stored_results(meter.database, []) == {}
    with pytest.raises(InvalidInput):
        stored_results(meter.database, [""])


def test_a_subjects_usage_is_each_limit_it_used_or_was_denied(meter: Meter) -> None:
    meter.consume("org", "calls", cost=2)
    meter.consume("org", "calls", cost=2)  # denied
    meter.consume("org", "api", cost=2)
    meter.consume("other", "unused")
    api, calls = subject_usage(meter.database, "org")  # by name
    assert calls.limit.name == "calls"
    assert (calls.used, calls.remaining, calls.overage) == (2, 1, 0)
    assert calls.window_start == NOW and calls.resets_at == NOW + timedelta(hours=1)
    assert calls.retry_at is None
    assert api.limit.name == "api" and api.window_start is None
    assert (api.used, api.remaining) == (2, 0)
    assert api.retry_at == NOW + timedelta(seconds=5)  # one token back after 5 s


def test_a_subject_with_grants_left_shows_the_limit_unused(meter: Meter) -> None:
    meter.grant("org", "unused", 4)
    [unused] = subject_usage(meter.database, "org")
    assert (unused.limit.name, unused.used, unused.grants_left) == ("unused", 0, 4)


def test_a_subjects_own_maximum_is_the_one_shown(meter: Meter) -> None:
    meter.set_entitlement("org", "calls", 10)
    meter.consume("org", "calls")
    [calls] = subject_usage(meter.database, "org")
    assert (calls.limit.maximum, calls.remaining) == (10, 9)
    assert subject_usage(meter.database, "nobody") == []
    with pytest.raises(InvalidInput):
        subject_usage(meter.database, "")
