"""Glue: workers and beat say they are alive, for `metering status`.

Beat answers no ping, and the embedded broker (kombu's SQL transport) has no
broadcast for Celery's ping, so each writes a heartbeat to the database
(`metering.storage.health`) about every ten seconds:

* a worker from a thread of its own, started by the `WorkerHeartbeat`
  bootstep in the main process once the pool is up (not from tasks, so a
  worker busy with a long batch, or idle, still says it is alive); a warm
  shutdown deletes its heartbeat;
* beat from its scheduler's tick (`workers.beat.HeartbeatScheduler`).

A database that does not answer is logged once and tried again next time:
a heartbeat never stops a worker or beat.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps

from metering.clock import Clock, system_clock
from metering.errors import MeteringError
from metering.storage.health import (
    HEARTBEAT_INTERVAL_SECONDS,
    WORKER,
    forget_heartbeat,
    record_heartbeat,
)
from workers.settings import settings_of

log = logging.getLogger(__name__)


class HeartbeatWriter:
    """Writes the heartbeats of one process; logs a failure once, not every time."""

    def __init__(self, url: str, role: str, name: str, clock: Clock = system_clock) -> None:
        self.url = url
        self.role = role
        self.name = name
        self.clock = clock
        self.failing = False

    def beat(self) -> bool:
        """Write a heartbeat now; False (and a warning the first time) if it could not be."""
        try:
            record_heartbeat(self.url, self.role, self.name, self.clock)
        except Exception as exc:  # a heartbeat must never stop what it reports on
            if not self.failing:
                log.warning(
                    "%s %s: could not write its heartbeat: %s",
                    self.role,
                    self.name,
                    exc,
                    exc_info=not isinstance(exc, MeteringError),
                )
            self.failing = True
            return False
        if self.failing:
            log.info("%s %s: heartbeats are written again", self.role, self.name)
        self.failing = False
        return True

    def forget(self) -> None:
        """Delete the heartbeat: the process stops on purpose."""
        try:
            forget_heartbeat(self.url, self.role, self.name)
        except Exception as exc:  # stopping goes on
            log.warning("%s %s: could not delete its heartbeat: %s", self.role, self.name, exc)


class WorkerHeartbeat(bootsteps.StartStopStep):  # type: ignore[misc]
    """Writes this worker's heartbeat, under its node name, from a thread."""

    label = "metering heartbeat"
    # After the pool and an embedded beat: their processes are forked before
    # the thread exists (a fork while it is inside SQLite can leave the
    # child waiting for ever on SQLite's lock).
    requires = ("celery.worker.components:Pool", "celery.worker.components:Beat")
    interval_seconds = HEARTBEAT_INTERVAL_SECONDS

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.writer: HeartbeatWriter | None = None

    def start(self, parent: Any) -> None:
        self.writer = HeartbeatWriter(settings_of(parent.app).database_url, WORKER, parent.hostname)
        self.stop_event.clear()
        self.thread = threading.Thread(target=self._run, name="metering-heartbeat", daemon=True)
        self.thread.start()

    def stop(self, parent: Any) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(self.interval_seconds)
            self.thread = None
        if self.writer is not None:
            self.writer.forget()

    def terminate(self, parent: Any) -> None:
        # A cold shutdown (a second SIGTERM, SIGQUIT) calls terminate, not
        # stop; bootsteps' own terminate does nothing, leaving the thread.
        self.stop(parent)

    def _run(self) -> None:
        assert self.writer is not None
        while not self.stop_event.is_set():
            self.writer.beat()
            self.stop_event.wait(self.interval_seconds)
