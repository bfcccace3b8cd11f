"""``GET /v1/audit``: what the last `metering audit` run (or beat's) found,
as ``metering audit --format json`` prints it. An admin's: the audit names
subjects of every customer. Reading runs nothing; beat runs the audit
(``METERING_AUDIT_INTERVAL``), ``metering audit`` runs it at once."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field
from starlette.responses import JSONResponse, Response

from metering.api.admin_common import threaded
from metering.api.context import Context
from metering.api.routes import route
from metering.domain.audit import INVARIANTS
from metering.upkeep.audit import last_report


class ViolationOut(BaseModel):
    invariant: str = Field(description="The invariant broken (docs/audit.md lists them).")
    subject: str | None = Field(description="The subject, when the violation has one.")
    limit: str | None = Field(description="The limit, when the violation has one.")
    window_start: str | None = Field(description="The window's start (RFC 3339), if any.")
    item: str | None = Field(description="An event, grant, reservation or delivery id.")
    expected: str = Field(description="What the ledger says.")
    found: str = Field(description="What was found.")


class AuditOut(BaseModel):
    ran_at: str | None = Field(description="When the last run ran; null: never.")
    full: bool | None = Field(description="Whether it checked every window.")
    checked_from: str | None = Field(description="Windows touched since (null: every window).")
    checked_to: str | None = Field(description="What it kept for the next run reaches this.")
    windows: int = Field(description="Windows checked.")
    counts: dict[str, int] = Field(description="Violations per invariant.")
    violations: list[ViolationOut] = Field(description="What it found.")


router = APIRouter(prefix="/v1", tags=["audit"])

NEVER: dict[str, Any] = {
    "ran_at": None,
    "full": None,
    "checked_from": None,
    "checked_to": None,
    "windows": 0,
    "counts": dict.fromkeys(INVARIANTS, 0),
    "violations": [],
}


@route(
    router.get,
    "/audit",
    "The last audit",
    scope="admin",
    ok={200: {"model": AuditOut, "description": "The last run (all null: none yet)."}},
)
async def last_audit(context: Context) -> Response:
    """What the last audit run found: violations per invariant, and each one."""
    found = await threaded(last_report, context.meter)
    return JSONResponse(found if found is not None else NEVER)
