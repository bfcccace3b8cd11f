"""`metering.domain.licenses`: what is held, what fits, when a denial may retry,
the TTL's bounds and the ``limit.denied`` document; plain values, no database."""

from __future__ import annotations

import math

import pytest

from metering.domain.licenses import (
    DEFAULT_TTL_SECONDS,
    MAX_TTL_SECONDS,
    CheckoutState,
    ReleasedBy,
    consumed_concurrent,
    denied_document,
    fits,
    held_units,
    retry_at_us,
    validate_ttl,
)
from metering.domain.limits import Limit, Period
from metering.domain.rules import Rule
from metering.errors import InvalidInput, InvalidLimit, WrongAlgorithm

S = 1_000_000


def test_a_checkout_stops_counting_at_its_expiry_instant() -> None:
    held = [(1, 10 * S), (2, 20 * S)]
    assert held_units(held, 0) == 3
    assert held_units(held, 10 * S - 1) == 3
    assert held_units(held, 10 * S) == 2  # exclusive: gone at its instant
    assert held_units(held, 20 * S) == 0
    assert held_units([], 0) == 0


def test_fits_up_to_the_maximum_inclusive() -> None:
    assert fits(1, 1, 2) and fits(0, 2, 2)
    assert not fits(2, 1, 2) and not fits(1, 2, 2)


def test_retry_at_is_when_enough_checkouts_will_have_expired() -> None:
    held = [(1, 30 * S), (1, 10 * S), (2, 20 * S)]  # 4 held, maximum 4
    assert retry_at_us(held, 1, 4, 0) == 10 * S  # the first expiry frees one
    assert retry_at_us(held, 2, 4, 0) == 20 * S  # 1 then 2 more: 3 free at 20 s
    assert retry_at_us(held, 4, 4, 0) == 30 * S  # everything must go
    assert retry_at_us(held, 5, 4, 0) is None  # never: above the maximum
    assert retry_at_us([(1, 5 * S), *held], 1, 4, 6 * S) == 10 * S  # expired ones are gone
    assert retry_at_us([(1, 5 * S), (1, 9 * S)], 1, 1, 5 * S) == 9 * S  # gone at its instant
    assert retry_at_us([(1, 10 * S)], 1, 1, 0) == 10 * S
    assert retry_at_us([(1, 10 * S)], 0, 1, 0) == 0  # it fits now (never asked: denied only)


def test_the_names_and_defaults() -> None:
    assert DEFAULT_TTL_SECONDS == 900 and MAX_TTL_SECONDS == 7 * 86_400
    assert [str(s) for s in CheckoutState] == ["held", "released"]
    assert [str(r) for r in ReleasedBy] == ["checkin", "expiry"]


def test_the_ttl_is_above_zero_and_at_most_a_week() -> None:
    assert validate_ttl(900) == 900 * S
    assert validate_ttl(0.5) == S // 2
    assert validate_ttl(1e-9) == 1  # never zero: it would expire as it is taken
    assert validate_ttl(MAX_TTL_SECONDS) == round(MAX_TTL_SECONDS * S)
    for bad in (0, -1, math.nan, math.inf, MAX_TTL_SECONDS + 1):
        with pytest.raises(InvalidInput) as caught:
            validate_ttl(bad)
        assert str(caught.value) == "ttl_seconds: must be above 0 and at most 604800"
    for bad in (True, "15m", None):
        with pytest.raises(InvalidInput) as caught:
            validate_ttl(bad)
        assert str(caught.value) == f"ttl_seconds: must be a number of seconds, got {bad!r}"


def test_the_denied_document_has_the_algorithm_and_no_window() -> None:
    document = denied_document("org-1", "cad", 2, 1, 60 * S, S)
    assert document == {
        "type": "limit.denied",
        "timestamp": "1970-01-01T00:00:01Z",
        "data": {
            "subject": "org-1",
            "limit": "cad",
            "algorithm": "concurrent",
            "maximum": 2,
            "used": 1,
            "threshold": None,
            "threshold_units": None,
            "window_start": None,
            "window_end": None,
            "resets_at": "1970-01-01T00:01:00Z",
            "retry_at": "1970-01-01T00:01:00Z",
            "event_id": None,
        },
    }
    assert denied_document("o", "cad", 1, 0, None, 0)["data"]["retry_at"] is None


def test_consuming_a_concurrent_limit_says_what_to_do() -> None:
    error = consumed_concurrent("cad")
    assert isinstance(error, WrongAlgorithm) and isinstance(error, InvalidInput)
    assert (error.field, error.limit, error.algorithm) == ("limit", "cad", "concurrent")
    assert str(error) == "limit: 'cad' is concurrent: check a license out (metering checkout)"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"period": "1h"},
            "period: a concurrent limit has no period: licenses are held, not spent",
        ),
        ({"window": "calendar"}, "window: a concurrent limit has no windows"),
        (
            {"enforcement": "soft"},
            "enforcement: a concurrent limit is hard: never more held than its maximum",
        ),
        (
            {"enforcement": "shadow"},
            "enforcement: a concurrent limit is hard: never more held than its maximum",
        ),
        (
            {"thresholds": (80,)},
            "thresholds: a concurrent limit has no thresholds (they fire per window)",
        ),
        (
            {"thresholds_units": (1,)},
            "thresholds: a concurrent limit has no thresholds (they fire per window)",
        ),
        ({"dimensions": ("user",)}, "dimensions: a concurrent limit records no usage to roll up"),
    ],
)
def test_a_concurrent_limit_refuses_what_belongs_to_a_window(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidLimit) as caught:
        Limit("cad", maximum=2, algorithm="concurrent", **values)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_a_concurrent_limit_has_no_period_and_a_windowed_one_needs_one() -> None:
    for period in ("", None):
        limit = Limit("cad", 2, period, algorithm="concurrent")  # type: ignore[arg-type]
        assert (limit.period, limit.parsed_period, limit.period_seconds) == ("", Period(), 0)
    assert Limit("cad", 2, algorithm="concurrent").to_dict()["period"] == ""
    for period in ("", None):
        with pytest.raises(InvalidLimit) as caught:
            Limit("calls", 2, period)  # type: ignore[arg-type]
        assert str(caught.value) == "period: is required (only a concurrent limit has none)"
    with pytest.raises(InvalidLimit) as caught:
        Limit.from_dict({"name": "calls", "maximum": 2})
    assert str(caught.value) == "period: is required"
    concurrent = Limit.from_dict({"name": "cad", "maximum": 2, "algorithm": "concurrent"})
    assert concurrent == Limit("cad", 2, algorithm="concurrent")
    assert Limit.from_dict(concurrent.to_dict()) == concurrent
    with pytest.raises(InvalidLimit) as caught:
        Limit.from_dict({"maximum": 2, "algorithm": "concurrent"})
    assert str(caught.value) == "name: is required"
    assert Rule.of(concurrent).concurrent and not Rule.of(Limit("calls", 2, "1h")).concurrent
