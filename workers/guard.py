# mypy: disallow-untyped-calls=False
"""Nothing that arrives on a queue vanishes: what cannot be run is dead-lettered.

Two places can meet input that is not a task this worker can run:

* The Redis transport pops an entry and parses it as a kombu envelope. An
  entry that is not JSON, or JSON of another shape (``[]``, a bare string,
  an object without ``properties``), makes kombu raise inside the worker's
  event loop, and the worker exits. `GuardedRedisTransport` checks each entry
  before kombu sees it.
* Celery decodes a well-formed envelope. A body it cannot decode, a content
  type it does not accept (pickle) or a task name it does not know are
  logged and dropped. `GuardedConsumer` keeps them first.

Either way the entry goes to ``rejected_messages``, the dead-letter record,
with the reason, the time and the raw text (bytes that are not UTF-8 as
backslash escapes), and the worker goes on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from queue import Empty
from typing import Any

from celery.worker.consumer import Consumer
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from metering.domain.events import Rejected
from metering.errors import StorageError

log = logging.getLogger(__name__)

# How long the worker keeps trying to store a dead letter while the database
# is unreachable, before it logs the entry in full and goes on.
STORE_ATTEMPTS = 6


def _store(reason: str, raw: str) -> None:
    from workers.tasks import meter  # the tasks module imports the app

    for attempt in range(STORE_ATTEMPTS):
        try:
            meter().apply_records([], rejected=[Rejected(None, reason, raw)])
            log.error("dead-lettered a queue entry: %s", reason)
            return
        except StorageError as exc:
            if attempt == STORE_ATTEMPTS - 1:
                log.critical(
                    "could not keep a dead letter (%s): %s; the entry was: %s", exc, reason, raw
                )
                return
            time.sleep(min(8.0, 0.25 * 2**attempt))


def dead_letter(reason: str, raw: bytes | str) -> None:
    """Keep ``raw`` in the dead-letter record with ``reason``; never raises."""
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    try:
        _store(reason, text[:65_536])
    except Exception:  # the guard must not stop the worker it guards
        log.exception("could not keep a dead letter: %s", reason)


def _envelope_fault(payload: object) -> str | None:
    """Why ``payload`` is not a kombu envelope, or None when it is one."""
    if not isinstance(payload, dict):
        return f"a queue entry must be a JSON object, got {type(payload).__name__}"
    properties = payload.get("properties")
    if not isinstance(properties, dict):
        return "a queue entry has no 'properties' object"
    if "delivery_tag" not in properties:
        return "a queue entry has no delivery tag"
    if not isinstance(properties.get("delivery_info", {}), dict):
        return "a queue entry's 'delivery_info' is not an object"
    return None


class GuardedChannel(kombu_redis.Channel):
    """kombu's Redis channel that dead-letters entries it cannot deliver."""

    def _checked(self, item: bytes | str) -> dict[str, Any] | None:
        try:
            payload = loads(item)
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            dead_letter(f"queue entry is not JSON: {exc}", item)
            return None
        fault = _envelope_fault(payload)
        if fault is None:
            try:
                self.Message(payload, channel=self)  # decodes the body as delivery will
            except Exception as exc:
                fault = f"queue entry cannot be read as a message: {exc!r}"
        if fault is not None:
            dead_letter(fault, item)
            return None
        result: dict[str, Any] = payload
        return result

    def _brpop_read(self, **options: Any) -> bool:
        # kombu's own method, with `_checked` between the pop and the delivery.
        try:
            try:
                popped = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            if not popped:
                raise Empty()
            dest, item = popped
            dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            payload = self._checked(item)
            if payload is not None:
                self.connection._deliver(payload, dest)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        with self.conn_or_acquire() as client:
            for priority in self.priority_steps:
                item = client.rpop(self._q_for_pri(queue, priority))
                if item:
                    self._maybe_update_queues_expire(client, queue)
                    payload = self._checked(item)
                    if payload is not None:
                        return payload
            self._maybe_update_queues_expire(client, queue)
            raise Empty()


class GuardedRedisTransport(kombu_redis.Transport):
    Channel = GuardedChannel


def _message_raw(message: Any) -> str:
    """A consumed message as JSON text: headers, content type and raw body."""
    body = message.body
    record = {
        "headers": message.headers,
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        "delivery_info": message.delivery_info,
        "body": body.decode("utf-8", "backslashreplace") if isinstance(body, bytes) else body,
    }
    return json.dumps(record, default=repr)


class GuardedConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer; what it would drop with a log line is dead-lettered first."""

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        dead_letter(f"message body cannot be decoded: {exc!r}", _message_raw(message))
        super().on_decode_error(message, exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        dead_letter("message is not a task", _message_raw(message))
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        dead_letter(f"no such task: {exc!r}", _message_raw(message))
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        dead_letter(f"task message refused: {exc!r}", _message_raw(message))
        super().on_invalid_task(body, message, exc)

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], None]:
        handler = super().create_task_handler(*args, **kwargs)

        def on_task_received(message: Any) -> None:
            # Celery catches only the errors it expects; anything else raised
            # while reading a message (a body of the wrong type, say) would
            # stop the worker, and the message would come back to stop the next.
            try:
                handler(message)
            except Exception as exc:
                dead_letter(f"message cannot be read as a task: {exc!r}", _message_raw(message))
                if not message.acknowledged:
                    message.ack()

        return on_task_received
