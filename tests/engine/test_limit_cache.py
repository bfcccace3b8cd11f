"""`LimitCache.traits`: whether a version's rules have a breaker or a forecast
lead, worked out once per version (per rules dict), not per batch."""

from __future__ import annotations

from metering import Limit
from metering.domain.rules import Rule
from metering.engine.limit_cache import LimitCache


def _rules(*limits: Limit) -> dict[str, Rule]:
    return {limit.name: Rule.of(limit, priced=False) for limit in limits}


def test_traits_follow_the_rules_asked_about() -> None:
    cache = LimitCache()
    plain = _rules(Limit("calls", maximum=5, period="1h", window="calendar"))
    guarded = _rules(Limit("calls", maximum=5, period="1h", breaker="10x"))
    forecast = _rules(Limit("calls", maximum=5, period="1h", forecast_lead="1h"))
    assert cache.traits(plain) == (False, False)
    assert cache.traits(guarded) == (True, False)
    assert cache.traits(forecast) == (False, True)
    assert cache.traits(forecast) == (False, True)  # remembered
    assert cache.traits(plain) == (False, False)  # another version's: worked out again
    assert cache.traits({}) == (False, False)
