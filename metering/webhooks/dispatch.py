"""Running delivery attempts side by side, bounded per endpoint.

A `Dispatcher` owns a thread pool. One thread (the caller of `fill`, `drain`
or `serve`) claims due deliveries and hands each to the pool; claiming stops
while ``max_in_flight`` attempts run, and an endpoint with
``max_in_flight_per_endpoint`` attempts running is left out of the next claims
(its deliveries wait in the table, claimable by another worker). A receiver
that hangs until the timeout therefore holds only its own slots: deliveries
to every other endpoint go on.

The dispatcher knows nothing of SQL or HTTP: it is given ``claim`` (excluded
endpoint ids → a claimed job or None) and ``attempt`` (job → new status).
Claims stay exclusive (`WebhookStore.claim_due`), so any number of
dispatchers, in any number of processes, can run at once.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor

from metering.clock import backoff_seconds
from metering.errors import MeteringError
from metering.storage.webhook_records import DeliveryJob

log = logging.getLogger(__name__)

Claim = Callable[[Collection[str]], DeliveryJob | None]
Attempt = Callable[[DeliveryJob], str]
# The status tallied for an attempt that raised (it was logged; its lease
# expires and the delivery is claimed again).
CRASHED = "crashed"
# Claims that fail in a row (the database away) are tried again after the
# poll interval, doubled each time up to this.
MAX_CLAIM_BACKOFF_SECONDS = 30.0


def log_failure(what: str, exc: Exception, retry_seconds: float | None = None) -> None:
    """One warning line for our errors (the database away); a traceback for others."""
    again = "" if retry_seconds is None else f"; trying again in {retry_seconds:.1f} s"
    if isinstance(exc, MeteringError):
        log.warning("%s: %s%s", what, exc, again)
    else:
        log.exception("%s%s", what, again)


class Dispatcher:
    """Attempts on a thread pool: at most ``max_in_flight`` at once, and at
    most ``max_in_flight_per_endpoint`` to any one endpoint."""

    def __init__(
        self, attempt: Attempt, *, max_in_flight: int, max_in_flight_per_endpoint: int
    ) -> None:
        if max_in_flight < 1 or max_in_flight_per_endpoint < 1:
            raise ValueError("a dispatcher needs room for at least one attempt")
        self.max_in_flight = max_in_flight
        self.max_in_flight_per_endpoint = max_in_flight_per_endpoint
        self.tally: Counter[str] = Counter()
        self._attempt = attempt
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="metering-webhook")
        self._changed = threading.Condition()
        self._per_endpoint: Counter[str] = Counter()
        self._in_flight = 0
        self._stopping = False

    def fill(self, claim: Claim, most: int | None = None) -> int:
        """Claim and start attempts while there is room (at most ``most``);
        returns how many were started. Call from one thread at a time."""
        started = 0
        while most is None or started < most:
            with self._changed:
                if self._in_flight >= self.max_in_flight or self._stopping:
                    break
                bound = self.max_in_flight_per_endpoint
                full = [e for e, n in self._per_endpoint.items() if n >= bound]
            job = claim(full)
            if job is None:
                break
            with self._changed:
                self._in_flight += 1
                self._per_endpoint[job.endpoint.id] += 1
            self._pool.submit(self._run, job)
            started += 1
        return started

    def drain(self, claim: Claim, most: int) -> Counter[str]:
        """Deliver what ``claim`` finds, at most ``most`` claims, and wait for
        every attempt; returns the statuses of this run's attempts."""
        before = Counter(self.tally)
        claimed = 0
        while True:
            started = self.fill(claim, most - claimed)
            claimed += started
            with self._changed:
                if self._in_flight == 0 and (started == 0 or claimed >= most):
                    break
                if self._in_flight:
                    self._changed.wait()  # an attempt ended: its endpoint has room
        with self._changed:
            return self.tally - before

    def serve(self, claim: Claim, stop: threading.Event, poll_seconds: float) -> None:
        """Claim whenever there is room, until ``stop`` is set: again at once
        when an attempt ends, else every ``poll_seconds``. A failing claim (the
        database away) is one warning line, and is tried again after
        ``poll_seconds``, doubled for each failure in a row (at most
        `MAX_CLAIM_BACKOFF_SECONDS`)."""
        failures = 0
        while not stop.is_set():
            try:
                self.fill(claim)
            except Exception as exc:
                failures += 1
                wait = backoff_seconds(failures, poll_seconds, MAX_CLAIM_BACKOFF_SECONDS)
                log_failure("claiming webhook deliveries failed", exc, wait)
                stop.wait(wait)
                continue
            if failures:
                log.info("claiming webhook deliveries works again")
                failures = 0
            with self._changed:
                if not stop.is_set():
                    self._changed.wait(poll_seconds)

    def close(self, *, wait: bool = True) -> None:
        """Claim nothing more; with ``wait``, let running attempts finish and record."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._pool.shutdown(wait=wait)

    def _run(self, job: DeliveryJob) -> None:
        status = CRASHED
        try:
            status = self._attempt(job)
        except Exception as exc:  # its lease expires: it is claimed again
            log_failure(f"webhook delivery {job.delivery_id}: the attempt failed", exc)
        finally:
            with self._changed:
                self._in_flight -= 1
                self._per_endpoint[job.endpoint.id] -= 1
                if self._per_endpoint[job.endpoint.id] <= 0:
                    del self._per_endpoint[job.endpoint.id]
                self.tally[status] += 1
                self._changed.notify_all()
