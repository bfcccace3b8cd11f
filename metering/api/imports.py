"""``POST /v1/imports``: an import (`Meter.import_events`) over HTTP, for an admin key.

The body is read as it arrives and applied a batch at a time, in a worker
thread that pulls the next chunk from the event loop (backpressure: the body
is never held whole), so it is exempt from the body-size bound
(`metering.api.bounds.STREAMED_PATHS`). ``Content-Type`` picks the format:
``application/x-ndjson`` (or ``application/jsonl``) for JSON Lines,
``text/csv`` for CSV. The answer is the summary `metering import --output
json` prints; a strict import with a bad line is a 400 and applies nothing.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Final

from anyio import from_thread
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from metering.api.context import Context
from metering.api.problems import ApiProblem
from metering.api.routes import route
from metering.domain.imports import ImportFormat

MEDIA_TYPES: Final[dict[str, ImportFormat]] = {
    "application/x-ndjson": "jsonl",
    "application/jsonl": "jsonl",
    "application/json-lines": "jsonl",
    "text/csv": "csv",
}


class BadLineOut(BaseModel):
    line: int = Field(description="The line's number; 1 is the body's first line.")
    reason: str


class ImportSummaryOut(BaseModel):
    """What the import did (as `metering import --output json`)."""

    events: int = Field(description="Events read (bad lines not counted).")
    applied: int = Field(description="New results allowed (or overage).")
    denied: int = Field(description="New results denied.")
    rejected: int = Field(description="New results rejected (unknown limit, too late).")
    duplicates: int = Field(description="Ids already decided with the same charges: unchanged.")
    conflicts: int = Field(description="Ids already decided with other charges: not applied.")
    bad: int = Field(description="Lines that are no event.")
    bad_lines: list[BadLineOut] = Field(description="The first 1000 bad lines.")


router = APIRouter(prefix="/v1", tags=["imports"])

_BODY_SCHEMA: Final = {"type": "string", "description": "One event a line."}


@route(
    router.post,
    "/imports",
    "Import history, exactly once by id",
    scope="admin",
    ok={200: {"model": ImportSummaryOut, "description": "The summary (bad lines listed)."}},
    errors=(400, 415),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {media: {"schema": _BODY_SCHEMA} for media in MEDIA_TYPES},
        }
    },
)
async def create_import(
    request: Request,
    context: Context,
    no_enforce: Annotated[
        bool, Query(description="History that happened: never deny (see docs/import.md).")
    ] = False,
    allow_late: Annotated[
        bool, Query(description="Accept events older than a limit's lateness.")
    ] = False,
    strict: Annotated[bool, Query(description="Apply nothing when a line is bad (400).")] = False,
) -> Response:
    """JSON Lines (``event_id, subject, limit, cost, occurred_at, metadata``
    or ``charges``) or CSV (header ``event_id,subject,limit,cost,occurred_at``
    and metadata columns), applied through the batch path exactly once by
    id: sent again, nothing changes and ``duplicates`` counts them. Results
    written with ``no_enforce`` or ``allow_late`` carry ``reason``
    ``imported: ...``. Admin only."""
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    fmt = MEDIA_TYPES.get(media)
    if fmt is None:
        shown = repr(media) if media else "no content type"
        raise ApiProblem("unsupported-media-type", f"{shown}: send {', '.join(MEDIA_TYPES)}")
    chunks = request.stream().__aiter__()
    summary = await run_in_threadpool(
        lambda: context.meter.import_events(
            _lines(chunks), fmt=fmt, enforce=not no_enforce, allow_late=allow_late, strict=strict
        )
    )
    return JSONResponse(summary.to_dict())


async def _next(chunks: AsyncIterator[bytes]) -> bytes | None:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return None


def _lines(chunks: AsyncIterator[bytes]) -> Iterator[str]:
    """The body's lines, read from the event loop chunk by chunk (in a worker thread)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = ""
    while True:
        chunk = from_thread.run(_next, chunks)
        text = pending + decoder.decode(chunk or b"", final=chunk is None)
        lines = text.split("\n")
        pending = lines.pop()
        for line in lines:
            yield line + "\n"
        if chunk is None:
            break
    if pending:
        yield pending
