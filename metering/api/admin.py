"""The admin routers, one module each, in the order of docs/api-admin.md:
reservations, limits, reports and webhook endpoints. `create_api` includes
them after the events and decisions routers (`metering.api.app.ROUTERS`)."""

from __future__ import annotations

from fastapi import APIRouter

from metering.api import limits, reports, reservations, webhooks

ROUTERS: tuple[APIRouter, ...] = (
    reservations.router,
    limits.router,
    reports.router,
    webhooks.router,
)
