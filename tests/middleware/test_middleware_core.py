"""The middleware's core (`middleware/core.py`), with plain values: Retry-After
rounds up to at least a second, a policy checks its configuration, and a
key function that returns no string answers 503 (or passes, fail-open)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering import Limit, Meter
from metering.domain.decisions import ChargeDecision, Decision
from metering.errors import InvalidInput
from metering.middleware import (
    RequestInfo,
    Route,
)
from metering.middleware.core import Policy, RequestMetering, Step, retry_after_seconds

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


NOW_US = int(NOW.timestamp()) * 1_000_000


def request(
    client: str | None = "10.0.0.1", forwarded: str | None = None, user: object = None
) -> RequestInfo:
    headers = {"x-forwarded-for": forwarded} if forwarded is not None else {}
    return RequestInfo("GET", "/", headers, client, user)


def charge(allowed: bool, retry_at_us: int | None, resets_at_us: int) -> ChargeDecision:
    return ChargeDecision(
        "s",
        "l",
        1,
        allowed,
        "allowed" if allowed else "denied",
        0,
        0,
        1,
        0,
        None,
        resets_at_us,
        retry_at_us,
    )


def test_retry_after_rounds_up_and_is_at_least_one_second() -> None:
    def decision(*charges: ChargeDecision) -> Decision:
        return Decision("e", "denied", charges, NOW, NOW)

    assert retry_after_seconds(decision(charge(False, NOW_US + 1_500_000, 0)), NOW_US) == 2
    assert retry_after_seconds(decision(charge(False, NOW_US, 0)), NOW_US) == 1
    never = decision(charge(False, None, NOW_US + 60_000_000))  # cost above the maximum
    assert retry_after_seconds(never, NOW_US) == 60
    both = decision(charge(True, None, 0), charge(False, NOW_US + 9_000_000, 0))
    assert retry_after_seconds(both, NOW_US) == 9


def test_a_policy_checks_its_configuration(sqlite_url: str) -> None:
    with Meter(sqlite_url) as meter:
        with pytest.raises(InvalidInput):
            Policy(meter, "api", cost=0)
        with pytest.raises(InvalidInput):
            Policy(meter, "bad name!")
        with pytest.raises(InvalidInput):
            Policy(meter, "api", routes=[Route("/x", cost=-1)])
        with pytest.raises(InvalidInput):
            Policy("not a meter", "api")  # type: ignore[arg-type]


def test_a_key_function_returning_a_non_string_answers_503_or_passes_when_fail_open(
    sqlite_url: str,
) -> None:
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("api", maximum=5, period="1m"))
        numbered = Policy(meter, "api", key=lambda _: 42)  # type: ignore[arg-type,return-value]
        step = numbered.enter(request(), RequestMetering())
        assert step.response is not None and step.response.status == 503
        lenient = Policy(meter, "api", key=lambda _: 42, fail_open=True)  # type: ignore[arg-type,return-value]
        assert lenient.enter(request(), RequestMetering()) == Step()
