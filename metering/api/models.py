"""The shapes the API's resources share, as pydantic models: the OpenAPI schema's source.

Here: the schema's patterns, the event and check bodies (both read by
`metering.api.parsing`, for the event and the decision routes), a decision
and a subject's usage (answered by several routes), and `body_fields`. Each
resource's own bodies and answers are declared in its module
(`metering.api.limits`, `.reservations`, `.webhooks`, `.allowances`,
`.reports`).

Request bodies are parsed by hand (the library's rules, with a problem per
bad field); the models describe them for the schema, and the parsers take
the fields a body may have from them (`body_fields`), so each body is
described once. Responses are built as plain dicts by the ``*_json``
functions and declared with these models, so every answer the API gives has
its shape in ``/openapi.json``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Annotated, Any, Literal, get_type_hints

from fastapi import Path, Query
from pydantic import BaseModel, ConfigDict, Field, create_model

from metering.domain.decisions import Decision
from metering.domain.events import MAX_CHARGES, MAX_COST, MAX_SUBJECT_LENGTH
from metering.usage.current import LimitUsage, usage_dict

# The schema's patterns: the library's rules (`metering.domain`) where a
# pattern can say them. A subject is any printable text without edge spaces;
# the schema's pattern says it for ASCII.
SUBJECT_PATTERN = r"^[!-~](?:[ -~]{0,198}[!-~])?$"
# A subject as a route's path parameter (``/v1/subjects/{subject}/...``).
SubjectInPath = Annotated[
    str,
    Path(
        description="The subject, URL-encoded.",
        json_schema_extra={"pattern": SUBJECT_PATTERN, "maxLength": MAX_SUBJECT_LENGTH},
    ),
]
LIMIT_PATTERN = r"^[a-z0-9_.:\-]{1,64}$"
EVENT_ID_PATTERN = r"^[A-Za-z0-9_.:@/+=\-]{1,128}$"


def body_fields(*models: type[BaseModel]) -> frozenset[str]:
    """The JSON names a body described by ``models`` may have (a field's alias
    where it has one): what a hand parser lets through."""
    return frozenset(
        field.alias or name for model in models for name, field in model.model_fields.items()
    )


def subject_field(description: str | None = None) -> Any:
    """A subject: 1 to 200 printable characters, without edge spaces."""
    return Field(
        min_length=1,
        max_length=MAX_SUBJECT_LENGTH,
        pattern=SUBJECT_PATTERN,
        description=description,
        examples=["org-42"],
    )


def _subject() -> Any:
    return subject_field("Who is metered: 1 to 200 printable characters.")


def _limit() -> Any:
    return Field(pattern=LIMIT_PATTERN, examples=["api_calls"])


def _cost() -> Any:
    return Field(
        default=1,
        ge=0,
        le=MAX_COST,
        description="A whole number, 1 to 10^12; 0 only for a gauge (a level it reports).",
    )


def _charges() -> Any:
    return Field(min_length=1, max_length=MAX_CHARGES, description="All or nothing.")


def _event_id() -> Any:
    return Field(
        default=None,
        pattern=EVENT_ID_PATTERN,
        description="The idempotency key; generated when not given.",
    )


def _occurred_at() -> Any:
    return Field(
        default=None,
        description="RFC 3339 with a time zone, within the limit's lateness and at most "
        "5 minutes ahead; default: when the request arrived.",
    )


class ChargeIn(BaseModel):
    """One charge of a stacked event."""

    model_config = ConfigDict(extra="forbid")

    subject: str = _subject()
    limit: str = _limit()
    cost: int = _cost()


class SingleEvent(BaseModel):
    """A usage event with one charge, in the Python API's names."""

    model_config = ConfigDict(extra="forbid")

    event_id: str | None = _event_id()
    subject: str = _subject()
    limit: str = _limit()
    cost: int = _cost()
    occurred_at: datetime | None = _occurred_at()
    metadata: dict[str, Any] | None = Field(default=None, description="At most 8 KiB as JSON.")


class StackedEvent(BaseModel):
    """A usage event with several charges: allowed only if every hard charge fits."""

    model_config = ConfigDict(extra="forbid")

    event_id: str | None = _event_id()
    charges: list[ChargeIn] = _charges()
    occurred_at: datetime | None = _occurred_at()
    metadata: dict[str, Any] | None = Field(default=None, description="At most 8 KiB as JSON.")


class CloudEventData(BaseModel):
    """``data`` of a usage CloudEvent: ``limit`` and ``cost``, or ``charges`` (a
    charge without ``subject`` takes the event's); every other key becomes the
    event's metadata."""

    model_config = ConfigDict(extra="allow")

    limit: str | None = Field(default=None, pattern=LIMIT_PATTERN)
    cost: int = _cost()
    charges: list[ChargeIn] | None = Field(default=None, min_length=1, max_length=MAX_CHARGES)


class CloudEvent(BaseModel):
    """A CloudEvents 1.0 event in structured JSON mode."""

    model_config = ConfigDict(extra="allow")

    specversion: Literal["1.0"]
    id: str = Field(pattern=EVENT_ID_PATTERN, description="The event id.")
    source: str = Field(min_length=1)
    type: str = Field(min_length=1)
    subject: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SUBJECT_LENGTH,
        pattern=SUBJECT_PATTERN,
        description="The subject; with data.charges, of the charges that name none.",
    )
    time: datetime | None = Field(default=None, description="occurred_at.")
    datacontenttype: Literal["application/json"] | None = None
    data: CloudEventData


CHECK_METADATA = (
    "The event's metadata: a seat limit (distinct) needs its key's value. At most 8 KiB as JSON."
)


class SingleCheck(BaseModel):
    """Would one charge be allowed now (or at ``occurred_at``)?"""

    model_config = ConfigDict(extra="forbid")

    subject: str = _subject()
    limit: str = _limit()
    cost: int = _cost()
    occurred_at: datetime | None = _occurred_at()
    metadata: dict[str, Any] | None = Field(default=None, description=CHECK_METADATA)


class StackedCheck(BaseModel):
    """Would these charges, together, be allowed?"""

    model_config = ConfigDict(extra="forbid")

    charges: list[ChargeIn] = _charges()
    occurred_at: datetime | None = _occurred_at()
    metadata: dict[str, Any] | None = Field(default=None, description=CHECK_METADATA)


# The figures of a decision: answered only to a key that may read usage (an
# ingest-only key learns the outcome, not a subject's usage).
FIGURES_NOTE = "Left out for a key without read scope: an ingest-only key gets the outcome."


def _figure(description: str = FIGURES_NOTE) -> Any:
    return Field(default=None, description=description)


class ChargeDecisionOut(BaseModel):
    subject: str
    limit: str
    cost: int
    allowed: bool
    outcome: Literal["allowed", "denied", "overage", "would_deny", "ahead_of_pace"] = Field(
        description="would_deny: a shadow limit's charge a hard one would deny (nothing "
        "consumed); ahead_of_pace: a soft paced limit's charge past its pace, within the "
        "maximum (consumed, not billed)."
    )
    used: int | None = _figure()
    remaining: int | None = _figure()
    maximum: int | None = _figure()
    overage: int | None = _figure()
    overdraft: int | None = Field(
        default=None,
        description="Only on a reservation committed at more than reserved: the units a hard "
        "limit had no room for at the charge's maximum, charged anyway and billed by the "
        "overage report, no further than its row's usage past its maximum (the cost is then the "
        "real cost).",
    )
    window_start: datetime | None
    resets_at: datetime
    retry_at: datetime | None


class DecisionOut(BaseModel):
    """A decision: the verdict, and each charge's."""

    event_id: str | None
    outcome: Literal["allowed", "denied", "overage", "rejected"]
    allowed: bool
    denied_by: list[str]
    reason: str | None = Field(
        description="Why a queued event was rejected; for an event imported with "
        "no_enforce or allow_late, `imported: ...` (see docs/import.md)."
    )
    occurred_at: datetime
    decided_at: datetime
    used: int | None = _figure(
        "Of the deciding charge: the first denied, else the first. " + FIGURES_NOTE
    )
    remaining: int | None = _figure("The least remaining across charges. " + FIGURES_NOTE)
    maximum: int | None = _figure()
    resets_at: datetime | None
    retry_at: datetime | None = Field(description="When every denied charge fits again.")
    charges: list[ChargeDecisionOut]


class Result(DecisionOut):
    """The stored result of an event."""

    status: Literal["decided"]
    event_id: str | None
    duplicate: bool = Field(description="The id had been decided before: this is that result.")
    metadata: dict[str, Any] | None


class Pending(BaseModel):
    """An event still on the queue."""

    status: Literal["pending"]
    event_id: str


class Kept(BaseModel):
    """An event this server accepted while the broker was unavailable: it holds
    it and queues it once the broker is back (send it again only under its id)."""

    status: Literal["kept"]
    event_id: str


class Accepted(BaseModel):
    """Events queued (the broker has them), and repeated ids answered from the ledger."""

    accepted: list[str] = Field(description="Ids queued; the workers decide them.")
    duplicates: list[Result] = Field(description="Ids already decided: their stored results.")


class Results(BaseModel):
    """``?wait=decision``: each event's result, in the order sent."""

    results: list[Result]


class LimitUsageOut(BaseModel):
    limit: str
    algorithm: Literal["fixed_window", "token_bucket"]
    enforcement: str
    maximum: int
    used: int
    remaining: int
    overage: int
    window_start: datetime | None
    resets_at: datetime
    retry_at: datetime | None = Field(description="When a charge of 1 fits again, if denied now.")
    grants_left: int = Field(
        description="What is left of the subject's grants in force for this limit "
        "(on top of remaining), as the usage page counts it."
    )
    exhausts_at: datetime | None = Field(
        description="When remaining and grants_left run out at the subject's recent rate "
        "(decayed over an hour), if before resets_at; null otherwise, and for a token bucket."
    )
    time_zone: str | None = Field(
        default=None,
        description="A calendar window of a subject with a time zone: the zone it is "
        "aligned in; else null.",
    )
    local_window: str | None = Field(
        default=None,
        description="That window's local label, e.g. '2026-11 Asia/Kolkata' or "
        "'2026-03-29 Europe/Berlin'; else null.",
    )


class SubjectUsage(BaseModel):
    subject: str
    limits: list[LimitUsageOut]


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


TOP_FIGURES = ("used", "remaining", "maximum")
CHARGE_FIGURES = ("used", "remaining", "maximum", "overage", "overdraft", "grants")


def decision_json(decision: Decision, *, figures: bool = True) -> dict[str, Any]:
    """A decision; without ``figures`` (a key that may not read usage) the
    outcome only: no used, remaining, maximum, overage or grants drawn, and
    no ``retry_at`` of a token bucket (its refill time tells its tokens; a
    window's end tells nothing of the usage)."""
    body = decision.to_dict()
    body.update(
        used=decision.used,
        remaining=decision.remaining,
        maximum=decision.maximum,
        resets_at=iso(decision.resets_at),
        retry_at=iso(decision.retry_at),
    )
    if not figures:
        for name in TOP_FIGURES:
            del body[name]
        for charge in body["charges"]:
            for name in CHARGE_FIGURES:
                charge.pop(name, None)
        buckets = [c for c in decision.charges if c.window_start_us is None]
        for charge, shown in zip(decision.charges, body["charges"], strict=True):
            if charge.window_start_us is None:  # a token bucket's charge
                shown["retry_at"] = None
        if any(not c.allowed for c in buckets):
            body["retry_at"] = None
    return body


def result_json(decision: Decision, *, figures: bool = True) -> dict[str, Any]:
    body = decision_json(decision, figures=figures)
    body.update(
        status="decided",
        duplicate=decision.duplicate,
        metadata=dict(decision.metadata) if decision.metadata is not None else None,
    )
    return body


def usage_json(usage: LimitUsage) -> dict[str, Any]:
    return usage_dict(usage)


# Request bodies the routes read by hand, for the schema's components.
REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    SingleEvent,
    StackedEvent,
    CloudEvent,
    SingleCheck,
    StackedCheck,
)


# The filters of a listing or a report, in the query.
SubjectFilter = Annotated[str | None, Query(description="Only this subject.")]
LimitFilter = Annotated[str | None, Query(description="Only this limit.")]


def record_model(record: type, name: str, **descriptions: str) -> type[BaseModel]:
    """An answer's model named ``name`` with the fields of the library's
    dataclass ``record``: their names, types and order, each required;
    ``descriptions`` describe some of them in the schema."""
    types = get_type_hints(record)
    fields: dict[str, Any] = {
        field.name: (
            types[field.name],
            Field(description=descriptions[field.name]) if field.name in descriptions else ...,
        )
        for field in dataclasses.fields(record)
    }
    return create_model(name, __module__=record_model.__module__, **fields)
