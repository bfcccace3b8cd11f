"""The admin routers, one module each, in the order of docs/api-admin.md:
reservations, limits, entitlements/grants/corrections, reports and webhook
endpoints. `create_api` includes
them after the events and decisions routers (`metering.api.app.ROUTERS`)."""

from __future__ import annotations

from fastapi import APIRouter

from metering.api import allowances, imports, licenses, limits, reports, reservations, webhooks

ROUTERS: tuple[APIRouter, ...] = (
    reservations.router,
    licenses.router,
    limits.router,
    allowances.router,
    reports.router,
    imports.router,
    webhooks.router,
)
