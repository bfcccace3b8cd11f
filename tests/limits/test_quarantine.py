"""Quarantines (`metering/limits/quarantine.py`) on SQLite: a release by name
refuses an unknown limit, a limit without a breaker and a subject not
quarantined, each a `metering.errors` error that changes nothing; a release
link's token is verified without changing anything, releases its quarantine
once, and a forged, malformed or expired one releases nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import InvalidLimit, NotQuarantined, UnknownLimit
from metering.limits.quarantine import release, release_by_token, verified_link
from metering.webhooks import Webhooks

START = datetime(2026, 11, 2, tzinfo=UTC)


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url, clock=FrozenClock(START)) as meter:
        meter.set_limit(
            Limit("api", maximum=100_000, period="1d", breaker="10x", breaker_floor=0.1)
        )
        meter.set_limit(Limit("plain", maximum=10, period="1d"))
        clock = meter.clock
        assert isinstance(clock, FrozenClock)
        for _ in range(62):
            meter.consume("org-1", "api", 60)
            clock.advance(seconds=1)
        yield meter


def _token(meter: Meter) -> str:
    [(_, _, payload)] = Webhooks(meter).messages("limit.quarantined")
    path = json.loads(payload)["data"]["release_path"]
    return parse_qs(urlsplit(path).query)["token"][0]


def test_a_release_by_name_says_what_is_wrong(meter: Meter) -> None:
    database = meter.database
    with pytest.raises(UnknownLimit):
        release(database, "org-1", "nope")
    with pytest.raises(InvalidLimit, match="no breaker"):
        release(database, "org-1", "plain")
    with pytest.raises(NotQuarantined):
        release(database, "org-2", "api")
    assert [q.subject for q in meter.quarantines()] == ["org-1"]


def test_a_link_releases_its_quarantine_once(meter: Meter) -> None:
    database, token = meter.database, _token(meter)
    for bad in ("", "v1.x.1.y", token[:-2] + "xx", token + "."):
        assert verified_link(database, bad) is None
        assert release_by_token(database, bad) is None
    found = verified_link(database, token)
    assert found is not None and (found.limit, found.subject) == ("api", "org-1")
    assert [q.subject for q in meter.quarantines()] == ["org-1"]
    assert release_by_token(database, token) == found
    assert meter.quarantines() == []
    assert verified_link(database, token) is None
    assert release_by_token(database, token) is None


def test_an_expired_link_releases_nothing(meter: Meter) -> None:
    token = _token(meter)
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    clock.advance(days=8)
    assert release_by_token(meter.database, token) is None
    assert [q.subject for q in meter.quarantines()] == ["org-1"]
