"""The exceptions `metering` raises (`metering/errors.py`): each is a
`MeteringError`, carries what a caller reacts to, and says it in one line."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pytest

from metering import errors
from metering.errors import (
    BrokerUnavailable,
    InvalidInput,
    InvalidLimit,
    MeteringError,
    OccurredAtOutOfRange,
    PeriodPruned,
    ReservationExpired,
    ReservationSettled,
    ReservedLimit,
    UnknownLimit,
    WrongAlgorithm,
)


def test_every_exception_is_a_metering_error() -> None:
    classes = [
        value
        for value in vars(errors).values()
        if inspect.isclass(value)
        and issubclass(value, Exception)
        and value.__module__ == errors.__name__
    ]
    assert len(classes) > 20
    assert all(issubclass(value, MeteringError) for value in classes)


def test_bad_input_names_its_field_and_is_a_value_error() -> None:
    error = InvalidInput("cost", "must be positive")
    assert (str(error), error.field, error.message) == (
        "cost: must be positive",
        "cost",
        "must be positive",
    )
    assert isinstance(error, ValueError)
    assert isinstance(InvalidLimit("period", "x"), InvalidInput)
    late = OccurredAtOutOfRange(datetime(2026, 1, 1, tzinfo=UTC), "too late")
    assert (late.field, str(late)) == ("occurred_at", "occurred_at: too late")
    wrong = WrongAlgorithm("seats", "concurrent", "check it out instead")
    assert str(wrong) == "limit: 'seats' is concurrent: check it out instead"


def test_a_pruned_period_says_from_when_results_are_kept() -> None:
    since, kept = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)
    error = PeriodPruned(since, kept)
    assert (error.field, error.since, error.kept_from) == ("since", since, kept)
    assert "results are kept from 2026-03-01T00:00:00+00:00 on" in str(error)


def test_lookups_that_find_nothing_are_lookup_errors() -> None:
    unknown = UnknownLimit("calls")
    assert isinstance(unknown, LookupError) and unknown.limit == "calls"
    assert str(unknown) == "unknown limit 'calls': define it with `metering limits set`"
    reserved = ReservedLimit("metering.x", "delete")
    assert str(reserved).endswith("you cannot delete it") and reserved.limit == "metering.x"


def test_an_expired_reservation_is_a_settled_one_committed_in_full() -> None:
    settled = ReservationSettled("r1", "cancelled", "commit")
    assert str(settled) == "cannot commit reservation 'r1': it is cancelled"
    expired = ReservationExpired("r2")
    assert isinstance(expired, ReservationSettled)
    assert (expired.reservation_id, expired.state) == ("r2", "committed")
    assert str(expired) == (
        "cannot cancel reservation 'r2': its time to live had passed, so it is committed in full"
    )


@pytest.mark.parametrize(
    ("kept", "event_id", "accepted", "message"),
    [
        ((), None, True, "down"),
        ((), "e9", False, "down; event 'e9' was not accepted"),
        (("a", "b"), "b", True, "down; 2 kept, sent once the broker is back: 'a', 'b'"),
        (
            ("a", "b", "c", "d", "e"),
            None,
            True,
            "down; 5 kept, sent once the broker is back: 'a', 'b', 'c' and 2 more",
        ),
    ],
)
def test_a_broker_outage_names_what_the_producer_keeps(
    kept: tuple[str, ...], event_id: str | None, accepted: bool, message: str
) -> None:
    error = BrokerUnavailable("down", kept, event_id=event_id, accepted=accepted)
    assert str(error) == message
    assert (error.kept, error.pending, error.accepted) == (kept, len(kept), accepted)
