"""The lag gauges of ``/metrics``, read when Prometheus scrapes.

`lag_collector` gives a `metering.telemetry.metrics.LagCollector` reading, at each scrape, what
``metering status`` reads (`metering.storage.queue_state`, `metering.storage.health`):
per queue the messages waiting and those taken but not acknowledged; the age of the oldest
queued event with no result yet (by send time; 0 when none); the webhook backlog (pending
deliveries to enabled endpoints due now, in all, and the longest overdue wait); the dead
letters of the last day; the last audit's violations per invariant. Each scrape opens and
closes its own connections, so a forked pool process shares none; a source that is away gives
``metering_lag_up{source} 0`` for that scrape, after at most `SCRAPE_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

from typing import Final

from metering.clock import Clock, system_clock
from metering.domain.audit import INVARIANTS
from metering.domain.instants import to_us
from metering.pipeline.routing import worker_queues
from metering.storage.audit import AuditStore
from metering.storage.health import DatabaseProbe
from metering.storage.queue_state import oldest_undecided, open_queues
from metering.storage.webhooks import WebhookStore
from metering.telemetry.metrics import LagCollector, QueueLag, WebhookBacklog
from metering.upkeep.dead_letters import RECENT_SECONDS

SCRAPE_TIMEOUT_SECONDS: Final = 3.0


def read_queue_lag(
    database_url: str, broker_url: str, queues: int = 1, clock: Clock = system_clock
) -> QueueLag:
    """Depths of the metering queues (the ones of ``queues`` and any other the
    broker holds), and the oldest undecided message's age."""
    broker = open_queues(broker_url, timeout_seconds=SCRAPE_TIMEOUT_SECONDS)
    probe: DatabaseProbe | None = None
    try:
        names = sorted(set(worker_queues(queues)) | set(broker.present_queues()))
        depths = broker.depths(names)
        probe = DatabaseProbe(database_url, connect_timeout_seconds=SCRAPE_TIMEOUT_SECONDS)
        oldest = oldest_undecided(broker, names, probe.decided).message
    finally:
        broker.close()
        if probe is not None:
            probe.close()
    age = None
    if oldest is not None and oldest.sent_at_us is not None:
        age = max(0.0, (to_us(clock()) - oldest.sent_at_us) / 1e6)
    return QueueLag(tuple((d.queue, d.waiting, d.unacked) for d in depths), age)


def read_webhook_backlog(database_url: str, clock: Clock = system_clock) -> WebhookBacklog:
    """Pending deliveries to enabled endpoints (none while there is no database yet)."""
    probe = DatabaseProbe(database_url, connect_timeout_seconds=SCRAPE_TIMEOUT_SECONDS)
    try:
        if probe.engine is None:
            return WebhookBacklog(0, 0, 0.0)
        now_us = to_us(clock())
        with probe.engine.connect() as connection:
            due, pending, earliest = WebhookStore(connection).backlog(now_us)
    finally:
        probe.close()
    overdue = 0.0 if earliest is None or due == 0 else max(0.0, (now_us - earliest) / 1e6)
    return WebhookBacklog(due, pending, overdue)


def read_rejected_recent(database_url: str, clock: Clock = system_clock) -> int:
    """Dead letters (rejected events and messages) kept in the last day."""
    probe = DatabaseProbe(database_url, connect_timeout_seconds=SCRAPE_TIMEOUT_SECONDS)
    try:
        return probe.rejected_since(to_us(clock()) - RECENT_SECONDS * 1_000_000)
    finally:
        probe.close()


def read_audit_counts(database_url: str) -> dict[str, int]:
    """The last audit's violations per invariant (every one 0 before any run)."""
    counts = dict.fromkeys(INVARIANTS, 0)
    probe = DatabaseProbe(database_url, connect_timeout_seconds=SCRAPE_TIMEOUT_SECONDS)
    try:
        if probe.engine is None:
            return counts
        with probe.engine.connect() as connection:
            last = AuditStore(connection).last_run()
    finally:
        probe.close()
    for violation in last["violations"] if last else ():
        counts[violation["invariant"]] = counts.get(violation["invariant"], 0) + 1
    return counts


def lag_collector(
    database_url: str, broker_url: str, queues: int = 1, clock: Clock = system_clock
) -> LagCollector:
    """A collector of the lag gauges (``collectors`` of `metering.telemetry.metrics.exposition`)."""
    return LagCollector(
        queues=lambda: read_queue_lag(database_url, broker_url, queues, clock),
        webhooks=lambda: read_webhook_backlog(database_url, clock),
        rejected=lambda: read_rejected_recent(database_url, clock),
        audit=lambda: read_audit_counts(database_url),
    )
