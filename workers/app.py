"""The Celery app, configured from `metering.settings.Settings`.

``celery -A workers worker`` (or ``metering worker``) applies queued batches;
``celery -A workers beat`` runs the periodic sweeps. Every ``METERING_*``
variable is read once, by ``Settings.from_env()`` (see `metering.settings`
for the list); a bad one stops the worker before it takes a message.

A worker always consumes the default queue ``metering`` (where beat's
sweeps and single-queue producers publish), even when ``-Q`` names only
hash-routed ones: ``metering worker --queues N`` passes
``-Q ",".join(worker_queues(N))`` and `ConsumeDefaultQueue` adds it to any
other ``-Q`` as well.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from celery import Celery, bootsteps, signals

from metering.pipeline.routing import (
    AUDIT_TASK,
    COMPACT_ROLLUPS_TASK,
    DEFAULT_QUEUE,
    DELIVER_WEBHOOKS_TASK,
    PRUNE_TASK,
    SWEEP_EMBEDDED_BROKER_TASK,
    SWEEP_RESERVATIONS_TASK,
    SWEEP_WEBHOOK_RESETS_TASK,
    worker_queues,
)
from metering.pipeline.transport import is_embedded_broker, use_embedded_transport
from metering.settings import Settings
from workers.heartbeat import WorkerHeartbeat
from workers.observability import MetricsServer, log_periodic_at_debug
from workers.settings import settings_of as settings_of
from workers.webhooks import WebhookDelivery

EMBEDDED_SWEEP_SECONDS = 30.0
# How often the rollups the batches appended are folded in (`metering.upkeep.retention.compact`).
COMPACT_ROLLUPS_SECONDS = 60.0


def _poll_embedded_broker_often() -> None:
    # kombu's SQLAlchemy transport hands every transport option to
    # create_engine, so its polling interval (1 s by default) can only be set
    # on the class. This process is a metering worker: 0.1 s keeps the
    # embedded pipeline's latency low at the cost of a cheap query.
    import kombu.transport.sqlalchemy

    kombu.transport.sqlalchemy.Transport.polling_interval = 0.1


def _parse_pdeathsig_once(**_: Any) -> None:
    # Each prefork pool child starts with billiard's set_pdeathsig, which
    # with cffi installed parses a C declaration: pycparser imported and its
    # parser built, about 30 ms of CPU a child. Parsed here once, before the
    # pool forks, every child inherits cffi's parser.
    if "cffi" in sys.modules:
        sys.modules["cffi"].FFI().cdef("int prctl (int __option, ...);")


def _freeze_startup_objects(**_: Any) -> None:
    # Everything built before the worker starts (modules, the app, settings)
    # lives as long as the process: out of the collector's reach, a full
    # collection during a batch scans the batch's objects only: 4-8 % less
    # CPU per 1,000-event batch (bench/bench_gc.py).
    # Pool children forked afterwards inherit the frozen generation.
    gc.freeze()


signals.worker_init.connect(_parse_pdeathsig_once, weak=False)
signals.worker_init.connect(_freeze_startup_objects, weak=False)


class ConsumeDefaultQueue(bootsteps.Step):  # type: ignore[misc]
    """Adds the default queue to a worker started with ``-Q`` that left it out.

    Runs as the worker is built: after ``-Q`` chose its queues, before the
    consumer subscribes. Without ``-Q`` the worker consumes every declared
    queue, the default one among them, and this does nothing.
    """

    label = "consume the default queue"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        queues = parent.app.amqp.queues
        if DEFAULT_QUEUE not in queues.consume_from:
            queues.select_add(queues[DEFAULT_QUEUE])


def create_app(url: str | None = None, settings: Settings | None = None) -> Celery:
    """The worker's app: ``settings`` default to ``Settings.from_env()``, ``url``
    to their broker URL."""
    settings = settings or Settings.from_env()
    url = url or settings.broker_url
    app = Celery("metering", broker=url, include=["workers.tasks"])
    app.metering_settings = settings
    visibility = settings.visibility_timeout_seconds
    # Redis: a message a dead worker held comes back after the visibility
    # timeout, but kombu only looks for such messages every interval x
    # throttle seconds (100 s by default); look at least twice per timeout.
    # Workers take turns through a Redis lock that a worker killed while
    # holding it keeps for unacked_mutex_expire (300 s by default), stopping
    # every other worker's look: let it lapse after one interval instead (a
    # look takes milliseconds; two overlapping ones only redeliver twice,
    # which applying ignores).
    restore_interval = max(1, min(int(visibility / 2), 60))
    transport: dict[str, Any] = {
        "visibility_timeout": visibility,
        "unacked_restore_interval": restore_interval,
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": restore_interval,
        # Tasks carry no priority: one list per queue, so a worker waiting on
        # empty queues (workers.guard) waits on as few lists as there are queues.
        "priority_steps": [0],
    }
    if is_embedded_broker(url):
        _poll_embedded_broker_often()
        transport = {}
        use_embedded_transport()
        # One process, as `metering worker` runs it here. Without an event
        # loop (kombu's SQL transport has none) the processes of a prefork
        # pool share one locked pipe, and one stopped by a SIGTERM to the
        # whole group (systemd's default) can die holding the lock: the warm
        # shutdown then waited on it until a SIGKILL.
        app.conf.update(worker_pool="solo", worker_concurrency=1)
    if url.split(":", 1)[0] in {"redis", "rediss"}:
        # Entries that are not kombu envelopes are dead-lettered, not fatal.
        app.conf.broker_transport = "workers.guard:GuardedRedisTransport"
    app.conf.update(
        # Messages Celery cannot run are dead-lettered before it drops them.
        worker_consumer="workers.guard:GuardedConsumer",
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # Applying is idempotent, so a message is acknowledged only once its
        # batch is committed, and redelivered if the worker dies first.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=DEFAULT_QUEUE,
        # Without -Q a worker consumes the default queue (beat's sweeps go
        # there) and every hash-routed queue producers may use.
        task_queues={
            name: {"exchange": name, "routing_key": name} for name in worker_queues(settings.queues)
        },
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options=transport,
        # Celery's scheduler, which also writes beat's heartbeat (`metering status`).
        beat_scheduler="workers.beat:HeartbeatScheduler",
        beat_schedule={
            "deliver-webhooks": {
                "task": DELIVER_WEBHOOKS_TASK,
                "schedule": settings.webhooks_interval_seconds,
                # A tick nobody picked up in time is dropped: the next one does the work.
                "options": {"expires": settings.webhooks_interval_seconds * 2},
            },
            "sweep-webhook-resets": {
                "task": SWEEP_WEBHOOK_RESETS_TASK,
                "schedule": settings.webhooks_interval_seconds,
                # A tick nobody picked up in time is dropped: the next one does the work.
                "options": {"expires": settings.webhooks_interval_seconds * 2},
            },
            "prune": {
                "task": PRUNE_TASK,
                "schedule": settings.prune_interval_seconds,
                "options": {"expires": settings.prune_interval_seconds},
            },
            "compact-rollups": {
                "task": COMPACT_ROLLUPS_TASK,
                "schedule": COMPACT_ROLLUPS_SECONDS,
                "options": {"expires": COMPACT_ROLLUPS_SECONDS},
            },
            "audit": {
                "task": AUDIT_TASK,
                "schedule": settings.audit_interval_seconds,
                "options": {"expires": settings.audit_interval_seconds},
            },
            "sweep-reservations": {
                "task": SWEEP_RESERVATIONS_TASK,
                "schedule": settings.reservation_sweep_seconds,
                "options": {"expires": settings.reservation_sweep_seconds * 2},
            },
        },
    )
    app.steps["worker"].add(ConsumeDefaultQueue)
    # Each worker delivers webhooks as they fall due, from a thread of its own.
    app.steps["worker"].add(WebhookDelivery)
    # And writes its heartbeat, which `metering status` reads.
    app.steps["worker"].add(WorkerHeartbeat)
    # And serves /metrics on METERING_METRICS_PORT, summed over its pool
    # (workers.observability, which also sets up JSON logs and tracing).
    app.steps["worker"].add(MetricsServer)
    if is_embedded_broker(url):
        app.conf.beat_schedule["sweep-embedded-broker"] = {
            "task": SWEEP_EMBEDDED_BROKER_TASK,
            "schedule": EMBEDDED_SWEEP_SECONDS,
        }
    log_periodic_at_debug([entry["task"] for entry in app.conf.beat_schedule.values()])
    return app


app = create_app()
