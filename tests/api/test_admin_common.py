"""What the admin routes share (`metering/api/admin_common.py`), unit by unit:
a body read by hand (application/json or 415, strict JSON, one object of
known fields, optional when asked), times and the library's `InvalidInput`
as 400s naming the request's field, library calls in a thread, problems with
members of their own, and request schemas written in place."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel
from starlette.requests import Request

from metering.api.admin_common import (
    SHOWN_FIELD_CHARS,
    fields_named,
    inline_schema,
    json_body,
    listed,
    moment,
    problem_schema,
    problem_with,
    read_object,
    threaded,
)
from metering.api.problems import PROBLEM_JSON, ApiProblem
from metering.errors import InvalidInput

FIELDS = frozenset({"subject", "limit"})


def request(body: bytes, content_type: str | None = "application/json") -> Request:
    headers = [(b"content-type", content_type.encode())] if content_type else []
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    return Request(scope, receive)


def read(body: bytes, content_type: str | None = "application/json", **options: Any) -> Any:
    return asyncio.run(read_object(request(body, content_type), FIELDS, **options))


def refused(body: bytes, content_type: str | None = "application/json") -> ApiProblem:
    with pytest.raises(ApiProblem) as raised:
        read(body, content_type)
    return raised.value


def test_a_body_is_one_json_object_of_known_fields() -> None:
    assert read(b'{"subject": "a"}', "application/json; charset=utf-8") == {"subject": "a"}
    assert read(b"  ", optional=True) == {}
    assert read(b"", None, optional=True) == {}
    assert refused(b'{"subject": "a"}', None).status == 415
    assert refused(b'{"subject": "a"}', "text/plain").status == 415
    for body in (b"{nope", b"", b"[]", b'{"subject": NaN}'):
        problem = refused(body)
        assert (problem.status, problem.errors[0][0]) == (400, "body"), body
    long = "x" * 200
    unknown = refused(json.dumps({"subject": "a", long: 1}).encode())
    assert unknown.errors == [(long[:SHOWN_FIELD_CHARS], "is not a field of this object")]


def test_a_time_is_rfc_3339_and_naive_is_utc() -> None:
    assert moment(None, "at") is None
    assert moment("2026-11-22T09:30:00Z", "at") == datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
    assert moment("2026-11-22T09:30:00", "at") == datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
    for value in (1_795_000_000, "yesterday"):
        with pytest.raises(ApiProblem) as raised:
            moment(value, "effective_from")
        assert raised.value.errors[0][0] == "effective_from"


def test_the_librarys_invalid_input_names_the_requests_field() -> None:
    with pytest.raises(ApiProblem) as raised, fields_named({"event_id": "reservation_id"}):
        raise InvalidInput("event_id", "has a space")
    assert raised.value.errors == [("reservation_id", "has a space")]
    assert raised.value.detail == "reservation_id: has a space"
    with pytest.raises(ApiProblem) as other, fields_named():
        raise InvalidInput("cost", "must be positive")
    assert other.value.errors == [("cost", "must be positive")]


def test_library_calls_run_in_a_thread_and_listings_are_their_dicts() -> None:
    class Item:
        def __init__(self, n: int) -> None:
            self.n = n

        def to_dict(self) -> dict[str, int]:
            return {"n": self.n}

    def fails(name: str) -> None:
        raise InvalidInput("name", f"{name!r} is no limit")

    assert asyncio.run(threaded(lambda a, *, b: a + b, 1, b=2)) == 3
    with pytest.raises(ApiProblem) as raised:
        asyncio.run(threaded(fails, "x", names={"name": "limit"}))
    assert raised.value.errors[0][0] == "limit"
    answer = asyncio.run(listed("items", lambda count: [Item(n) for n in range(count)], 2))
    assert json.loads(answer.body) == {"items": [{"n": 0}, {"n": 1}]}


def test_a_problem_carries_members_of_its_own_and_documents_them() -> None:
    answer = problem_with("conflict", "already committed", state="committed")
    assert (answer.status_code, answer.media_type) == (409, PROBLEM_JSON)
    body = json.loads(answer.body)
    assert (body["status"], body["detail"], body["state"]) == (
        409,
        "already committed",
        "committed",
    )
    documented = problem_schema("Settled", state={"type": "string"})
    [standard, own] = documented["content"][PROBLEM_JSON]["schema"]["allOf"]
    assert standard == {"$ref": "#/components/schemas/Problem"}
    assert (own["properties"], own["required"]) == ({"state": {"type": "string"}}, ["state"])


class Charge(BaseModel):
    subject: str
    cost: int = 1


class Single(BaseModel):
    limit: str
    charge: Charge


class Stacked(BaseModel):
    charges: list[Charge]


def test_request_schemas_are_written_in_place() -> None:
    schema = inline_schema(Single)
    assert "$defs" not in json.dumps(schema) and "$ref" not in json.dumps(schema)
    assert schema["properties"]["charge"]["properties"]["subject"] == {
        "title": "Subject",
        "type": "string",
    }
    one = json_body(Single)["requestBody"]
    assert one["required"] is True
    assert one["content"]["application/json"]["schema"] == schema
    either = json_body(Single, Stacked, required=False)["requestBody"]
    assert either["required"] is False
    assert len(either["content"]["application/json"]["schema"]["anyOf"]) == 2
