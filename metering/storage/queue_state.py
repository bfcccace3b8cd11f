"""What the broker holds: queue depths, the oldest queued event, which events are queued.

Read only: nothing here changes the broker or creates a broker file. On Redis, as kombu
lays it out, a queue is a list per priority (``metering``, ``metering\\x06\\x163`` ...),
pushed on the left and taken from the right; a taken, unacknowledged message sits in the
`REDIS_UNACKED_KEY` hash as ``[envelope, exchange, routing key]``. On the embedded broker
(`metering.storage.broker`) a queue is rows of ``kombu_message``, a taken one invisible till
settled or given back. Every message is a kombu envelope: headers (Celery's ``task``;
`SENT_AT_HEADER` from `metering.pipeline.routing`) and a body holding ``[args, kwargs,
embed]``, whose first argument is a batch (`metering.pipeline.messages`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from sqlalchemy import (
    Engine,
    create_engine,
    func,
    inspect,
    select,
)
from sqlalchemy.exc import SQLAlchemyError

from metering.errors import BrokerUnavailable, ConfigurationError
from metering.pipeline.routing import APPLY_BATCH_TASK, DEFAULT_QUEUE, SENT_AT_HEADER
from metering.storage.kombu_tables import kombu_messages, kombu_queues, task_body

if TYPE_CHECKING:
    import redis

# kombu's Redis layout (kombu.transport.redis.Channel).
REDIS_PRIORITY_SEPARATOR: Final = "\x06\x16"
REDIS_PRIORITY_STEPS: Final = (0, 3, 6, 9)
REDIS_UNACKED_KEY: Final = "unacked"
# How many messages at the taking end of each queue are read to find the
# oldest event (the end may hold beat's sweeps, which carry no events).
OLDEST_SAMPLE: Final = 100
SCAN_CHUNK: Final = 1000
# The queues metering declares: the default one and the hash-routed ones.
METERING_QUEUE: Final = re.compile(rf"{re.escape(DEFAULT_QUEUE)}(\.[0-9]+)?")


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """``waiting``: ready for a worker; ``unacked``: taken by a worker, not acknowledged."""

    queue: str
    waiting: int
    unacked: int


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """One message on a queue, as far as it could be read.

    ``event_ids`` is empty for tasks that are not batches (beat's sweeps) and
    for bodies that cannot be read; ``sent_at_us`` is None for messages that
    carry no `SENT_AT_HEADER` (sent before it existed, or not by a producer).
    """

    queue: str
    task: str | None
    event_ids: tuple[str, ...]
    sent_at_us: int | None
    unacked: bool


@dataclass(frozen=True, slots=True)
class Oldest:
    """The oldest queued message with an event not yet decided (None: none found),
    and how many such messages carried no send time."""

    message: QueuedMessage | None
    undated: int


def _batch_ids(body: Any) -> tuple[str, ...]:
    try:
        events = body[0][0]["events"]
        return tuple(str(event["id"]) for event in events)
    except (KeyError, IndexError, TypeError):
        return ()


def read_envelope(text: str | bytes, queue: str, *, unacked: bool) -> QueuedMessage | None:
    """A kombu envelope (JSON text) as a `QueuedMessage`; None when it is not one."""
    try:
        envelope = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    return message_of(envelope, queue, unacked=unacked)


def message_of(envelope: object, queue: str, *, unacked: bool) -> QueuedMessage | None:
    """A decoded kombu envelope as a `QueuedMessage`; None when it is not one."""
    if not isinstance(envelope, dict):
        return None
    headers = envelope.get("headers")
    headers = headers if isinstance(headers, dict) else {}
    task = headers.get("task")
    task = task if isinstance(task, str) else None
    sent_at = headers.get(SENT_AT_HEADER)
    sent_at_us = sent_at if isinstance(sent_at, int) and not isinstance(sent_at, bool) else None
    event_ids: tuple[str, ...] = ()
    if task == APPLY_BATCH_TASK:
        try:
            event_ids = _batch_ids(task_body(envelope))
        except (KeyError, ValueError, TypeError):
            event_ids = ()
    return QueuedMessage(queue, task, event_ids, sent_at_us, unacked)


class BrokerQueues(Protocol):
    """What a broker holds, read only. ``close()`` when done."""

    kind: str

    def present_queues(self) -> list[str]:
        """The metering queues the broker has (declared, or holding messages)."""

    def depths(self, queues: Sequence[str]) -> list[QueueDepth]:
        """Messages waiting and unacknowledged, per queue, in the given order."""

    def oldest_candidates(self, queues: Sequence[str]) -> list[QueuedMessage]:
        """The messages among which the oldest is: the taking end of each
        queue (`OLDEST_SAMPLE` of them) and every unacknowledged one."""

    def messages(self, queues: Sequence[str]) -> Iterator[QueuedMessage]:
        """Every message of ``queues``, waiting and unacknowledged."""

    def close(self) -> None: ...


# -- Redis -----------------------------------------------------------------------------


class RedisQueues:
    """The queues of a Redis broker."""

    kind = "redis"

    def __init__(self, url: str, *, timeout_seconds: float) -> None:
        import redis  # here: `metering serve` on the embedded broker never loads it

        self.client: redis.Redis = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_seconds, socket_timeout=timeout_seconds
        )
        try:
            self.client.ping()
        except (redis.RedisError, OSError) as exc:
            self.client.close()
            raise BrokerUnavailable(f"broker unreachable: {exc}") from exc

    @staticmethod
    def _keys(queue: str) -> list[str]:
        return [
            queue if step == 0 else f"{queue}{REDIS_PRIORITY_SEPARATOR}{step}"
            for step in REDIS_PRIORITY_STEPS
        ]

    def _unacked(self) -> Iterator[QueuedMessage]:
        for _tag, value in self.client.hscan_iter(REDIS_UNACKED_KEY, count=SCAN_CHUNK):
            try:
                envelope, _exchange, routing_key = json.loads(value)
            except (ValueError, TypeError, UnicodeDecodeError):
                continue
            message = message_of(envelope, str(routing_key), unacked=True)
            if message is not None:
                yield message

    def present_queues(self) -> list[str]:
        # Redis deletes an empty list: a queue with messages only in the
        # unacked hash is found there.
        found = {message.queue for message in self._unacked()}
        for key in self.client.scan_iter(match=f"{DEFAULT_QUEUE}*", count=SCAN_CHUNK):
            found.add(key.decode("utf-8", "replace").split(REDIS_PRIORITY_SEPARATOR)[0])
        return sorted(name for name in found if METERING_QUEUE.fullmatch(name))

    def depths(self, queues: Sequence[str]) -> list[QueueDepth]:
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            for key in self._keys(queue):
                pipe.llen(key)
        lengths = iter(pipe.execute())
        waiting = {queue: sum(next(lengths) for _ in REDIS_PRIORITY_STEPS) for queue in queues}
        unacked = dict.fromkeys(queues, 0)
        for message in self._unacked():
            if message.queue in unacked:
                unacked[message.queue] += 1
        return [QueueDepth(q, waiting[q], unacked[q]) for q in queues]

    def oldest_candidates(self, queues: Sequence[str]) -> list[QueuedMessage]:
        found = []
        for queue in queues:
            for key in self._keys(queue):
                for item in self.client.lrange(key, -OLDEST_SAMPLE, -1):
                    message = read_envelope(item, queue, unacked=False)
                    if message is not None:
                        found.append(message)
        wanted = set(queues)
        return found + [m for m in self._unacked() if m.queue in wanted]

    def messages(self, queues: Sequence[str]) -> Iterator[QueuedMessage]:
        for queue in queues:
            for key in self._keys(queue):
                start = 0
                while chunk := self.client.lrange(key, start, start + SCAN_CHUNK - 1):
                    for item in chunk:
                        message = read_envelope(item, queue, unacked=False)
                        if message is not None:
                            yield message
                    start += len(chunk)
        wanted = set(queues)
        yield from (m for m in self._unacked() if m.queue in wanted)

    def close(self) -> None:
        self.client.close()


# -- the embedded broker -------------------------------------------------------------


class EmbeddedQueues:
    """The queues of the embedded broker's SQLite file (none while it does not exist)."""

    kind = "embedded"

    def __init__(self, url: str) -> None:
        database_url = url.split("+", 1)[1]
        path = database_url.removeprefix("sqlite:///")
        self.file = Path(path)
        self.engine: Engine | None = None
        if not self.file.exists():
            if not self.file.parent.is_dir():
                raise BrokerUnavailable(
                    f"broker unreachable: the directory of {self.file} does not exist"
                )
            return
        # A plain engine: reads take no write lock (metering's engines begin IMMEDIATE).
        self.engine = create_engine(database_url)
        try:
            with self.engine.connect() as connection:
                tables = inspect(connection)
                ready = tables.has_table("kombu_message") and tables.has_table("kombu_queue")
        except SQLAlchemyError as exc:
            self.close()
            raise BrokerUnavailable(f"broker unreachable: {exc}") from exc
        if not ready:  # a file kombu has not set up yet holds no message
            self.close()

    def _rows(self, query: Any) -> list[Any]:
        if self.engine is None:
            return []
        try:
            with self.engine.connect() as connection:
                return list(connection.execute(query))
        except SQLAlchemyError as exc:
            raise BrokerUnavailable(f"broker unreachable: {exc}") from exc

    def present_queues(self) -> list[str]:
        names = self._rows(select(kombu_queues.c.name))
        return sorted(row.name for row in names if METERING_QUEUE.fullmatch(row.name or ""))

    def _of(self, queues: Sequence[str]) -> Any:
        joined = kombu_messages.join(kombu_queues)
        return joined, kombu_queues.c.name.in_(list(queues))

    def depths(self, queues: Sequence[str]) -> list[QueueDepth]:
        joined, where = self._of(queues)
        query = (
            select(kombu_queues.c.name, kombu_messages.c.visible, func.count())
            .select_from(joined)
            .where(where)
            .group_by(kombu_queues.c.name, kombu_messages.c.visible)
        )
        counts: dict[tuple[str, bool], int] = {}
        for name, visible, count in self._rows(query):
            counts[(name, bool(visible))] = int(count)
        return [QueueDepth(q, counts.get((q, True), 0), counts.get((q, False), 0)) for q in queues]

    def _read(self, rows: Iterable[Any]) -> Iterator[QueuedMessage]:
        for row in rows:
            message = read_envelope(row.payload, row.name, unacked=not row.visible)
            if message is not None:
                yield message

    def oldest_candidates(self, queues: Sequence[str]) -> list[QueuedMessage]:
        columns = (kombu_queues.c.name, kombu_messages.c.visible, kombu_messages.c.payload)
        joined, _ = self._of(queues)
        found: list[QueuedMessage] = []
        for queue in queues:
            # Put back or not, a message keeps its id: the lowest ids are the oldest.
            first = (
                select(*columns)
                .select_from(joined)
                .where(kombu_queues.c.name == queue, kombu_messages.c.visible.is_(True))
                .order_by(kombu_messages.c.id)
                .limit(OLDEST_SAMPLE)
            )
            found += self._read(self._rows(first))
        _, where = self._of(queues)
        taken = (
            select(*columns).select_from(joined).where(where, kombu_messages.c.visible.is_(False))
        )
        return found + list(self._read(self._rows(taken)))

    def messages(self, queues: Sequence[str]) -> Iterator[QueuedMessage]:
        columns = (
            kombu_messages.c.id,
            kombu_queues.c.name,
            kombu_messages.c.visible,
            kombu_messages.c.payload,
        )
        joined, where = self._of(queues)
        after = 0
        while rows := self._rows(
            select(*columns)
            .select_from(joined)
            .where(where, kombu_messages.c.id > after)
            .order_by(kombu_messages.c.id)
            .limit(SCAN_CHUNK)
        ):
            yield from self._read(rows)
            after = rows[-1].id

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()
            self.engine = None


# -- what callers use ------------------------------------------------------------------


def broker_kind(url: str) -> str:
    """``redis``, ``embedded`` (kombu's SQL transport on SQLite) or the URL's scheme."""
    scheme = url.split(":", 1)[0]
    if scheme in {"redis", "rediss"}:
        return "redis"
    if scheme in {"sqla+sqlite", "sqlalchemy+sqlite"}:
        return "embedded"
    return scheme


def open_queues(url: str, *, timeout_seconds: float = 5.0) -> BrokerQueues:
    """The queues of the broker at ``url``; `BrokerUnavailable` when it does not answer."""
    kind = broker_kind(url)
    if kind == "redis":
        return RedisQueues(url, timeout_seconds=timeout_seconds)
    if kind == "embedded":
        return EmbeddedQueues(url)
    raise ConfigurationError(
        f"cannot read the queues of a {kind!r} broker: Redis and the embedded broker only"
    )


def is_queued(url: str, event_id: str, *, timeout_seconds: float = 5.0) -> bool:
    """Whether a message on a metering queue of the broker at ``url`` holds the
    event, waiting or unacknowledged; `BrokerUnavailable` when it does not answer."""
    broker = open_queues(url, timeout_seconds=timeout_seconds)
    try:
        queues = sorted({DEFAULT_QUEUE, *broker.present_queues()})
        return bool(queued_event_ids(broker, [event_id], queues))
    finally:
        broker.close()


def queued_event_ids(
    broker: BrokerQueues, event_ids: Iterable[str], queues: Sequence[str]
) -> set[str]:
    """Which of ``event_ids`` are in a message on ``queues``, waiting or unacknowledged."""
    wanted = set(event_ids)
    found: set[str] = set()
    for message in broker.messages(queues):
        found.update(wanted.intersection(message.event_ids))
        if found == wanted:
            break
    return found


def oldest_undecided(
    broker: BrokerQueues, queues: Sequence[str], decided: Callable[[Iterable[str]], set[str]]
) -> Oldest:
    """The oldest message on ``queues`` with an event that has no result yet.

    ``decided`` says which of some event ids have results (`Meter.decided`):
    an unacknowledged message whose events were all applied is about to go.
    """
    batches = [m for m in broker.oldest_candidates(queues) if m.event_ids]
    done = decided({event_id for m in batches for event_id in m.event_ids})
    undecided = [m for m in batches if not set(m.event_ids) <= done]
    dated = [m for m in undecided if m.sent_at_us is not None]
    oldest = min(dated, key=lambda m: m.sent_at_us or 0, default=None)
    return Oldest(oldest, len(undecided) - len(dated))
