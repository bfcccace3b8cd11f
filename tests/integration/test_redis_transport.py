"""The worker's Redis channel (`workers.guard.GuardedChannel`) on a real Redis.

kombu's own channel takes a message with BRPOP and records it as
unacknowledged only after reading the reply, so a worker that dies while the
reply waits in its socket loses the message for good. These tests stop a
channel at exactly that moment: the pop is sent and answered, the reply is
never read, and the connection is gone, as after SIGKILL.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.transport import redis as kombu_redis

from workers.guard import GuardedChannel, GuardedRedisTransport

pytestmark = pytest.mark.redis

EXCHANGE = Exchange("t", type="direct")
FIRST = Queue("t.first", EXCHANGE, routing_key="t.first")
SECOND = Queue("t.second", EXCHANGE, routing_key="t.second")


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as connection:
        yield connection


def connect(redis_url: str, transport: type[kombu_redis.Transport]) -> Connection:
    # A visibility timeout of 0: whatever is held is overdue at once, so the
    # restore below needs no waiting.
    return Connection(redis_url, transport=transport, transport_options={"visibility_timeout": 0})


def publish(redis_url: str, queue: Queue, body: dict[str, Any]) -> None:
    with Connection(redis_url) as connection:
        Producer(connection).publish(
            body, exchange=EXCHANGE, routing_key=queue.routing_key, declare=[queue]
        )


def die_with_a_reply_unread(redis_url: str, transport: type[kombu_redis.Transport]) -> None:
    """A consumer sends its pop, Redis answers, and the process is gone."""
    with connect(redis_url, transport) as connection:
        channel = connection.default_channel
        Consumer(channel, [FIRST], callbacks=[lambda body, message: None]).consume()
        # What kombu's poller does before it asks a channel to pop.
        channel.client.connection = channel.client.connection_pool.get_connection()
        channel._brpop_start()
        time.sleep(0.2)  # Redis answers at once; the reply waits in the socket
        pending = channel.client.connection
        pending.disconnect()  # the socket closes with the reply unread
        channel._in_poll = None


def restore_overdue(redis_url: str) -> None:
    """What a live worker's periodic look at the unacked hash does."""
    with connect(redis_url, GuardedRedisTransport) as connection:
        channel = connection.default_channel
        channel.qos.restore_visible(num=100, interval=1)


def bodies(client: redis.Redis, queue: Queue) -> list[Any]:
    envelopes = [json.loads(entry) for entry in client.lrange(queue.name, 0, -1)]
    assert all(e["properties"]["body_encoding"] == "base64" for e in envelopes)
    return [json.loads(base64.b64decode(e["body"])) for e in envelopes]


def test_a_message_taken_by_a_worker_that_dies_before_reading_it_comes_back(
    redis_url: str, client: redis.Redis
) -> None:
    publish(redis_url, FIRST, {"n": 1})
    die_with_a_reply_unread(redis_url, GuardedRedisTransport)
    assert client.llen(FIRST.name) == 0, "the pop took the message"
    assert client.hlen("unacked") == 1, "a taken message is held until acknowledged"
    restore_overdue(redis_url)
    assert bodies(client, FIRST) == [{"n": 1}]
    assert client.hlen("unacked") == 0


def test_kombus_own_channel_loses_that_message(redis_url: str, client: redis.Redis) -> None:
    # Why the worker does not use kombu's channel as it is: the same death
    # leaves the message in no queue and in no hash.
    publish(redis_url, FIRST, {"n": 1})
    die_with_a_reply_unread(redis_url, kombu_redis.Transport)
    restore_overdue(redis_url)
    assert client.llen(FIRST.name) == 0
    assert client.hlen("unacked") == 0


def test_a_consumer_of_several_empty_queues_gets_what_arrives_on_any(redis_url: str) -> None:
    received: list[Any] = []
    with connect(redis_url, GuardedRedisTransport) as connection:
        channel = connection.default_channel
        assert isinstance(channel, GuardedChannel)

        def on_message(body: Any, message: Any) -> None:
            received.append(body)
            message.ack()

        with Consumer(channel, [FIRST, SECOND], callbacks=[on_message]):
            # Nothing queued: the channel waits, a list at a time.
            with pytest.raises(TimeoutError):
                connection.drain_events(timeout=0.5)
            publish(redis_url, SECOND, {"n": 2})
            connection.drain_events(timeout=5)
            publish(redis_url, FIRST, {"n": 1})
            connection.drain_events(timeout=5)
    assert received == [{"n": 2}, {"n": 1}]


def test_an_acknowledged_message_is_held_no_longer(redis_url: str, client: redis.Redis) -> None:
    publish(redis_url, FIRST, {"n": 1})
    with connect(redis_url, GuardedRedisTransport) as connection:
        channel = connection.default_channel

        def on_message(body: Any, message: Any) -> None:
            assert client.hlen("unacked") == 1
            message.ack()

        with Consumer(channel, [FIRST], callbacks=[on_message]):
            connection.drain_events(timeout=5)
    assert client.hlen("unacked") == 0
    assert client.zcard("unacked_index") == 0
    restore_overdue(redis_url)
    assert client.llen(FIRST.name) == 0, "an acknowledged message never comes back"


def test_the_pop_takes_entries_that_are_not_envelopes_without_holding_them(
    redis_url: str, client: redis.Redis
) -> None:
    # A live worker dead-letters them (tests/integration/test_pipeline.py).
    # The pop must not fail on them, and holds only what has a delivery tag.
    client.lpush(FIRST.name, json.dumps({"properties": {"delivery_tag": 7}}))
    client.lpush(FIRST.name, b"\xff not json")
    die_with_a_reply_unread(redis_url, GuardedRedisTransport)
    die_with_a_reply_unread(redis_url, GuardedRedisTransport)
    assert client.llen(FIRST.name) == 0
    assert client.hlen("unacked") == 0


def test_a_message_given_back_returns_to_its_queue_once(
    redis_url: str, client: redis.Redis
) -> None:
    # Delivery notes a held message only in memory (HeldQoS); giving it back
    # must still find it in the unacked hash, where the pop put it.
    publish(redis_url, FIRST, {"n": 1})
    with connect(redis_url, GuardedRedisTransport) as connection:
        channel = connection.default_channel

        def on_message(body: Any, message: Any) -> None:
            message.reject(requeue=True)

        with Consumer(channel, [FIRST], callbacks=[on_message]):
            connection.drain_events(timeout=5)
    assert bodies(client, FIRST) == [{"n": 1}]
    assert client.hlen("unacked") == 0


def test_a_producer_message_is_the_one_celery_send_task_writes(
    redis_url: str, client: redis.Redis
) -> None:
    """`UsageProducer` publishes its prebuilt JSON through kombu (no Celery
    `send_task`): the envelope on the list is Celery's own but for the ids
    and times, and the body decodes to the same task arguments."""
    from datetime import UTC, datetime

    from metering.domain.events import make_event
    from metering.pipeline.messages import encode_batch, encode_event
    from metering.pipeline.producer import UsageProducer, make_celery
    from metering.pipeline.routing import APPLY_BATCH_TASK, DEFAULT_QUEUE, SENT_AT_HEADER

    at = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
    events = [
        make_event([('org-é"1', "calls", 2)], at, "f-1", {"route": "/x", "n": [1, 2.5, None]}),
        make_event([("org-2", "calls", 1), ("team-2", "seats", 3)], at, "f-2"),
    ]
    with UsageProducer(redis_url) as producer:
        for event in events:
            producer.emit(
                charges=event.charges,
                event_id=event.event_id,
                occurred_at=at,
                metadata=event.metadata,
            )
        producer.flush()
    ours = json.loads(client.rpop(DEFAULT_QUEUE))
    celery = make_celery(redis_url)
    payload = encode_batch([encode_event(e) for e in events])
    celery.send_task(
        APPLY_BATCH_TASK,
        args=[payload],
        queue=DEFAULT_QUEUE,
        routing_key=DEFAULT_QUEUE,
        retry=False,
        headers={SENT_AT_HEADER: 1},
        argsrepr="[<2 events>]",
        kwargsrepr="{}",
    )
    celery.close()
    theirs = json.loads(client.rpop(DEFAULT_QUEUE))
    assert client.llen(DEFAULT_QUEUE) == 0

    def body(envelope: dict[str, Any]) -> Any:
        return json.loads(base64.b64decode(envelope.pop("body")))

    assert (
        body(ours)
        == body(theirs)
        == [[payload], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    )
    varying = ("id", "root_id", "correlation_id", "reply_to", "delivery_tag", SENT_AT_HEADER)
    for envelope in (ours, theirs):
        for part in (envelope["headers"], envelope["properties"]):
            for name in varying:
                part.pop(name, None)
    assert ours == theirs
