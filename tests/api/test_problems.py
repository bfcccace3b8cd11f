"""Problem details (`api/problems.py`): each library error becomes one problem
type, status and field list at the one edge, and a body carries the type,
title, status and detail (RFC 9457)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering.api.problems import TYPE_PREFIX, TYPES, ApiProblem, problem_body, responses, translate
from metering.errors import (
    BrokerUnavailable,
    CheckoutReleased,
    ConfigurationError,
    CorrectionRefused,
    DatabaseUnavailable,
    EventConflict,
    InputRefused,
    InvalidInput,
    InvalidLimit,
    MeteringError,
    ReservationExpired,
    ReservedLimit,
    SchemaOutdated,
    UnknownApiKey,
    UnknownLimit,
    UnknownReservation,
)


@pytest.mark.parametrize(
    ("error", "slug", "status"),
    [
        (InvalidLimit("period", "bad"), "invalid-input", 400),
        (UnknownLimit("calls"), "unknown-limit", 422),
        (EventConflict("e1"), "conflict", 409),
        (UnknownReservation("r1"), "not-found", 404),
        (UnknownApiKey("mk_1"), "not-found", 404),
        (ReservationExpired("r1"), "reservation-settled", 409),
        (
            CheckoutReleased("c1", "checkin", datetime(2026, 1, 1, tzinfo=UTC)),
            "checkout-released",
            409,
        ),
        (ReservedLimit("metering.x"), "reserved-limit", 409),
        (CorrectionRefused("e1", "nothing consumed"), "correction-refused", 409),
        (DatabaseUnavailable("down"), "database-unavailable", 503),
        (SchemaOutdated("old"), "database-unavailable", 503),
        (InputRefused("too big"), "input-refused", 422),
        (ConfigurationError("bad key"), "configuration-error", 500),
        (MeteringError("something else"), "internal-error", 500),
    ],
)
def test_each_error_is_one_problem_type(error: MeteringError, slug: str, status: int) -> None:
    found, _, _, _ = translate(error)
    assert found == slug
    assert TYPES[slug][0] == status


def test_what_a_problem_says_of_each_error() -> None:
    assert translate(InvalidInput("cost", "must be positive")) == (
        "invalid-input",
        "cost: must be positive",
        [("cost", "must be positive")],
        {},
    )
    assert translate(EventConflict("e1"))[3] == {"event_ids": ["e1"]}
    outage = BrokerUnavailable("broker down", ["a", "b"])
    assert translate(outage)[1::2] == ("broker down", {"kept": ["a", "b"]})
    assert translate(CorrectionRefused("e1", "nothing consumed"))[2] == [
        ("event_id", "nothing consumed")
    ]
    hidden = translate(MeteringError("secret detail"))
    assert hidden[1] == "the server could not complete the request"


def test_a_body_is_the_problem_with_its_field_errors_and_members() -> None:
    body = problem_body(
        "conflict", "event 'e1' ...", [("event_id", "reused")], event_ids=("e1",), none=None
    )
    status, title = TYPES["conflict"]
    assert body == {
        "type": TYPE_PREFIX + "conflict",
        "title": title,
        "status": status,
        "detail": "event 'e1' ...",
        "errors": [{"field": "event_id", "message": "reused"}],
        "event_ids": ["e1"],
    }
    assert "errors" not in problem_body("not-found", "no reservation 'r1'")


def test_a_routes_problem_has_its_types_status() -> None:
    problem = ApiProblem("not-found", "no such thing")
    assert (problem.status, str(problem)) == (404, "no such thing")
    documented = responses(404, 409)
    assert set(documented) == {404, 409}
    assert TYPES["not-found"][1] in documented[404]["description"]
    schema = documented[409]["content"]["application/problem+json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/Problem"}
