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

The channel also closes a window in which kombu loses messages. kombu takes
a message with ``BRPOP`` and records it as unacknowledged (the hash that
brings a dead worker's messages back after the visibility timeout) only
once it has read the reply. A worker killed in between, which under load
is any moment a reply waits in its socket, loses the message: it is in no
queue and in no hash. `GuardedChannel` takes messages with a Lua script
that pops an entry and records it as unacknowledged in one atomic step;
when every queue is empty it waits for one with ``BLMOVE key key`` (which
leaves the list as it was) and then pops again.

And it survives a broker restart. When Redis goes away, Celery collects the
connection (kombu's ``Connection.collect``): it closes the channels, one by
one, and then detaches the transport from the connection
(``transport.client = None``) even when a close failed half-way, which it
does when a pop was in flight or another channel failed first. Celery then
closes the connection again; the channel still open gives back the
messages it holds, and kombu builds a new Redis pool for that from
``transport.client``: ``AttributeError: 'NoneType' object has no attribute
'hostname'``, which is no connection error, so the worker stopped
("Unrecoverable error"). `GuardedChannel` answers a detached channel's
every Redis call with a connection error instead, which both closes
ignore, and `HeldQoS` acknowledges on it in memory only, with a warning:
the messages it held stay in the unacked hash and come back after the
visibility timeout (applying ignores the repeat).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from queue import Empty
from typing import Any

import kombu.transport.redis
import redis.exceptions
from celery.worker.consumer import Consumer
from kombu.transport import virtual
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


# Pop the first entry of KEYS[1..n] and, when it is a kombu envelope, record
# it as unacknowledged exactly as kombu's QoS.append does (the hash holds
# ``[envelope, exchange, routing key]``, the index the time), in the same
# atomic step. KEYS[n+1] is the unacked hash, KEYS[n+2] its index; ARGV[1]
# the time. Returns {key, entry} or nil when every list is empty.
POP_AND_HOLD = """
local n = #KEYS - 2
for i = 1, n do
  local entry = redis.call('RPOP', KEYS[i])
  if entry then
    local ok, envelope = pcall(cjson.decode, entry)
    if ok and type(envelope) == 'table' and type(envelope.properties) == 'table' then
      local tag = envelope.properties.delivery_tag
      local info = envelope.properties.delivery_info
      if type(tag) == 'string' and type(info) == 'table' then
        local held = '[' .. entry .. ',' .. cjson.encode(info.exchange or '') .. ','
          .. cjson.encode(info.routing_key or '') .. ']'
        redis.call('ZADD', KEYS[n + 2], ARGV[1], tag)
        redis.call('HSET', KEYS[n + 1], tag, held)
      end
    end
    return {KEYS[i], entry}
  end
end
return nil
"""

# While several lists are empty the channel waits on one at a time, this
# long, so an entry on another is seen within about this time.
WAIT_EACH_SECONDS = 0.1


def _delivery_tag(item: bytes | str) -> str | None:
    try:
        tag = loads(item)["properties"]["delivery_tag"]
    except Exception:
        return None
    return tag if isinstance(tag, str) else None


class HeldQoS(kombu.transport.redis.QoS):
    """kombu's Redis QoS for messages `POP_AND_HOLD` already holds in Redis:
    delivering one only notes it in memory, instead of writing the whole
    message to the unacked hash a second time."""

    def append(self, message: Any, delivery_tag: str) -> None:
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if _detached(self.channel):
            _left_held(delivery_tag)
            virtual.QoS.ack(self, delivery_tag)
            return
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if _detached(self.channel):
            _left_held(delivery_tag)
            virtual.QoS.ack(self, delivery_tag)
            return
        super().reject(delivery_tag, requeue=requeue)


def _detached(channel: Any) -> bool:
    """Whether ``channel``'s connection was closed (collected after a broker restart)."""
    return channel.connection is None or channel.connection.client is None


def _left_held(delivery_tag: str) -> None:
    # A message that finished after the connection it came on was lost stays
    # held in Redis: it comes back after the visibility timeout, and applying
    # it again changes nothing. (kombu would log this with a traceback.)
    log.warning(
        "message %s finished after its broker connection was lost: "
        "it is delivered again after the visibility timeout",
        delivery_tag,
    )


class GuardedChannel(kombu.transport.redis.Channel):
    """kombu's Redis channel that dead-letters entries it cannot deliver, and
    holds each message it takes as unacknowledged from the moment it is taken."""

    QoS = HeldQoS
    _waiting: bool = False
    _wait_turn: int = 0

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

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        # A channel left open when its connection was collected: no Redis
        # behind it any more (see the module's documentation).
        if _detached(self):
            raise redis.exceptions.ConnectionError("the connection to the broker is closed")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)
        return params

    def _forget(self, item: bytes | str) -> None:
        """Drop a dead-lettered entry from the unacked hash, where the pop put it."""
        tag = _delivery_tag(item)
        if tag is not None:
            self.qos._remove_from_indices(tag).execute()

    def _keys(self) -> list[str]:
        queues = self._queue_cycle.consume(len(self.active_queues))
        return [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]

    def _prefixed(self, key: str) -> str:
        return f"{self.global_keyprefix}{key}" if self.global_keyprefix else key

    def _brpop_start(self, timeout: float | None = None) -> None:
        # Called by kombu's poller whenever this channel may take a message.
        if timeout is None:
            timeout = self.brpop_timeout
        keys = self._keys()
        if not keys:
            return
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]
        if self._waiting:
            # Every list was empty: block until one has an entry, on one list
            # at a time when there are several, without taking the entry.
            key = keys[self._wait_turn % len(keys)]
            self._wait_turn += 1
            wait = (
                timeout if len(keys) == 1 else min(timeout or WAIT_EACH_SECONDS, WAIT_EACH_SECONDS)
            )
            key = self._prefixed(key)
            self.client.connection.send_command("BLMOVE", key, key, "RIGHT", "RIGHT", wait or 0)
            return
        held = [self._prefixed(k) for k in (self.unacked_key, self.unacked_index_key)]
        self.client.connection.send_command(
            "EVAL",
            POP_AND_HOLD,
            len(keys) + 2,
            *(self._prefixed(k) for k in keys),
            *held,
            repr(time.time()),
        )

    def _brpop_read(self, **options: Any) -> bool:
        # kombu's own method, reading our pop (or wait), with `_checked`
        # between the pop and the delivery.
        waited = self._waiting
        try:
            try:
                reply = self.client.parse_response(
                    self.client.connection, "BLMOVE" if waited else "EVAL", **options
                )
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            if waited:
                # An entry has arrived (or the wait timed out): pop next time.
                self._waiting = False
                raise Empty()
            if not reply:
                self._waiting = True
                raise Empty()
            dest, item = reply
            dest = bytes_to_str(dest)
            if self.global_keyprefix and dest.startswith(self.global_keyprefix):
                dest = dest[len(self.global_keyprefix) :]
            dest = dest.rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            payload = self._checked(item)
            if payload is not None:
                self.connection._deliver(payload, dest)
            else:
                self._forget(item)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        # The polling path (no event loop), with the same atomic pop.
        keys = [self._q_for_pri(queue, priority) for priority in self.priority_steps]
        held = [self.unacked_key, self.unacked_index_key]
        with self.conn_or_acquire() as client:
            while True:
                reply = client.execute_command(
                    "EVAL",
                    POP_AND_HOLD,
                    len(keys) + 2,
                    *(self._prefixed(k) for k in [*keys, *held]),
                    repr(time.time()),
                )
                if not reply:
                    self._maybe_update_queues_expire(client, queue)
                    raise Empty()
                item = reply[1]
                self._maybe_update_queues_expire(client, queue)
                payload = self._checked(item)
                if payload is not None:
                    return payload
                self._forget(item)


class GuardedRedisTransport(kombu.transport.redis.Transport):
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
