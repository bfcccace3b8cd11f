"""The Celery app, configured from the environment.

``celery -A workers worker`` (or ``metering worker``) applies queued batches;
``celery -A workers beat`` runs the periodic sweeps. Settings:

* ``METERING_BROKER_URL``: Redis in production (``redis://host:6379/0``);
  unset, kombu's SQLAlchemy transport on ``./metering-broker.db``.
* ``METERING_DATABASE_URL``: where counters and results live.
* ``METERING_QUEUES``: how many hash-routed queues producers use (default 1).
* ``METERING_VISIBILITY_TIMEOUT``: seconds before a message taken by a
  worker that died is delivered again (default 300).
* ``METERING_WEBHOOKS_INTERVAL``: seconds between beat's webhook delivery
  runs and ``limit.reset`` sweeps (default 5).
* ``METERING_WEBHOOKS_POLL_INTERVAL``: seconds between a worker's looks for
  due webhook deliveries (default 0.25; `workers.webhooks`), and
  ``METERING_WEBHOOKS_DISPATCH=0`` to leave delivery to beat alone.
* ``METERING_RESERVATION_SWEEP_INTERVAL``: seconds between sweeps that
  commit reservations past their time to live (default 10).
* ``METERING_RESERVATION_RETENTION``: seconds settled reservations are kept
  before the sweep deletes them (default 604800, a week).
* ``METERING_PRUNE_INTERVAL``: seconds between retention runs (default 3600);
  ages in ``METERING_RETAIN_*_DAYS`` (see `metering.retention`).
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from metering.config import broker_url, env_float, is_embedded_broker, use_embedded_transport
from metering.errors import ConfigurationError
from metering.pipeline import DEFAULT_QUEUE
from metering.producer import queue_names
from metering.webhooks.settings import interval_seconds
from workers.webhooks import WebhookDelivery

EMBEDDED_SWEEP_SECONDS = 30.0
MAX_QUEUES = 1024


def _poll_embedded_broker_often() -> None:
    # kombu's SQLAlchemy transport hands every transport option to
    # create_engine, so its polling interval (1 s by default) can only be set
    # on the class. This process is a metering worker: 0.1 s keeps the
    # embedded pipeline's latency low at the cost of a cheap query.
    from kombu.transport import sqlalchemy as kombu_sqla

    kombu_sqla.Transport.polling_interval = 0.1


def create_app(url: str | None = None) -> Celery:
    url = broker_url(url)
    app = Celery("metering", broker=url, include=["workers.tasks"])
    wanted = env_float("METERING_QUEUES", 1)
    if wanted != int(wanted) or not 1 <= wanted <= MAX_QUEUES:
        raise ConfigurationError(f"METERING_QUEUES must be a whole number from 1 to {MAX_QUEUES}")
    queues = int(wanted)
    visibility = env_float("METERING_VISIBILITY_TIMEOUT", 300)
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
    }
    if is_embedded_broker(url):
        _poll_embedded_broker_often()
        transport = {}
        use_embedded_transport()
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
            name: {"exchange": name, "routing_key": name}
            for name in dict.fromkeys([DEFAULT_QUEUE, *queue_names(queues)])
        },
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options=transport,
        beat_schedule={
            "deliver-webhooks": {
                "task": "metering.deliver_webhooks",
                "schedule": interval_seconds(),
                # A tick nobody picked up in time is dropped: the next one does the work.
                "options": {"expires": interval_seconds() * 2},
            },
            "sweep-webhook-resets": {
                "task": "metering.sweep_webhook_resets",
                "schedule": interval_seconds(),
                # A tick nobody picked up in time is dropped: the next one does the work.
                "options": {"expires": interval_seconds() * 2},
            },
            "prune": {
                "task": "metering.prune",
                "schedule": env_float("METERING_PRUNE_INTERVAL", 3600),
                "options": {"expires": env_float("METERING_PRUNE_INTERVAL", 3600)},
            },
            "sweep-reservations": {
                "task": "metering.sweep_reservations",
                "schedule": env_float("METERING_RESERVATION_SWEEP_INTERVAL", 10),
                "options": {"expires": env_float("METERING_RESERVATION_SWEEP_INTERVAL", 10) * 2},
            },
        },
    )
    # Each worker delivers webhooks as they fall due, from a thread of its own.
    app.steps["worker"].add(WebhookDelivery)
    if is_embedded_broker(url):
        app.conf.beat_schedule["sweep-embedded-broker"] = {
            "task": "metering.sweep_embedded_broker",
            "schedule": EMBEDDED_SWEEP_SECONDS,
        }
    return app


app = create_app()
