"""Producers: emit usage events to the queue without waiting on the database.

`UsageProducer.emit` validates at once (bad input, or a limit its database
does not define, raises and nothing is queued),
returns the event id, and buffers the event. Buffers are sent as one message
per batch when they reach ``batch_size`` events or are ``flush_interval_seconds``
old, on `flush`, and when the process exits. A broker that does not
answer is retried with backoff; then `BrokerUnavailable` is raised and the
events stay in the buffer, sent by the producer's thread once the broker
answers: nothing is dropped silently.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from celery import Celery
from celery.signals import after_task_publish, before_task_publish

from metering.clock import Clock, system_clock
from metering.domain.bounds import validate_seconds
from metering.domain.events import FUTURE_TOLERANCE_US, charges_of, make_event
from metering.domain.instants import to_us
from metering.errors import BrokerUnavailable, InvalidInput, OccurredAtOutOfRange, UnknownLimit
from metering.limits.names import LimitNames
from metering.pipeline.messages import args_repr, batch_body, event_text, task_headers
from metering.pipeline.routing import APPLY_BATCH_TASK, queue_for
from metering.pipeline.transport import is_embedded_broker, use_embedded_transport
from metering.settings import broker_url, producer_database_url, queue_count

log = logging.getLogger(__name__)

DEFAULT_MAX_BUFFER: Final = 100_000
# A buffered event: its id, and its JSON text as a message holds it.
Item = tuple[str, str]


def make_celery(url: str, name: str = "metering-producer") -> Celery:
    """A Celery app that only publishes; it never becomes the current app."""
    app = Celery(name, broker=url, set_as_current=False)
    if is_embedded_broker(url):
        use_embedded_transport()
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        broker_connection_timeout=5,
        broker_connection_retry_on_startup=True,
        # The producer retries with its own backoff and then raises
        # BrokerUnavailable; kombu's own connection retries would hide that.
        broker_transport_options={"max_retries": 0},
    )
    return app


class UsageProducer:
    """Buffers usage events and sends them to the workers in batches.

    >>> producer = UsageProducer()            # METERING_BROKER_URL, else embedded
    >>> event_id = producer.emit("org-42", "api_calls", cost=3)
    >>> producer.flush()

    ``queues`` > 1 routes events by a hash of their (first) subject to
    ``metering.0`` … ``metering.N-1`` (`metering.pipeline.routing`); run one consumer
    per queue to apply each subject's events in the order they were emitted.
    Without ``queues``, ``METERING_QUEUES`` (default 1), as the workers read it.

    A producer that can see the limits refuses a charge to an undefined one
    (`UnknownLimit`, nothing queued): its database is ``database_url``, else
    ``METERING_DATABASE_URL``, else, on the embedded default broker, the
    default database. With a broker only, events are queued unchecked.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        batch_size: int = 500,
        flush_interval_seconds: float = 0.25,
        queues: int | None = None,
        retry_attempts: int = 5,
        retry_backoff_seconds: float = 0.2,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        clock: Clock | None = None,
        database_url: str | None = None,
    ) -> None:
        if queues is None:
            queues = queue_count()
        if batch_size < 1 or queues < 1 or retry_attempts < 1:
            raise InvalidInput("producer", "batch_size, queues and retry_attempts must be >= 1")
        validate_seconds("retry_backoff_seconds", retry_backoff_seconds, 3600)
        if validate_seconds("flush_interval_seconds", flush_interval_seconds, 3600) == 0:
            raise InvalidInput("flush_interval_seconds", "must be more than 0 seconds")
        self.url = broker_url(url)
        self.batch_size = batch_size
        self.flush_interval_seconds = flush_interval_seconds
        self.queues = queues
        self.retry_attempts = retry_attempts
        self.retry_backoff_seconds = retry_backoff_seconds
        self.max_buffer = max_buffer
        self.clock: Clock = clock or system_clock
        found = producer_database_url(database_url, self.url)
        self._limit_names = None if found is None else LimitNames(found)
        self._app = make_celery(self.url)
        self._origin = f"gen{os.getpid()}@{socket.gethostname()}"
        self._reply_to = str(uuid.uuid4())
        self._buffers: dict[str, list[Item]] = {}
        self._oldest: dict[str, float] = {}
        self._lock = threading.RLock()
        self._closed = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        atexit.register(self._flush_at_exit)

    # -- emitting --------------------------------------------------------------

    def emit(
        self,
        subject: str | None = None,
        limit: str | None = None,
        cost: int = 1,
        *,
        charges: Sequence[Any] | None = None,
        event_id: str | None = None,
        occurred_at: datetime | None = None,
        metadata: Any = None,
    ) -> str:
        """Validate and queue one usage event; returns its id (generated if not given)."""
        charges = charges_of(subject, limit, cost, charges)
        now = self.clock()
        event = make_event(charges, now if occurred_at is None else occurred_at, event_id, metadata)
        if event.occurred_at_us > to_us(now) + FUTURE_TOLERANCE_US:
            raise OccurredAtOutOfRange(event.occurred_at, "is more than 5 minutes in the future")
        if self._limit_names is not None:
            unknown = self._limit_names.unknown(charge.limit for charge in event.charges)
            if unknown:
                raise UnknownLimit(unknown[0])
        try:
            self._add(
                queue_for(event.charges[0].subject, self.queues),
                (event.event_id, event_text(event)),
            )
        except BrokerUnavailable as exc:
            # Name this call's event, and say whether it is among the kept ones.
            accepted = event.event_id in exc.kept
            raise BrokerUnavailable(
                exc.reason, exc.kept, event_id=event.event_id, accepted=accepted
            ) from exc.__cause__
        return event.event_id

    def _add(self, queue: str, item: Item) -> None:
        self._after_fork_check()
        with self._lock:
            full = self._buffer(queue, item, self.pending)
        if full:
            try:
                self._flush_queue(queue)
            except BrokerUnavailable:
                self._ensure_thread()  # which sends what was kept once the broker is back
                raise
        else:
            self._ensure_thread()

    def _buffer(self, queue: str, item: Item, pending: int) -> bool:
        """Buffer ``item`` for ``queue``, the lock held and ``pending`` events
        buffered already; whether that queue's buffer is now a full batch.
        `BrokerUnavailable` when the producer is closed or its buffer full."""
        if self._closed:
            raise BrokerUnavailable("the producer is closed", self.kept)
        if pending >= self.max_buffer:
            raise BrokerUnavailable("the buffer is full: the broker is not keeping up", self.kept)
        buffer = self._buffers.setdefault(queue, [])
        if not buffer:
            self._oldest[queue] = time.monotonic()
        buffer.append(item)
        return len(buffer) >= self.batch_size

    @property
    def pending(self) -> int:
        """Events accepted but not yet handed to the broker."""
        with self._lock:
            return sum(len(b) for b in self._buffers.values())

    @property
    def kept(self) -> list[str]:
        """Ids of the events accepted but not yet handed to the broker."""
        with self._lock:
            return [event_id for buffer in self._buffers.values() for event_id, _ in buffer]

    def discard(self) -> list[str]:
        """Drop every event not yet sent (they will never be); returns their ids."""
        with self._lock:
            dropped = self.kept
            self._buffers.clear()
            self._oldest.clear()
        return dropped

    # -- sending ----------------------------------------------------------------

    def flush(self) -> None:
        """Send every buffered event now; raises `BrokerUnavailable` if the broker is down."""
        with self._lock:
            queues = [q for q, b in self._buffers.items() if b]
        for queue in queues:
            self._flush_queue(queue)

    def _flush_queue(self, queue: str) -> None:
        with self._lock:
            batch = self._buffers.get(queue, [])[: self.batch_size]
            if not batch:
                return
            self._send(queue, batch)  # raises BrokerUnavailable, keeping the batch
            del self._buffers[queue][: len(batch)]
            if self._buffers[queue]:
                self._oldest[queue] = time.monotonic()
                more = True
            else:
                more = False
        if more:
            self._flush_queue(queue)

    def _send(self, queue: str, batch: Sequence[Item]) -> None:
        """One message of ``batch``, with the producer's retries; `BrokerUnavailable`
        (naming every kept event) when the broker does not take it."""
        body = batch_body([text for _, text in batch])
        delay = self.retry_backoff_seconds
        for attempt in range(self.retry_attempts):
            try:
                self._publish(queue, body, len(batch))
                return
            except Exception as exc:  # kombu and redis raise many kinds
                if attempt == self.retry_attempts - 1:
                    raise BrokerUnavailable(
                        f"broker unavailable at {_safe(self.url)}: {exc}", self.kept
                    ) from exc
                log.warning("broker unavailable (%s); retrying in %.1f s", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _publish(self, queue: str, body: str, count: int) -> None:
        """Publish one ``metering.apply_batch`` message on ``queue`` whose body
        (`batch_body`) is JSON text already: the message Celery's ``send_task``
        would send (`task_headers`), through the producer pool of the Celery
        app, without Celery encoding the events again. Returns once the
        broker has it (Redis: its LPUSH answered). Safe from several threads."""
        task_id = str(uuid.uuid4())
        # When it was sent (each attempt): the age `metering status` reports.
        sent_at = to_us(self.clock(), field_name="clock")
        headers = task_headers(task_id, count, self._origin, sent_at)
        properties = {"correlation_id": task_id, "reply_to": self._reply_to}
        amqp = self._app.amqp
        declare = [amqp.queues[queue]]  # declared once per connection (kombu's cache)
        traced = bool(before_task_publish.receivers)
        if traced:  # tracing injects its context into the headers
            before_task_publish.send(
                sender=APPLY_BATCH_TASK,
                body=body,
                exchange="",
                routing_key=queue,
                declare=declare,
                headers=headers,
                properties=properties,
                retry_policy=None,
            )
        with self._app.producer_pool.acquire(block=True) as producer:
            producer.publish(
                body,
                exchange="",
                routing_key=queue,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                declare=declare,
                retry=False,
                headers=headers,
                argsrepr=args_repr(count),
                kwargsrepr="{}",
                **properties,
            )
        if traced:
            after_task_publish.send(
                sender=APPLY_BATCH_TASK, body=body, headers=headers, exchange="", routing_key=queue
            )

    # -- background flushing and shutdown -----------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="metering-producer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_interval_seconds / 2)
            now = time.monotonic()
            with self._lock:
                due = [
                    q
                    for q, b in self._buffers.items()
                    if b and now - self._oldest.get(q, now) >= self.flush_interval_seconds
                ]
            for queue in due:
                try:
                    self._flush_queue(queue)
                except BrokerUnavailable as exc:
                    log.warning("%s", exc)

    def close(self) -> None:
        """Flush and stop; raises `BrokerUnavailable` if events could not be sent."""
        self.flush()
        self._closed = True
        self._wake.set()
        self._app.close()
        if self._limit_names is not None:
            self._limit_names.close()

    def _flush_at_exit(self) -> None:
        if self._closed or os.getpid() != self._pid:
            return
        try:
            self.close()
        except BrokerUnavailable as exc:
            log.error(
                "metering: the process exits and these events were not sent: %s (%s)",
                ", ".join(exc.kept),
                exc.reason,
            )

    def _after_fork_check(self) -> None:
        # A forked child must not send the parent's buffered events again.
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._lock = threading.RLock()
            self._buffers, self._oldest, self._thread = {}, {}, None
            self._app = make_celery(self.url)
            self._origin = f"gen{os.getpid()}@{socket.gethostname()}"

    def __enter__(self) -> UsageProducer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _safe(url: str) -> str:
    """A URL without its password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


_default: UsageProducer | None = None
_default_lock = threading.Lock()


def emit(
    subject: str | None = None,
    limit: str | None = None,
    cost: int = 1,
    **kwargs: Any,
) -> str:
    """Emit through a process-wide `UsageProducer` (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = UsageProducer()
    return _default.emit(subject, limit, cost, **kwargs)
