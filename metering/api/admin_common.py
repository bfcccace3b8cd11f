"""What the admin routes (reservations, limits, reports, webhooks) share.

Their JSON bodies are read by hand, like the events' (`metering.api.parsing`):
``application/json`` or 415, strict JSON or 400, one object whose fields are
all known (the fields of the body's model: `metering.api.models.body_fields`),
each field's value then checked by the library. Their request schemas are
the pydantic models declared in each route's module, inlined into the
operation (``openapi_extra``). A problem may carry members of its own
(a reservation's ``state``, the ``delivery_ids`` a replay did not find):
`problem_with` answers it and `problem_schema` documents it. Library calls
run in a worker thread (`threaded`, `listed`); the library's `InvalidInput`
becomes a 400 naming the request's field (`fields_named`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Final, TypeVar

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metering.api.parsing import decode_json
from metering.api.problems import PROBLEM_JSON, ApiProblem, problem_body
from metering.domain.instants import parse_instant
from metering.errors import InvalidInput

T = TypeVar("T")
# How much of an unknown field's name an error repeats.
SHOWN_FIELD_CHARS: Final = 60
# The library checks a limit's name as ``name``; in the requests it is ``limit``.
LIMIT_NAMES: Final = {"name": "limit"}


def bad_field(pointer: str, message: str) -> ApiProblem:
    """A 400 problem naming one field."""
    return ApiProblem("invalid-input", f"{pointer}: {message}", [(pointer, message)])


def invalid(exc: InvalidInput, names: Mapping[str, str] | None = None) -> ApiProblem:
    """A library `InvalidInput` as a 400 problem; ``names`` maps the library's
    field names to this request's (``event_id`` -> ``reservation_id``)."""
    pointer = (names or {}).get(exc.field, exc.field)
    return bad_field(pointer, exc.message)


@contextmanager
def fields_named(names: Mapping[str, str] | None = None) -> Iterator[None]:
    """The library's `InvalidInput` raised in the block as a 400 naming this
    request's field (`invalid`, with ``names``)."""
    try:
        yield
    except InvalidInput as exc:
        raise invalid(exc, names) from None


async def threaded(
    function: Callable[..., T], *args: Any, names: Mapping[str, str] | None = None, **kwargs: Any
) -> T:
    """A library call in a worker thread; its `InvalidInput` a 400 naming the
    field (`fields_named`)."""
    with fields_named(names):
        return await run_in_threadpool(lambda: function(*args, **kwargs))


async def listed(
    key: str,
    function: Callable[..., Iterable[Any]],
    *args: Any,
    names: Mapping[str, str] | None = None,
) -> Response:
    """``{key: [...]}``: what a library listing (`threaded`) finds, each as its ``to_dict()``."""
    found = await threaded(function, *args, names=names)
    return JSONResponse({key: [item.to_dict() for item in found]})


def moment(value: object, field_name: str) -> datetime | None:
    """An RFC 3339 time from a body or query (naive is UTC), or a 400 naming it."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_field(field_name, "must be an RFC 3339 date-time string")
    with fields_named():
        return parse_instant(value, field_name=field_name)


def _media(request: Request) -> str:
    return (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()


async def read_object(
    request: Request, fields: frozenset[str], *, optional: bool = False
) -> dict[str, Any]:
    """The request's JSON object, every key one of ``fields``.

    415 unless it is ``application/json``; 400 for a body that is not strict
    JSON (`decode_json`: no NaN, no runaway integer), not an object, or has a
    field not in ``fields``. With ``optional``, no body at all is ``{}``.
    """
    body = await request.body()
    if optional and not body.strip():
        return {}
    if _media(request) != "application/json":
        shown = repr(_media(request)) if _media(request) else "no content type"
        raise ApiProblem("unsupported-media-type", f"{shown}: send application/json")
    data = decode_json(body)
    if not isinstance(data, dict):
        raise bad_field("body", "must be a JSON object")
    for key in data:
        if key not in fields:
            raise bad_field(str(key)[:SHOWN_FIELD_CHARS], "is not a field of this object")
    return data


def problem_with(slug: str, detail: str, **members: Any) -> Response:
    """A problem with members of its own beside the standard ones."""
    body = problem_body(slug, detail)
    body.update(members)
    return JSONResponse(body, body["status"], media_type=PROBLEM_JSON)


def problem_schema(description: str, **members: dict[str, Any]) -> dict[str, Any]:
    """``responses=`` entry of a problem with required ``members`` (JSON schemas)."""
    return {
        "description": description,
        "content": {
            PROBLEM_JSON: {
                "schema": {
                    "allOf": [
                        {"$ref": "#/components/schemas/Problem"},
                        {"type": "object", "properties": members, "required": list(members)},
                    ]
                }
            }
        },
    }


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of ``model`` with its nested models written in place: a
    request body's schema needs no entry in the document's components."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            reference = node.get("$ref")
            if isinstance(reference, str) and reference.startswith("#/$defs/"):
                found = dict(definitions[reference.removeprefix("#/$defs/")])
                return resolve({**found, **{k: v for k, v in node.items() if k != "$ref"}})
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


def json_body(*models: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` for a JSON body read by hand: one of ``models``."""
    schemas = [inline_schema(model) for model in models]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": schema}},
        }
    }
