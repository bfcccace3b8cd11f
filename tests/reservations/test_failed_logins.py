"""The conditional limit reservations exist for: failed logins per IP."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter

START = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
PASSWORDS = {"ada": "correct horse"}


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("failed_logins", maximum=30, period="1h"))
        yield m


def login(meter: Meter, ip: str, user: str, password: str) -> int:
    """A login handler: the HTTP status it would answer."""
    with meter.reserve(ip, "failed_logins") as attempt:
        if not attempt.allowed:
            return 429
        if PASSWORDS.get(user) == password:
            attempt.cancel()  # a valid login costs nothing
            return 200
        return 401  # leaving the block commits: the failure is counted


def test_thirty_failures_an_hour_while_valid_logins_all_pass(
    meter: Meter, clock: FrozenClock
) -> None:
    ip = "203.0.113.9"
    answers: list[int] = []
    failures: list[int] = []
    for n in range(1000):
        clock.advance(seconds=3)  # 1,000 logins in 50 minutes
        answers.append(login(meter, ip, "ada", "correct horse"))
        if n % 34 == 0 and len(failures) < 29:
            failures.append(login(meter, ip, "ada", "guess"))
    failures.append(login(meter, ip, "ada", "guess"))
    assert answers == [200] * 1000  # 29 failures in between did not block them
    assert failures == [401] * 30
    assert login(meter, ip, "ada", "guess") == 429  # the 31st failure
    [counter] = meter.counters(ip, "failed_logins")
    assert counter.used == 30 and counter.denied_count == 1
    # Exhausted, the IP is refused before any password is checked, valid or
    # not: an attacker cannot use the answers to go on guessing.
    assert login(meter, ip, "ada", "correct horse") == 429
    assert login(meter, "198.51.100.1", "ada", "guess") == 401  # other IPs unaffected
    assert len(meter.reservations(state="cancelled", count=2000)) == 1000
    assert len(meter.reservations(state="held")) == 0
