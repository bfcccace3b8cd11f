"""Every validation error of the domain, word for word.

These messages are what a user reads: the CLI prints ``str(error)`` as its
one error line, the API raises it. Each names the field (``field: ...``),
and the offending value where there is one, as `bounds.shown` writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from metering.domain.events import (
    charges_of,
    check_event_time,
    validate_charges,
    validate_cost,
    validate_event_id,
    validate_metadata,
    validate_subject,
)
from metering.domain.instants import to_us
from metering.domain.limits import Limit, parse_period, validate_limit_name
from metering.errors import InvalidInput, InvalidLimit, OccurredAtOutOfRange

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
KNOWN = (
    "['aggregation', 'algorithm', 'breaker', 'breaker_floor', 'burst', 'currency', "
    "'dimensions', 'distinct', 'enforcement', 'forecast_lead', 'lateness', 'max_amount', "
    "'maximum', 'name', 'pacing', 'period', 'quarantine_max', 'thresholds', "
    "'thresholds_units', 'window']"
)

LIMIT_ERRORS: list[tuple[Callable[[], object], str]] = [
    (
        lambda: parse_period(5),  # type: ignore[arg-type]
        "period: expected a string like '2m' or '1mo', got 5",
    ),
    (
        lambda: parse_period("5 days"),
        "period: '5 days' is not a period; use a number and s, m, h, d, w, mo or y",
    ),
    (
        lambda: parse_period("x", field_name="lateness"),
        "lateness: 'x' is not a period; use a number and s, m, h, d, w, mo or y",
    ),
    (
        lambda: parse_period("0000000000009999999999999s"),
        "period: '0000000000009999999999999s' is longer than 10 years",
    ),
    (
        lambda: parse_period("1" + " " * 31 + "s"),
        "period: '1" + " " * 31 + "s' is longer than 32 characters",
    ),
    (
        # Twelve digits pass the digit check: the length check is the one that refuses it.
        lambda: parse_period("100000000000" + " " * 20 + "s"),
        "period: '100000000000" + " " * 20 + "s' is longer than 32 characters",
    ),
    (lambda: parse_period("0d"), "period: '0d' must be longer than zero"),
    (lambda: parse_period("11y"), "period: '11y' is longer than 10 years"),
    (lambda: parse_period("3654d"), "period: '3654d' is longer than 10 years"),
    (lambda: validate_limit_name("A"), "name: 'A' must be 1 to 64 of a-z 0-9 _ . : -"),
    (
        lambda: Limit("a", maximum=0, period="1d"),
        "maximum: must be between 1 and 1000000000000000, got 0",
    ),
    (lambda: Limit("a", maximum=1.5, period="1d"), "maximum: must be a whole number, got 1.5"),  # type: ignore[arg-type]
    (
        lambda: Limit("a", 1, "1d", algorithm="x"),  # type: ignore[arg-type]
        "algorithm: must be one of fixed_window, token_bucket, concurrent; got 'x'",
    ),
    (
        lambda: Limit("a", 1, "1mo", algorithm="token_bucket"),
        "period: a token bucket refills over seconds, not months",
    ),
    (
        lambda: Limit("a", 1, "1d", algorithm="token_bucket", enforcement="soft"),
        "enforcement: a token bucket is hard or shadow, never soft",
    ),
    (
        lambda: Limit("a", 10, "10s", algorithm="token_bucket", window="calendar"),
        "window: a token bucket has no windows; window calendar is for fixed_window",
    ),
    (
        lambda: Limit("a", 1, "1d", lateness="1mo"),
        "lateness: use seconds, minutes, hours or days",
    ),
    (
        lambda: Limit("a", 1, "1d", thresholds="80"),  # type: ignore[arg-type]
        "thresholds: must be a list of percentages",
    ),
    (
        lambda: Limit("a", 1, "1d", thresholds=(0,)),
        "thresholds: must be between 1 and 1000, got 0",
    ),
    (
        lambda: Limit.from_dict({"name": "a", "maximum": 1, "period": "1d", "color": "red"}),
        f"color: unknown field; expected some of {KNOWN}",
    ),
    (lambda: Limit.from_dict({"name": "a", "period": "1d"}), "maximum: is required"),
    (
        lambda: Limit.from_dict({"name": "a", "maximum": 1, "period": "1d", "thresholds": 80}),
        "thresholds: must be a list of percentages, got 80",
    ),
]

INPUT_ERRORS: list[tuple[Callable[[], object], str]] = [
    (lambda: validate_subject(5), "subject: must be a string, got int"),
    (lambda: validate_subject(""), "subject: must be 1 to 200 characters"),
    (lambda: validate_subject(" a"), "subject: ' a' has control characters or edge spaces"),
    (lambda: validate_cost("1"), "cost: must be a whole number, got '1'"),
    (lambda: validate_cost(0), "cost: must be between 1 and 1000000000000, got 0"),
    (
        lambda: validate_event_id("a b"),
        "event_id: 'a b' must be 1 to 128 of A-Z a-z 0-9 and _ . : @ / + = -",
    ),
    (lambda: validate_charges("ab"), "charges: must be a list of (subject, limit, cost)"),
    (lambda: validate_charges([("a",)]), "charges: ('a',) is not (subject, limit[, cost])"),
    (lambda: validate_charges([]), "charges: an event has 1 to 32 charges"),
    (
        lambda: validate_charges([("a", "b"), ("a", "b", 2)]),
        "charges: each (subject, limit) may appear once per event",
    ),
    (lambda: validate_metadata([1]), "metadata: must be a mapping of JSON values"),
    (
        lambda: validate_metadata({"a": "\ud800"}),
        "metadata: is not valid Unicode text: surrogates not allowed",
    ),
    (
        lambda: validate_metadata({"a": "x" * 9000}),
        "metadata: is larger than 8192 bytes as JSON",
    ),
    (
        lambda: charges_of(None, "calls", 1, None),
        "charges: give subject and limit, or charges=[...]",
    ),
    (
        lambda: charges_of("org", None, 1, []),
        "charges: give subject and limit, or charges=[...], not both",
    ),
    (
        lambda: check_event_time(NOW + timedelta(minutes=6), to_us(NOW), 86_400),
        "occurred_at: is more than 5 minutes in the future",
    ),
    (
        lambda: check_event_time(NOW - timedelta(days=2), to_us(NOW), 86_400),
        "occurred_at: is older than the allowed lateness of 86400 s",
    ),
]


@pytest.mark.parametrize(("call", "message"), LIMIT_ERRORS, ids=[m for _, m in LIMIT_ERRORS])
def test_a_bad_limit_says_which_field_and_why(call: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidLimit) as raised:
        call()
    assert str(raised.value) == message
    assert f"{raised.value.field}: {raised.value.message}" == message


@pytest.mark.parametrize(("call", "message"), INPUT_ERRORS, ids=[m for _, m in INPUT_ERRORS])
def test_bad_input_says_which_field_and_why(call: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        call()
    assert str(raised.value) == message
    assert f"{raised.value.field}: {raised.value.message}" == message


def test_an_event_from_the_future_keeps_its_instant_on_the_error() -> None:
    late = NOW + timedelta(minutes=6)
    with pytest.raises(OccurredAtOutOfRange) as raised:
        check_event_time(late, to_us(NOW), 60)
    assert raised.value.occurred_at is late


def test_metadata_that_is_not_json_quotes_the_encoder() -> None:
    with pytest.raises(InvalidInput, match=r"^metadata: is not JSON-serialisable: Out of range"):
        validate_metadata({"a": float("nan")})
