"""The ledger's hook: notifications into the outbox, in the counters' transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from metering.domain.decisions import ChargeDecision
from metering.domain.limits import Limit
from metering.domain.notifications import Notice, notices_for, payload_of
from metering.domain.state import CounterKey, CounterState
from metering.storage.webhooks import WebhookStore


@dataclass(frozen=True, slots=True)
class Transition:
    """One decided event's counters just before and just after it."""

    event_id: str | None
    keys: Sequence[CounterKey]
    before: Sequence[CounterState]
    after: Sequence[CounterState]
    charges: Sequence[ChargeDecision]


def notices_of(limits: Mapping[str, Limit], transitions: Sequence[Transition]) -> list[Notice]:
    """Every candidate notice of a batch, in event order (pure)."""
    found: list[Notice] = []
    for t in transitions:
        for key, before, after, charge in zip(t.keys, t.before, t.after, t.charges, strict=True):
            found.extend(notices_for(limits[key.limit], key, before, after, charge, t.event_id))
    return found


def record_notifications(
    connection: Connection,
    limits: Mapping[str, Limit],
    transitions: Sequence[Transition],
    now_us: int,
) -> list[str]:
    """Write the batch's new notifications (and their deliveries); returns message ids.

    Most events cause no candidate at all, and then no statement runs.
    """
    notices = notices_of(limits, transitions)
    if not notices:
        return []
    return WebhookStore(connection).record_notices(
        [(notice, payload_of(notice, now_us)) for notice in notices], now_us
    )
