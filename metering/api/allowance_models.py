"""The shapes of the entitlement, grant and correction routes.

As in `metering.api.admin_models`: bodies are read by hand and checked by
the library's own rules; these models describe them for ``/openapi.json``.
Answers are the library's ``to_dict`` (`Entitlement`, `Grant`,
`Correction`), so the CLI's ``--format json`` and the API agree.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from metering.api.admin_models import LIMIT_PATTERN, SUBJECT_PATTERN
from metering.domain.corrections import MAX_REASON_CHARS
from metering.domain.events import EVENT_ID_PATTERN, MAX_SUBJECT_LENGTH
from metering.domain.grants import MAX_GRANT
from metering.domain.limits import MAX_MAXIMUM

ID_PATTERN: Final = f"^{EVENT_ID_PATTERN.pattern}$"
# A reason is printable text with something besides spaces (ASCII here; the
# library takes any printable text).
REASON_PATTERN: Final = r"^[ -~]*[!-~][ -~]*$"


def _subject() -> Any:
    return Field(
        min_length=1, max_length=MAX_SUBJECT_LENGTH, pattern=SUBJECT_PATTERN, examples=["org-42"]
    )


def _moment(description: str) -> Any:
    return Field(default=None, description=f"{description} RFC 3339; naive is UTC.")


def _reason(description: str) -> Any:
    return Field(
        min_length=1, max_length=MAX_REASON_CHARS, pattern=REASON_PATTERN, description=description
    )


# -- entitlements ------------------------------------------------------------------


class EntitlementIn(BaseModel):
    """A subject's own maximum for a limit, from an instant on."""

    model_config = ConfigDict(extra="forbid")

    maximum: int = Field(ge=1, le=MAX_MAXIMUM, description="Inclusive maximum per period.")
    effective_from: datetime | None = _moment("When it takes effect (default now).")


class EntitlementOut(BaseModel):
    """One change of a subject's maximum; ``maximum`` null: back to the limit's default."""

    subject: str
    limit: str
    maximum: int | None
    effective_from: datetime
    created_at: datetime = Field(description="When the change was recorded.")


class Entitlements(BaseModel):
    entitlements: list[EntitlementOut] = Field(
        description="By limit and subject, oldest change first."
    )


# -- grants ---------------------------------------------------------------------


class GrantIn(BaseModel):
    """A top-up: ``amount`` more on top of the maximum, until ``expires_at``."""

    model_config = ConfigDict(extra="forbid")

    subject: str = _subject()
    limit: str = Field(pattern=LIMIT_PATTERN, examples=["api_calls"])
    amount: int = Field(ge=1, le=MAX_GRANT)
    expires_at: datetime | None = _moment("When what is left of it is gone (default never).")
    grant_id: str | None = Field(
        default=None,
        pattern=ID_PATTERN,
        description="Its idempotency key: the same grant again answers 200, other values "
        "under the same id 409. Generated when not given.",
    )
    effective_from: datetime | None = _moment("When it starts to count (default now).")
    reason: str | None = Field(
        default=None, min_length=1, max_length=MAX_REASON_CHARS, pattern=REASON_PATTERN
    )


class GrantOut(BaseModel):
    grant_id: str
    subject: str
    limit: str
    amount: int
    used: int
    left: int
    effective_from: datetime
    expires_at: datetime | None
    reason: str | None


class GrantAdded(GrantOut):
    duplicate: bool = Field(description="The grant id existed with these values: nothing changed.")


class Grants(BaseModel):
    grants: list[GrantOut] = Field(description="By subject, limit and id; at most 1000.")


# -- corrections ------------------------------------------------------------------


class VoidIn(BaseModel):
    """Why the event is voided, and optionally the correction's id."""

    model_config = ConfigDict(extra="forbid")

    reason: str = _reason("Kept with the correction.")
    correction_id: str | None = Field(
        default=None,
        pattern=ID_PATTERN,
        description="Its idempotency key; generated when not given.",
    )


class GrantGiven(BaseModel):
    grant_id: str
    amount: int


class VoidedCharge(BaseModel):
    subject: str
    limit: str
    cost: int = Field(description="Given back to the counter of its own window.")
    window_start: datetime | None = Field(description="Null for a token bucket.")
    grants: list[GrantGiven] = Field(description="Grants still active that got their amount back.")


class CorrectionOut(BaseModel):
    correction_id: str
    event_id: str
    reason: str
    created_at: datetime
    charges: list[VoidedCharge]


class Voided(CorrectionOut):
    duplicate: bool = Field(description="The event was voided before: that correction.")


class Corrections(BaseModel):
    corrections: list[CorrectionOut] = Field(description="Oldest first.")
