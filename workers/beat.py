"""Beat's scheduler: Celery's own, which also writes beat's heartbeat.

Set as ``beat_scheduler`` in `workers.app`, so ``celery -A workers beat`` and a
worker's embedded ``--beat`` both use it. Each `tick` runs the due tasks as Celery's
`PersistentScheduler` does, and at most every `HEARTBEAT_INTERVAL_SECONDS` writes that
beat is alive (`workers.heartbeat`), which `metering status` reads: beat answers no
ping. Each beat is named ``beat.PID@HOST``, so a second one, even on the same host,
shows (`metering status` warns). A broker out of reach is one warning line until it
is back (and one then), not a traceback for every due task.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from celery.beat import PersistentScheduler
from kombu.exceptions import OperationalError

from metering.clock import Clock, system_clock
from metering.storage.health import BEAT, HEARTBEAT_INTERVAL_SECONDS
from workers.heartbeat import HeartbeatWriter
from workers.settings import settings_of

logger = logging.getLogger(__name__)


def beat_name() -> str:
    """This beat's heartbeat name: ``beat.PID@HOST``."""
    return f"beat.{os.getpid()}@{socket.gethostname()}"


class HeartbeatScheduler(PersistentScheduler):  # type: ignore[misc]
    """`PersistentScheduler` plus a heartbeat of role ``beat``, named ``beat.PID@HOST``."""

    interval_seconds = HEARTBEAT_INTERVAL_SECONDS

    def __init__(self, *args: Any, clock: Clock = system_clock, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        url = settings_of(self.app).database_url
        self.heartbeat = HeartbeatWriter(url, BEAT, beat_name(), clock)
        self.next_heartbeat = 0.0  # time.monotonic() of the next heartbeat
        self.unreachable = False  # the last task sent found no broker

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Run due tasks; write the heartbeat when due; seconds until the next tick."""
        interval = float(super().tick(*args, **kwargs))
        now = time.monotonic()
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.interval_seconds
            self.heartbeat.beat()
        return min(interval, self.next_heartbeat - now)

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        """Send a due task as Celery does; a broker that cannot be reached is
        one warning line until it is back (the task is sent at its next time)."""
        try:
            self.apply_async(entry, producer=producer, advance=False)
        except Exception as exc:  # Celery's SchedulingError, the broker's error its context
            if not _unreachable(exc):
                logger.exception("beat: %s could not be sent", entry.name)  # as Celery's own
                return
            if not self.unreachable:
                logger.warning(
                    "beat: the broker cannot be reached (%s); due tasks are not sent "
                    "until it is back",
                    exc,
                )
            self.unreachable = True
            logger.debug("beat: %s not sent: %s", entry.name, exc)
            return
        if self.unreachable:
            logger.warning("beat: the broker is back; due tasks are sent again")
            self.unreachable = False


def _unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from, says the broker cannot be reached."""
    while exc is not None:
        if isinstance(exc, OperationalError | OSError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
