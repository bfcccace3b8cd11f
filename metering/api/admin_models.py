"""The shapes of the admin routes (reservations, limits, reports, webhooks).

As in `metering.api.models`: request bodies are read by hand (the library's
rules, `metering.api.admin_common.read_object`) and these models describe
them for the schema; answers are plain dicts built by the ``*_json``
functions below and declared with these models, so every answer has its
shape in ``/openapi.json``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from metering.api.models import DecisionOut
from metering.domain.bounds import MAX_ROW_ID
from metering.domain.events import EVENT_ID_PATTERN, MAX_CHARGES, MAX_COST, MAX_SUBJECT_LENGTH
from metering.domain.instants import from_us
from metering.domain.limits import (
    DIMENSION_PATTERN,
    MAX_DIMENSIONS,
    MAX_MAXIMUM,
    MAX_THRESHOLD_PERCENT,
    MAX_THRESHOLDS,
    NAME_PATTERN,
    Algorithm,
    Enforcement,
    Limit,
    WindowKind,
)
from metering.domain.notifications import MESSAGE_TYPES
from metering.domain.reservations import DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS
from metering.reservations import ReservationInfo
from metering.storage.webhooks import AttemptRecord, DeliveryRecord
from metering.webhooks.endpoints import MAX_GRACE_SECONDS, MAX_URL_CHARS, Endpoint

# The schema's patterns, from the library's rules. A subject is any printable
# text without edge spaces; the pattern says it for ASCII.
SUBJECT_PATTERN = r"^[!-~](?:[ -~]{0,198}[!-~])?$"
LIMIT_PATTERN = f"^{NAME_PATTERN.pattern}$"
ID_PATTERN = f"^{EVENT_ID_PATTERN.pattern}$"
# An endpoint id is printable with no spaces (``ep_`` and hex when made by add).
ENDPOINT_ID_PATTERN = r"^[!-~]{1,64}$"

ReservationStateName = Literal["held", "committed", "cancelled"]
MessageType = Literal[
    "limit.denied",
    "limit.threshold",
    "limit.exceeded",
    "limit.reset",
    "limit.would_deny",
    "usage.corrected",
]
DeliveryStatusName = Literal["pending", "delivered", "failed"]
assert set(MessageType.__args__) == set(MESSAGE_TYPES)  # type: ignore[attr-defined]


def _subject() -> Any:
    return Field(
        min_length=1, max_length=MAX_SUBJECT_LENGTH, pattern=SUBJECT_PATTERN, examples=["org-42"]
    )


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


# -- reservations -----------------------------------------------------------------


class ReserveCharge(BaseModel):
    """One charge of a stacked reservation."""

    model_config = ConfigDict(extra="forbid")

    subject: str = _subject()
    limit: str = Field(pattern=LIMIT_PATTERN, examples=["exports"])
    cost: int = Field(default=1, ge=1, le=MAX_COST)


def _reservation_id() -> Any:
    return Field(
        default=None,
        pattern=ID_PATTERN,
        description="The reservation's id (its event id): a repeated id answers the "
        "same reservation. Generated when not given.",
    )


def _ttl() -> Any:
    return Field(
        default=DEFAULT_TTL_SECONDS,
        gt=0,
        le=MAX_TTL_SECONDS,
        description="Seconds it is held before the sweeper commits it (at most 7 days).",
    )


class ReserveSingle(BaseModel):
    """Reserve one charge: consumed now, given back by a cancel."""

    model_config = ConfigDict(extra="forbid")

    event_id: str | None = _reservation_id()
    subject: str = _subject()
    limit: str = Field(pattern=LIMIT_PATTERN, examples=["exports"])
    cost: int = Field(default=1, ge=1, le=MAX_COST)
    ttl_seconds: float = _ttl()
    metadata: dict[str, Any] | None = Field(default=None, description="At most 8 KiB as JSON.")


class ReserveStacked(BaseModel):
    """Reserve several charges, all or nothing."""

    model_config = ConfigDict(extra="forbid")

    event_id: str | None = _reservation_id()
    charges: list[ReserveCharge] = Field(min_length=1, max_length=MAX_CHARGES)
    ttl_seconds: float = _ttl()
    metadata: dict[str, Any] | None = Field(default=None, description="At most 8 KiB as JSON.")


class ReservedCharge(BaseModel):
    subject: str
    limit: str
    cost: int = Field(description="The units reserved.")
    given_back: int = Field(
        description="The units that went back to the counter: by a cancel, a void, or a "
        "commit of less than reserved (`actual`)."
    )


class ReservationOut(BaseModel):
    """A stored reservation."""

    id: str
    state: ReservationStateName
    charges: list[ReservedCharge]
    created_at: datetime
    expires_at: datetime = Field(description="When the sweeper commits it if still held.")
    settled_at: datetime | None
    settled_by: str | None = Field(
        description="cancel, commit, expiry or void.", examples=["cancel"]
    )


class Cancelled(ReservationOut):
    """A cancelled reservation, and the units its counters took back."""

    returned: int = Field(
        description="Units given back: 0 when a window has ended since, or on a second cancel."
    )


class Committed(ReservationOut):
    """A committed reservation, and the units given back by a commit of less."""

    returned: int = Field(
        description="Units given back: the reserved cost less ``actual``, where the counters "
        "could take it; 0 without ``actual`` or on a second commit."
    )


class Reservations(BaseModel):
    reservations: list[ReservationOut] = Field(description="Newest first.")


class Reserved(BaseModel):
    """The answer to a reservation: its state, and the decision."""

    id: str
    state: Literal["held", "committed", "cancelled", "denied"] = Field(
        description="held when allowed; denied (nothing consumed, nothing stored); for a "
        "repeated id, where the reservation stands now."
    )
    allowed: bool
    duplicate: bool = Field(description="The id had been decided before: this is that result.")
    expires_at: datetime | None = Field(description="When a held reservation is committed.")
    decision: DecisionOut


def reservation_json(info: ReservationInfo) -> dict[str, Any]:
    return info.to_dict()


# -- limits -------------------------------------------------------------------------


class LimitIn(BaseModel):
    """A limit's definition, as in a limits file (``metering limits load``)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None, pattern=LIMIT_PATTERN, description="If given, the name in the path."
    )
    maximum: int = Field(ge=1, le=MAX_MAXIMUM, description="Inclusive maximum per period.")
    period: str = Field(
        pattern=r"^[ \t]*[0-9]+[ \t]*(s|m|h|d|w|mo|y)[ \t]*$",
        max_length=32,
        examples=["1h", "1mo"],
        description="30s, 2m, 1h, 1d, 2w, 1mo, 1y; at most 10 years.",
    )
    algorithm: Algorithm = "fixed_window"
    window: WindowKind = Field(default="first_use", description="Fixed window only.")
    enforcement: Enforcement = Field(
        default="hard",
        description="hard denies; soft allows and counts overage; shadow decides like hard, "
        "records would_deny and never denies. A token bucket is hard or shadow.",
    )
    thresholds: list[int] = Field(
        default=[],
        max_length=MAX_THRESHOLDS,
        description="Percentages of the maximum that send limit.threshold.",
        json_schema_extra={
            "items": {"type": "integer", "minimum": 1, "maximum": MAX_THRESHOLD_PERCENT}
        },
    )
    lateness: str = Field(
        default="1d",
        pattern=r"^[ \t]*[0-9]+[ \t]*(s|m|h|d|w)[ \t]*$",
        max_length=32,
        description="How late an event may arrive.",
    )
    thresholds_units: list[int] = Field(
        default=[],
        max_length=MAX_THRESHOLDS,
        description="Absolute amounts of usage that send limit.threshold (threshold_units).",
        json_schema_extra={"items": {"type": "integer", "minimum": 1, "maximum": MAX_MAXIMUM}},
    )
    dimensions: list[str] = Field(
        default=[],
        max_length=MAX_DIMENSIONS,
        description="Metadata keys whose values usage is recorded by, hour by hour "
        "(GET /v1/reports/usage?group_by=KEY).",
        json_schema_extra={
            "items": {"type": "string", "pattern": f"^{DIMENSION_PATTERN.pattern}$"}
        },
    )


class LimitOut(BaseModel):
    name: str
    maximum: int
    period: str
    algorithm: Algorithm
    window: WindowKind
    enforcement: Enforcement
    thresholds: list[int]
    lateness: str
    thresholds_units: list[int]
    dimensions: list[str]


class Limits(BaseModel):
    limits: list[LimitOut] = Field(description="By name.")


def limit_json(limit: Limit) -> dict[str, Any]:
    return limit.to_dict()


# -- reports --------------------------------------------------------------------------


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


# -- webhooks ----------------------------------------------------------------------


class EndpointIn(BaseModel):
    """A new webhook endpoint."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=1,
        max_length=MAX_URL_CHARS,
        pattern=r"^https?://[^\s/?#@]+",
        examples=["https://billing.example.com/hooks"],
    )
    types: list[MessageType] = Field(default=[], description="Message types to send; [] is all.")
    secret: str | None = Field(
        default=None,
        pattern=r"^(whsec_)?[A-Za-z0-9+/]+={0,2}$",
        description="whsec_ + base64 of 16 to 64 bytes; generated when not given.",
    )


class EndpointChange(BaseModel):
    """What to change of an endpoint; what is not given stays."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(
        default=None, min_length=1, max_length=MAX_URL_CHARS, pattern=r"^https?://[^\s/?#@]+"
    )
    types: list[MessageType] | None = Field(default=None, description="[] is every type.")


class RotateIn(BaseModel):
    """A secret rotation: the old secret still signs during the grace."""

    model_config = ConfigDict(extra="forbid")

    secret: str | None = Field(default=None, pattern=r"^(whsec_)?[A-Za-z0-9+/]+={0,2}$")
    grace_seconds: float | None = Field(
        default=None,
        ge=0,
        le=MAX_GRACE_SECONDS,
        description="Default METERING_WEBHOOKS_ROTATION_GRACE (86400).",
    )


class EndpointOut(BaseModel):
    """An endpoint: its secret masked, a password in its URL masked."""

    id: str
    url: str
    types: list[MessageType] = Field(description="[] is every type.")
    enabled: bool
    disabled_reason: str | None
    secret_masked: str = Field(examples=["whsec_…k1Q="])
    secret_encrypted: bool = Field(description="Stored encrypted (METERING_SECRET_KEY).")
    rotating_until: datetime | None = Field(description="Until then the old secret signs too.")
    created_at: datetime


class EndpointCreated(BaseModel):
    """A new endpoint, and its secret: shown this once."""

    endpoint: EndpointOut
    secret: str = Field(description="The full signing secret; never shown again.")


class SecretRotated(BaseModel):
    """The endpoint's new secret: shown this once."""

    endpoint: EndpointOut
    secret: str = Field(description="The new signing secret; never shown again.")


class Endpoints(BaseModel):
    endpoints: list[EndpointOut] = Field(description="Oldest first.")


class AttemptOut(BaseModel):
    attempt: int
    at: datetime
    status_code: int | None
    duration_ms: int
    error: str | None


class DeliveryOut(BaseModel):
    """A message's delivery to one endpoint, with its attempts."""

    id: int
    message_id: str
    type: str = Field(examples=["limit.denied"])
    endpoint_id: str
    status: DeliveryStatusName
    attempts: int
    last_status_code: int | None
    last_error: str | None
    next_attempt_at: datetime | None = Field(description="When pending: the next attempt.")
    created_at: datetime
    attempt_log: list[AttemptOut]


class Deliveries(BaseModel):
    deliveries: list[DeliveryOut] = Field(description="Newest first.")


class ReplayIn(BaseModel):
    """Deliveries to send again: by id, or every one created since (or both)."""

    model_config = ConfigDict(extra="forbid")

    delivery_ids: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        json_schema_extra={"items": {"type": "integer", "minimum": 1, "maximum": MAX_ROW_ID}},
    )
    since: datetime | None = Field(default=None, description="RFC 3339; naive is UTC.")


class Replayed(BaseModel):
    queued: int = Field(description="Deliveries due again now, with a fresh retry schedule.")


def endpoint_json(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "id": endpoint.id,
        "url": endpoint.url,
        "types": list(endpoint.types),
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason,
        "secret_masked": endpoint.secret_masked,
        "secret_encrypted": endpoint.secret_encrypted,
        "rotating_until": _iso(endpoint.rotating_until),
        "created_at": endpoint.created_at.isoformat(),
    }


def _iso_us(us: int) -> str:
    return from_us(us).isoformat()


def delivery_json(record: DeliveryRecord, attempts: list[AttemptRecord]) -> dict[str, Any]:
    pending = record.status == "pending" and record.next_attempt_at_us is not None
    return {
        "id": record.id,
        "message_id": record.message_id,
        "type": record.message_type,
        "endpoint_id": record.endpoint_id,
        "status": str(record.status),
        "attempts": record.attempts,
        "last_status_code": record.last_status_code,
        "last_error": record.last_error,
        "next_attempt_at": _iso_us(record.next_attempt_at_us)
        if pending and record.next_attempt_at_us is not None
        else None,
        "created_at": _iso_us(record.created_at_us),
        "attempt_log": [
            {
                "attempt": a.attempt,
                "at": _iso_us(a.attempted_at_us),
                "status_code": a.status_code,
                "duration_ms": a.duration_ms,
                "error": a.error,
            }
            for a in attempts
        ],
    }
