"""Allowances: per-subject maximums (entitlements), top-ups (grants, one-off
or recurring), per-subject alert thresholds (`alerts`) and voids of decided
events (corrections).

`service` holds their transactions, which `Meter` wraps; `give_back` the
one step that gives an event's usage back to counters, grants and rollups
(a cancel, a commit of less, a void); the rules are in
the pure domain (`metering.domain.grants`, `metering.domain.corrections`),
the SQL in `metering.storage.allowances`.
"""

from metering.allowances.alerts import Alert, list_alerts, remove_alert, set_alert
from metering.allowances.service import (
    Correction,
    Grant,
    RecurringGrant,
    add_grant,
    corrections,
    entitlements,
    list_grants,
    list_recurring,
    load_entitlements,
    set_entitlement,
    set_entitlements,
    void,
)

__all__ = [
    "Alert",
    "Correction",
    "Grant",
    "RecurringGrant",
    "add_grant",
    "corrections",
    "entitlements",
    "list_alerts",
    "list_grants",
    "list_recurring",
    "load_entitlements",
    "remove_alert",
    "set_alert",
    "set_entitlement",
    "set_entitlements",
    "void",
]
