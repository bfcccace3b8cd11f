"""Glue: each worker delivers webhooks from a thread of its own.

A worker bootstep starts `metering.webhooks.delivery.serve` in the worker's
main process once the pool has started, and stops it (letting running
attempts finish and record) at shutdown. It looks for due deliveries every
``METERING_WEBHOOKS_POLL_INTERVAL`` seconds (0.25; `metering.settings`), so a notification
written by a batch in any worker, or by `Meter.consume` in an application,
goes out within a fraction of a second, with no beat tick and no server
feature (SQLite has no ``NOTIFY``). ``METERING_WEBHOOKS_DISPATCH=0`` turns it
off; beat's ``metering.deliver_webhooks`` then delivers. Once connected, a
starting thread first makes due the retries whose last attempt got no answer
(`metering.webhooks.delivery.retry_unanswered`): a restart with settings that
now allow a destination delivers at once, not after the backoff.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import bootsteps

from metering.clock import backoff_seconds
from metering.errors import MeteringError
from metering.meter import Meter
from metering.settings import Settings
from metering.webhooks.delivery import retry_unanswered, serve
from metering.webhooks.dispatch import log_failure
from workers.settings import settings_of

log = logging.getLogger(__name__)
# The thread waits for the database this long at first, doubling to the most.
RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0
_meters: list[Meter] = []


def _forget_in_child() -> None:
    # A pool process forked later must not use (or close) the parent's connections.
    for meter in _meters:
        meter.database.dispose(close=False)


os.register_at_fork(after_in_child=_forget_in_child)


class WebhookDelivery(bootsteps.StartStopStep):  # type: ignore[misc]
    """Runs the delivery thread of this worker."""

    label = "webhook delivery"
    # After the pool and an embedded beat: their processes are forked before
    # the thread exists (a fork while it is inside SQLite can leave the
    # child waiting for ever on SQLite's lock).
    requires = ("celery.worker.components:Pool", "celery.worker.components:Beat")

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.settings: Settings | None = None

    def include_if(self, parent: Any) -> bool:
        return settings_of(parent.app).webhooks_dispatch

    def start(self, parent: Any) -> None:
        self.settings = settings_of(parent.app)
        self.stop_event.clear()
        self.thread = threading.Thread(target=self._run, name="metering-webhooks", daemon=True)
        self.thread.start()
        log.info(
            "webhook delivery thread started (looks every %g s)",
            self.settings.webhooks_poll_seconds,
        )

    def stop(self, parent: Any) -> None:
        self.stop_event.set()
        if self.thread is not None and self.settings is not None:
            self.thread.join(self.settings.delivery.timeout_seconds + 5)
            self.thread = None

    def terminate(self, parent: Any) -> None:
        # A cold shutdown (a second SIGTERM, SIGQUIT) calls terminate, not
        # stop; bootsteps' own terminate does nothing, leaving the thread.
        self.stop(parent)

    def _run(self) -> None:
        assert self.settings is not None
        settings = self.settings
        failures = 0
        started = False
        while not self.stop_event.is_set():
            try:
                meter = Meter(settings.database_url)
            except MeteringError as exc:  # the database is away: try again later
                failures += 1
                wait = backoff_seconds(failures, RETRY_SECONDS, MAX_RETRY_SECONDS)
                log.warning(
                    "webhook delivery waits for the database: %s; again in %.1f s", exc, wait
                )
                self.stop_event.wait(wait)
                continue
            failures = 0
            _meters.append(meter)
            try:
                if not started:
                    due = retry_unanswered(meter)
                    started = True
                    if due:
                        log.info("%d webhook retries that got no answer are due now", due)
                serve(
                    meter,
                    self.stop_event,
                    poll_seconds=settings.webhooks_poll_seconds,
                    settings=settings.delivery,
                )
            except Exception as exc:
                log_failure("webhook delivery thread failed; starting it again", exc, RETRY_SECONDS)
                self.stop_event.wait(RETRY_SECONDS)
            finally:
                _meters.remove(meter)
                meter.close()
