"""`metering.domain.licenses`: what is held, what fits, when a denial may retry,
the TTL's bounds and the ``limit.denied`` document; plain values, no database."""

from __future__ import annotations

import math

import pytest

from metering.domain.licenses import (
    MAX_TTL_SECONDS,
    consumed_concurrent,
    denied_document,
    fits,
    held_units,
    retry_at_us,
    validate_ttl,
)
from metering.errors import InvalidInput, WrongAlgorithm

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


def test_the_ttl_is_above_zero_and_at_most_a_week() -> None:
    assert validate_ttl(900) == 900 * S
    assert validate_ttl(0.5) == S // 2
    assert validate_ttl(1e-9) == 1  # never zero: it would expire as it is taken
    assert validate_ttl(MAX_TTL_SECONDS) == round(MAX_TTL_SECONDS * S)
    for bad in (0, -1, math.nan, math.inf, MAX_TTL_SECONDS + 1, True, "15m", None):
        with pytest.raises(InvalidInput, match="ttl_seconds"):
            validate_ttl(bad)


def test_the_denied_document_has_the_algorithm_and_no_window() -> None:
    document = denied_document("org-1", "cad", 2, 2, 60 * S, 0)
    assert document["type"] == "limit.denied"
    assert document["timestamp"] == "1970-01-01T00:00:00Z"
    data = document["data"]
    assert (data["algorithm"], data["subject"], data["limit"]) == ("concurrent", "org-1", "cad")
    assert (data["maximum"], data["used"], data["event_id"]) == (2, 2, None)
    assert (data["window_start"], data["window_end"]) == (None, None)
    assert data["retry_at"] == data["resets_at"] == "1970-01-01T00:01:00Z"
    assert denied_document("o", "cad", 1, 0, None, 0)["data"]["retry_at"] is None


def test_consuming_a_concurrent_limit_says_what_to_do() -> None:
    error = consumed_concurrent("cad")
    assert isinstance(error, WrongAlgorithm) and isinstance(error, InvalidInput)
    assert (error.field, error.limit, error.algorithm) == ("limit", "cad", "concurrent")
    assert str(error) == "limit: 'cad' is concurrent: check a license out (metering checkout)"
