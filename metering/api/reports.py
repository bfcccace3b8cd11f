"""Reports over HTTP: ``GET /v1/reports/overage``, ``/usage`` and ``/shadow``.

The query parameters are the ``metering report`` options (``period``,
``since``, ``until``, ``limit``; ``subject`` and ``top`` for overage;
``subject`` required for usage, and ``group_by`` for usage by a metadata
key; ``limit`` required for shadow, with ``subject`` and ``top``) and are
validated by the library (`select_overage`, `select_usage`,
`usage_by_dimension`, `select_shadow`) before any row is read. ``format``
(``json`` or ``csv``, as the CLI's ``--format``; any other value is 400)
picks the format, else ``Accept``: JSON (``application/json``, the default)
or CSV (``text/csv``, the CLI's writer: `metering.reports.export.csv_lines`,
formula-like cells neutralised); anything else is 406. JSON is the document
of `metering.reports.export.json_lines`, the one ``metering report --format
json`` prints too. Rows stream from the database as the client reads them,
in chunks of about 64 KiB, so an export of any size keeps the server's
memory flat. Reports take the ``read`` scope.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Generator, Iterator
from datetime import datetime
from functools import partial
from typing import Annotated, Any, Final, Literal

import anyio
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field, RootModel
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from metering.api.admin_common import LIMIT_NAMES, fields_named
from metering.api.auth import scoped_subject
from metering.api.context import ApiContext, Context
from metering.api.models import LimitFilter, SubjectFilter
from metering.api.problems import ApiProblem
from metering.api.routes import Handler, route
from metering.domain.bounds import MAX_LISTING
from metering.domain.limits import (
    Enforcement,
)
from metering.reports import (
    DimensionReport,
    csv_lines,
    json_lines,
    select_overage,
    select_shadow,
    select_usage,
    usage_by_dimension,
)
from metering.reports.overage import BaseReport


class DimensionRowOut(BaseModel):
    """A subject's use of one limit for one value of the grouped key."""

    subject: str
    limit: str
    dimension: str
    value: str | None = Field(description="None: the events had no value for the key.")
    used: int = Field(description="The cost consumed.")
    events: int = Field(description="The events that consumed it.")


class DimensionReportOut(BaseModel):
    """Usage by dimension (``group_by``) as JSON; ``text/csv`` gives the rows as CSV."""

    report: Literal["usage_by"]
    subject: str
    group_by: str
    period: str = Field(description="The hours' start range, in words.", examples=["2026-11"])
    since: datetime | None = Field(description="Hours starting at or after this.")
    until: datetime | None = Field(description="Hours starting before this.")
    rows: list[DimensionRowOut] = Field(description="The largest use first.")


# -- the routes ---------------------------------------------------------------------

router = APIRouter(prefix="/v1", tags=["reports"])

Format = Literal["json", "csv"]
MEDIA: Final[dict[Format, str]] = {"json": "application/json", "csv": "text/csv; charset=utf-8"}
# What an Accept range may name, and the format it gets: the exact types
# first, then the wildcards (JSON is the default).
RANGES: Final[dict[str, tuple[Format, int]]] = {
    "application/json": ("json", 2),
    "text/csv": ("csv", 2),
    "application/*": ("json", 1),
    "text/*": ("csv", 1),
    "*/*": ("json", 0),
}
CHUNK_CHARS: Final = 64 * 1024


class ReportRowOut(BaseModel):
    """One subject's use of one limit in one window."""

    subject: str
    limit: str
    enforcement: Enforcement
    window_start: datetime
    window_end: datetime
    maximum: int = Field(
        description="The maximum that applied: the subject's entitlement at the window's end, "
        "else the limit's default."
    )
    used: int
    granted: int = Field(description="The part of used that grants paid.")
    overage: int = Field(
        description="Billable usage beyond the maximum: for a soft limit, used - granted "
        "beyond the maximum; 0 for hard and shadow limits (denied demand is not overage)."
    )
    overdraft: int = Field(
        description="Usage a commit of more than was reserved took past a hard limit: it "
        "happened, so it is billed like overage (voided events left out), but never more "
        "than used - granted - maximum - overage of this row."
    )
    denied: int = Field(
        description="The cost of the events denied in the window: demand refused, never "
        "billed (a shadow limit's would-denies)."
    )
    denied_events: int = Field(description="How many events were denied (would-deny: shadow).")
    utilisation_percent: float
    first_denied_at: datetime | None
    time_zone: str | None = Field(
        description="A window at the subject's local midnight (a subject with a time zone): "
        "its IANA zone; else null."
    )
    local_window: str | None = Field(
        description="That window's local label, e.g. '2026-11 Asia/Kolkata'; else null."
    )


class ReportOut(BaseModel):
    """A report as JSON (``Accept: application/json``); ``text/csv`` gives the rows
    as CSV, the header first."""

    report: Literal["overage", "usage"]
    period: str = Field(description="The windows' start range, in words.", examples=["2026-11"])
    since: datetime | None = Field(description="Windows starting at or after this.")
    until: datetime | None = Field(description="Windows starting before this.")
    rows: list[ReportRowOut]


class ShadowRowOut(BaseModel):
    """What a shadow limit would have denied one subject over the period."""

    subject: str
    limit: str
    would_deny_events: int
    would_deny_cost: int
    windows: int = Field(description="Windows with at least one would-deny.")
    first_would_deny_at: datetime | None
    peak_window_start: datetime = Field(description="The window with most would-deny cost.")
    peak_window_end: datetime
    peak_used: int
    peak_maximum: int = Field(description="The maximum that applied in the peak window.")
    peak_would_deny_cost: int


class ShadowOut(BaseModel):
    """The shadow report as JSON; ``text/csv`` gives the rows as CSV."""

    report: Literal["shadow"]
    period: str = Field(description="The windows' start range, in words.", examples=["2026-11"])
    since: datetime | None = Field(description="Windows starting at or after this.")
    until: datetime | None = Field(description="Windows starting before this.")
    limit: str
    rows: list[ShadowRowOut]


# What a report may answer besides the report: a bad filter, no format of
# the two acceptable, a name of no limit.
REPORT_ERRORS: Final = (400, 406, 422)


def _report_route(
    path: str,
    summary: str,
    model: type[BaseModel],
    description: str = "The report, streamed: JSON, or CSV (a header, then one line a row).",
) -> Callable[[Handler], Handler]:
    """A report's route: ``read`` scope (a customer's key: its own subject,
    ``subject`` in the query), the report as JSON or CSV, or a problem."""
    return route(
        router.get,
        path,
        summary,
        scope="read",
        subjects="query",
        ok={
            200: {
                "model": model,
                "description": description,
                "content": {"text/csv": {"schema": {"type": "string"}}},
            }
        },
        errors=REPORT_ERRORS,
    )


class UsageReportOut(RootModel[ReportOut | DimensionReportOut]):
    """A usage report: per window (`ReportOut`), or with ``group_by`` per value
    of the key (`DimensionReportOut`)."""


Period = Annotated[
    str | None,
    Query(pattern=r"^[0-9]{4}-[0-9]{2}$", description="A calendar month (UTC): 2026-11."),
]
Since = Annotated[
    str | None,
    Query(
        description="RFC 3339: windows starting at or after this "
        "(naive is UTC, a date its midnight)."
    ),
]
Until = Annotated[str | None, Query(description="RFC 3339: windows starting before this.")]
FormatChoice = Annotated[
    Format | None,
    Query(alias="format", description="json or csv; wins over Accept (default: Accept)."),
]


def negotiate(accept: str | None) -> Format:
    """The format an ``Accept`` header asks for: the acceptable range with the
    highest q, the most specific at equal q; JSON without the header; 406 when
    neither JSON nor CSV is acceptable."""
    best: tuple[float, int, Format] | None = None
    for part in (accept or "*/*").split(","):
        media, *parameters = part.split(";")
        found = RANGES.get(media.strip().lower())
        if found is None:
            continue
        quality = _quality(parameters)
        if quality <= 0:
            continue
        candidate = (quality, found[1], found[0])
        if best is None or candidate[:2] > best[:2]:
            best = candidate
    if best is None:
        raise ApiProblem("not-acceptable", "this report is application/json or text/csv (Accept)")
    return best[2]


def _quality(parameters: list[str]) -> float:
    for parameter in parameters:
        key, _, value = parameter.partition("=")
        if key.strip().lower() == "q":
            try:
                quality = float(value.strip())
            except ValueError:
                return 0.0
            return quality if 0 <= quality <= 1 else 0.0
    return 1.0


def _chunks(lines: Iterator[str], rows: Iterator[Any]) -> Generator[str, None, None]:
    """``lines`` joined into chunks of about `CHUNK_CHARS`. Closing it closes
    ``rows``, the database cursor under ``lines``, at once."""
    try:
        buffer: list[str] = []
        size = 0
        for line in lines:
            buffer.append(line)
            size += len(line)
            if size >= CHUNK_CHARS:
                yield "".join(buffer)
                buffer, size = [], 0
        if buffer:
            yield "".join(buffer)
    finally:
        for source in (lines, rows):
            close = getattr(source, "close", None)
            if close is not None:
                close()


async def _stream(first: str, chunks: Generator[str, None, None]) -> AsyncGenerator[bytes, None]:
    """The chunks, each read in a worker thread (the database cursor blocks)."""
    yield first.encode()
    while (chunk := await run_in_threadpool(next, chunks, None)) is not None:
        yield chunk.encode()


class Streamed(StreamingResponse):
    """A streamed answer whose cursor is closed however it ends: read to the
    end, or the client gone midway (Starlette then stops iterating and leaves
    the generator to the garbage collector; this closes it at once)."""

    def __init__(
        self,
        chunks: Generator[str, None, None],
        first: str,
        media_type: str,
        headers: dict[str, str],
    ) -> None:
        self._chunks = chunks
        self._body = _stream(first, chunks)
        super().__init__(self._body, media_type=media_type, headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._body.aclose()
                await run_in_threadpool(self._chunks.close)


async def _respond(
    request: Request,
    context: ApiContext,
    chosen: Format | None,
    filename: str,
    select: Callable[..., BaseReport[Any] | DimensionReport],
    period: str | None,
    since: str | None,
    until: str | None,
) -> Response:
    """The report ``select`` makes of the period, streamed in the format
    ``chosen`` (else the one ``Accept`` asks for); a filter the library
    refuses is a 400 naming it."""
    fmt = chosen or negotiate(request.headers.get("accept"))
    with fields_named(LIMIT_NAMES):  # the library's names of the filters, as the query's
        report = await run_in_threadpool(
            lambda: select(context.meter, period=period, since=since, until=until)
        )
    rows = report.rows()
    lines = csv_lines(rows, report.kind) if fmt == "csv" else json_lines(report, rows)
    chunks = _chunks(lines, rows)
    try:
        # The first chunk is read before the answer starts: a database that
        # fails at once is a problem (503), not a cut stream. There is always
        # one: the CSV header, the JSON object's start.
        first = await run_in_threadpool(next, chunks)
    except BaseException:
        await run_in_threadpool(chunks.close)
        raise
    headers = {"Vary": "Accept"}
    if fmt == "csv":
        headers["Content-Disposition"] = f'attachment; filename="{filename}.csv"'
    return Streamed(chunks, first, MEDIA[fmt], headers)


@_report_route("/reports/overage", "The overage report", ReportOut)
async def overage(
    request: Request,
    context: Context,
    period: Period = None,
    since: Since = None,
    until: Until = None,
    subject: SubjectFilter = None,
    limit: LimitFilter = None,
    top: Annotated[
        int | None, Query(ge=1, le=MAX_LISTING, description="Only the N largest overages.")
    ] = None,
    fmt: FormatChoice = None,
) -> Response:
    """Maximum, used, overage and denials per subject, limit and window, the
    largest overage first: ``metering report overage``. A window belongs to
    the period it starts in; token buckets and deleted limits are left out."""
    subject = await scoped_subject(request, subject)
    select = partial(select_overage, subject=subject, limit=limit, top=top)
    return await _respond(request, context, fmt, "overage", select, period, since, until)


@_report_route(
    "/reports/usage",
    "A subject's usage over time, or by a metadata key",
    UsageReportOut,
    "The report, streamed: JSON (usage per window; with group_by, usage per value of "
    "the key), or CSV (a header, then one line a row).",
)
async def usage(
    request: Request,
    context: Context,
    subject: Annotated[str, Query(description="The subject.")],
    period: Period = None,
    since: Since = None,
    until: Until = None,
    limit: LimitFilter = None,
    group_by: Annotated[
        str | None,
        Query(
            description="A metadata key the limits record (their dimensions): usage per "
            "value of it over hours starting in the period, the largest first.",
            examples=["route"],
        ),
    ] = None,
    fmt: FormatChoice = None,
) -> Response:
    """One subject's usage per window, oldest first, limit by limit:
    ``metering report usage``. With ``group_by``, its usage per limit and
    value of that metadata key (``metering report usage --group-by``);
    ``since`` and ``until`` then fall on the hour."""
    if group_by is None:
        select: Callable[..., BaseReport[Any] | DimensionReport] = partial(
            select_usage, subject=subject, limit=limit
        )
        filename = "usage"
    else:
        select = partial(usage_by_dimension, subject=subject, key=group_by, limit=limit)
        filename = f"usage-by-{group_by}"
    return await _respond(request, context, fmt, filename, select, period, since, until)


@_report_route("/reports/shadow", "Whom a shadow limit would have denied", ShadowOut)
async def shadow(
    request: Request,
    context: Context,
    limit: Annotated[str, Query(description="The shadow limit.")],
    period: Period = None,
    since: Since = None,
    until: Until = None,
    subject: SubjectFilter = None,
    top: Annotated[
        int | None,
        Query(ge=1, le=MAX_LISTING, description="Only the N subjects with most would-deny cost."),
    ] = None,
    fmt: FormatChoice = None,
) -> Response:
    """Per subject, what a shadow limit would have denied had it been hard:
    would-deny count and cost, in how many windows, and the peak window's
    usage against the maximum that applied; the largest would-deny cost
    first: ``metering report shadow``; only windows that ended while the limit
    was shadow. A limit never shadow is a 400 naming ``limit`` (a hard
    limit's denials are in the overage report)."""
    subject = await scoped_subject(request, subject)
    select = partial(select_shadow, limit=limit, subject=subject, top=top)
    return await _respond(request, context, fmt, "shadow", select, period, since, until)
