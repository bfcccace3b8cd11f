"""The admin routers, one module each, in the order of docs/api-admin.md:
reservations, limits, entitlements/grants/corrections, subjects, reports, webhook
endpoints, rejected input and the audit. `create_api` includes
them after the events and decisions routers (`metering.api.app.ROUTERS`)."""

from __future__ import annotations

from fastapi import APIRouter

from metering.api import (
    allowances,
    audit,
    imports,
    licenses,
    limits,
    prices,
    quarantine,
    rejected,
    reports,
    reservations,
    simulations,
    subjects,
    webhooks,
)

ROUTERS: tuple[APIRouter, ...] = (
    reservations.router,
    licenses.router,
    limits.router,
    quarantine.router,
    allowances.router,
    subjects.router,
    prices.router,
    reports.router,
    simulations.router,
    imports.router,
    webhooks.router,
    rejected.router,
    audit.router,
)
