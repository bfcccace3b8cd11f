"""Thin, idempotent tasks: each hands its JSON argument to one library function.

While the database is away (`StorageError`), a task says so in one warning
line, without a traceback: a batch is retried with backoff (1 s doubling to
10 s, less up to half of it at random) until it is applied; a periodic sweep
does nothing until its next tick.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task

from metering.clock import backoff_seconds
from metering.errors import InputRefused, StorageError
from metering.meter import Meter
from metering.pipeline.batches import apply_delivered
from metering.pipeline.messages import batch_argument
from metering.pipeline.routing import (
    APPLY_BATCH_TASK,
    AUDIT_TASK,
    COMPACT_ROLLUPS_TASK,
    DELIVER_WEBHOOKS_TASK,
    PRUNE_TASK,
    SWEEP_EMBEDDED_BROKER_TASK,
    SWEEP_RESERVATIONS_TASK,
    SWEEP_WEBHOOK_RESETS_TASK,
    worker_queues,
)
from metering.pipeline.transport import is_embedded_broker
from metering.settings import Settings
from metering.storage.broker import sweep_embedded_broker
from metering.storage.queue_state import broker_kind
from metering.storage.redeliveries import count_redelivery
from metering.upkeep.audit import AuditOptions, run_audit
from metering.upkeep.dead_letters import keep_unfinished
from metering.upkeep.retention import compact, prune
from metering.webhooks.delivery import DeliveryReport, deliver_due, sweep_resets
from workers.app import app
from workers.settings import settings_of

log = logging.getLogger(__name__)
_meter: Meter | None = None
RETRY_FIRST_SECONDS = 1
RETRY_MAX_SECONDS = 10
R = TypeVar("R")
NOTHING_DONE: dict[str, int] = {}


def settings() -> Settings:
    return settings_of(app)


def meter() -> Meter:
    """One `Meter` per worker process, made after the fork."""
    global _meter
    if _meter is None:
        own = settings()
        _meter = Meter(own.database_url, correction_horizon_days=own.correction_horizon_days)
    return _meter


def until_next_tick(empty: R) -> Callable[[Callable[[], R]], Callable[[], R]]:
    """A periodic task that finds the database away logs one warning line and
    returns ``empty``: its next tick tries again."""

    def wrap(task: Callable[[], R]) -> Callable[[], R]:
        @functools.wraps(task)
        def run() -> R:
            try:
                return task()
            except StorageError as exc:
                log.warning("%s skipped until its next run: %s", task.__name__, exc)
                return empty

        return run

    return wrap


@app.task(
    name=APPLY_BATCH_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=None,
)
def apply_batch_task(self: Task, *args: Any, **kwargs: Any) -> dict[str, int]:
    """Apply one batch of usage events; database errors retry with backoff, forever.

    Except `InputRefused`: data the database refuses fails the same way on
    every run (`apply_batch` keeps such events in the dead-letter record).

    Takes any arguments so that a message with the wrong ones is recorded in
    ``rejected_messages`` instead of failing before it could be kept. A message
    delivered ``METERING_BROKER_MAX_DELIVERIES`` times and never finished (its
    worker died each time) is kept rejected instead of applied.
    """
    payload = batch_argument(args, kwargs)
    try:
        earlier = earlier_deliveries(self)
        bound = settings().broker_max_deliveries
        report = apply_delivered(meter(), payload, earlier, max_deliveries=bound).to_dict()
    except InputRefused:
        raise
    except StorageError as exc:
        # Jittered so that workers' retries spread out.
        wait = backoff_seconds(self.request.retries + 1, RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS)
        countdown = round(wait * random.uniform(0.5, 1.0), 1)
        log.warning("batch not applied, retrying in %.1f s: %s", countdown, exc)
        raise self.retry(exc=exc, countdown=countdown) from None
    log.info("batch applied: %s", report)
    return report


def earlier_deliveries(task: Task) -> int:
    """How many deliveries of the running message came before this one, none
    finished. 0 for a first delivery (nothing is counted) and on the embedded
    broker (its sweep bounds deliveries); on Redis, a delivery kombu marks
    ``redelivered`` is counted through the worker's broker connection. A count
    that fails is 0: the batch is applied."""
    request = task.request
    if not (request.delivery_info or {}).get("redelivered"):
        return 0
    if broker_kind(task.app.conf.broker_url) != "redis":
        return 0
    try:
        with task.app.pool.acquire(block=True) as connection:
            return count_redelivery(connection.default_channel.client, request.id)
    except Exception as exc:  # a bound on deliveries must never hold a batch up
        log.warning("batch delivered again; its deliveries not counted: %s", exc)
        return 0


@app.task(name=SWEEP_EMBEDDED_BROKER_TASK)
@until_next_tick({"restored": 0, "dead_lettered": 0})
def sweep_embedded_broker_task() -> dict[str, int]:
    """Embedded broker only: redeliver messages of a dead worker; dead-letter
    those delivered ``METERING_BROKER_MAX_DELIVERIES`` times."""
    if not is_embedded_broker(app.conf.broker_url):
        return {"restored": 0, "dead_lettered": 0}
    return sweep_embedded_broker(
        app.conf.broker_url,
        lambda messages: keep_unfinished(meter().database, messages),
        now=meter().clock(),
        visibility_timeout_seconds=settings().visibility_timeout_seconds,
        max_deliveries=settings().broker_max_deliveries,
    )


@app.task(name=DELIVER_WEBHOOKS_TASK, acks_late=True)
@until_next_tick(DeliveryReport().to_dict())
def deliver_webhooks_task() -> dict[str, int]:
    """Deliver due webhooks; safe in several workers at once (deliveries are claimed).

    Nothing to do where workers run their delivery thread (the default,
    `workers.webhooks`): it claims what falls due within its poll interval,
    and a run here would take up a pool slot, for up to the HTTP timeout,
    with what that thread leaves for later (a slow endpoint's backlog).
    """
    if settings().webhooks_dispatch:
        return DeliveryReport().to_dict()
    return deliver_due(meter(), settings().delivery).to_dict()


@app.task(name=SWEEP_WEBHOOK_RESETS_TASK, acks_late=True)
@until_next_tick(0)
def sweep_webhook_resets_task() -> int:
    """Write ``limit.reset`` notifications for denied windows that are over."""
    return sweep_resets(meter())


@app.task(name=SWEEP_RESERVATIONS_TASK, acks_late=True)
@until_next_tick(NOTHING_DONE)
def sweep_reservations_task() -> dict[str, int]:
    """Commit reservations and release checkouts past their time to live; drop old settled ones."""
    retention = settings().reservation_retention_seconds
    return meter().sweep_reservations(retention_seconds=retention)


@app.task(name=PRUNE_TASK, acks_late=True)
@until_next_tick(NOTHING_DONE)
def prune_task() -> dict[str, int]:
    """Delete results, dead letters and webhook records past their retention."""
    done = prune(
        meter(),
        settings().retention,
        visibility_timeout_seconds=settings().visibility_timeout_seconds,
    )
    return {p.table: p.rows for p in done}


@app.task(name=COMPACT_ROLLUPS_TASK, acks_late=True)
@until_next_tick(NOTHING_DONE)
def compact_rollups_task() -> dict[str, int]:
    """Fold the rollups the batches appended into the usage rollups."""
    return {"usage_rollups": compact(meter())}


@app.task(name=AUDIT_TASK, acks_late=True)
@until_next_tick(NOTHING_DONE)
def audit_task() -> dict[str, int]:
    """Check what the ledger took since the last run; violations per invariant."""
    own = settings()
    options = AuditOptions(
        sweep_seconds=own.reservation_sweep_seconds,
        broker_url=own.broker_url,
        queues=worker_queues(own.queues),
    )
    report = run_audit(meter(), options=options)
    if not report.ok:
        log.error("audit: %d violations %s", len(report.violations), report.counts())
    return report.counts()
