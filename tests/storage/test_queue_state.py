"""What the broker holds, on the session's Redis: depths, the oldest event, queued ids.

Messages are sent by a real `UsageProducer`; a worker "taking" one is kombu's
own ``basic_get`` without an acknowledgement, which moves it to the
``unacked`` hash as a Celery worker's consumer does.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from kombu import Connection

from metering import FrozenClock
from metering.cli import main
from metering.errors import BrokerUnavailable
from metering.pipeline.producer import UsageProducer, queue_for
from metering.storage.queue_state import (
    is_queued,
    oldest_undecided,
    open_queues,
    queued_event_ids,
)

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def emit(url: str, *event_ids: str, at: datetime = T0, queues: int = 1) -> None:
    """One message per event, sent at ``at``; subjects are ``org-ID``."""
    with UsageProducer(url, batch_size=1, queues=queues, clock=FrozenClock(at)) as producer:
        for event_id in event_ids:
            producer.emit(f"org-{event_id}", "calls", event_id=event_id)


@contextmanager
def taken(url: str, queue: str = "metering") -> Iterator[Any]:
    """A message taken from ``queue`` and not acknowledged, for the block's length;
    kombu puts it back when the channel closes."""
    with Connection(url) as connection:
        channel = connection.channel()
        message = channel.basic_get(queue, no_ack=False)
        assert message is not None
        try:
            yield message
        finally:
            channel.close()


def test_depths_count_llen_and_the_unacked_hash(redis_url: str) -> None:
    emit(redis_url, "e-1", "e-2", "e-3")
    broker = open_queues(redis_url)
    try:
        assert [(d.waiting, d.unacked) for d in broker.depths(["metering"])] == [(3, 0)]
        with taken(redis_url):
            assert [(d.waiting, d.unacked) for d in broker.depths(["metering"])] == [(2, 1)]
            assert [(d.waiting, d.unacked) for d in broker.depths(["metering.0"])] == [(0, 0)]
        assert [(d.waiting, d.unacked) for d in broker.depths(["metering"])] == [(3, 0)]
    finally:
        broker.close()


def test_queued_ids_are_found_waiting_and_unacked(redis_url: str) -> None:
    emit(redis_url, "e-1", "e-2")
    with taken(redis_url):  # e-1: taken from the right, the oldest end
        broker = open_queues(redis_url)
        try:
            found = queued_event_ids(broker, ["e-1", "e-2", "e-3"], ["metering"])
            assert found == {"e-1", "e-2"}
            assert {m.event_ids: m.unacked for m in broker.messages(["metering"])} == {
                ("e-1",): True,
                ("e-2",): False,
            }
        finally:
            broker.close()
        assert is_queued(redis_url, "e-1") and not is_queued(redis_url, "e-3")


def test_a_hash_routed_queue_is_found_even_when_only_unacked(redis_url: str) -> None:
    emit(redis_url, "e-9", queues=4)
    queue = queue_for("org-e-9", 4)
    with taken(redis_url, queue):  # its list is now empty, so Redis deleted it
        broker = open_queues(redis_url)
        try:
            assert broker.present_queues() == [queue]
        finally:
            broker.close()
        assert is_queued(redis_url, "e-9")
    broker = open_queues(redis_url)
    try:
        assert broker.present_queues() == [queue]
    finally:
        broker.close()


def test_the_oldest_undecided_is_found_waiting_or_unacked(redis_url: str) -> None:
    emit(redis_url, "first", at=T0)
    emit(redis_url, "second", at=T0 + timedelta(seconds=10))
    broker = open_queues(redis_url)
    try:
        oldest = oldest_undecided(broker, ["metering"], lambda ids: set())
        assert oldest.message is not None and oldest.message.event_ids == ("first",)
        assert oldest.message.sent_at_us == int(T0.timestamp()) * 1_000_000
        assert oldest.undated == 0
        with taken(redis_url):  # "first" moves to the unacked hash
            oldest = oldest_undecided(broker, ["metering"], lambda ids: set())
            assert oldest.message is not None
            assert (oldest.message.event_ids, oldest.message.unacked) == (("first",), True)
            # Applied but not yet acknowledged: "second" is the oldest undecided.
            oldest = oldest_undecided(broker, ["metering"], lambda ids: {"first"} & set(ids))
            assert oldest.message is not None and oldest.message.event_ids == ("second",)
    finally:
        broker.close()


def test_an_unreachable_redis_is_broker_unavailable() -> None:
    with pytest.raises(BrokerUnavailable, match="broker unreachable"):
        open_queues("redis://127.0.0.1:1/0", timeout_seconds=1)


# -- the commands on Redis ----------------------------------------------------------------


def test_status_on_redis_counts_the_queue_and_pings_for_workers(
    redis_url: str, sqlite_url: str
) -> None:
    emit(redis_url, "e-1", at=datetime.now(UTC) - timedelta(minutes=5))
    emit(redis_url, "e-2", at=datetime.now(UTC) - timedelta(minutes=4))
    args = ["--database", sqlite_url, "status", "--broker", redis_url, "--timeout", "1"]
    with taken(redis_url):
        result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["queues"] == [{"queue": "metering", "waiting": 1, "unacked": 1}]
    assert report["workers"] == {"method": "ping", "alive": []}
    assert report["oldest_event"]["event_id"] == "e-1"
    assert 300 <= report["oldest_event"]["age_seconds"] < 360
    assert result.stderr == (
        "unhealthy: workers: no answer from a worker to a ping within 1 s (by ping)\n"
    )


def test_a_process_forked_after_a_ping_on_redis_starts(redis_url: str) -> None:
    """The ping's reply channel is closed when the ping returns. Left open, it
    is still polling: kombu's after-fork cleanup in a child reads that poll's
    reply off the socket it shares with the parent, and the next child waits
    for it forever."""
    from metering.cli.status import ping_workers

    assert ping_workers(redis_url, 0.5, None) == []
    for _ in range(2):  # the first child to clean up reads the parent's reply
        child = multiprocessing.get_context("fork").Process(target=int)
        child.start()
        child.join(20)
        if child.exitcode is None:
            child.kill()
            child.join()
            pytest.fail("a forked process hung in kombu's after-fork cleanup")
        assert child.exitcode == 0


def test_result_of_an_event_on_redis_is_pending_with_exit_3(
    redis_url: str, sqlite_url: str
) -> None:
    emit(redis_url, "e-1")
    args = ["--database", sqlite_url, "result", "--broker", redis_url]
    waiting = CliRunner().invoke(main, [*args, "e-1"])
    assert waiting.exit_code == 3, waiting.output
    assert waiting.stdout == "pending  event e-1 is queued: no worker has decided it yet\n"
    with taken(redis_url):
        assert CliRunner().invoke(main, [*args, "e-1"]).exit_code == 3
    unknown = CliRunner().invoke(main, [*args, "e-2"])
    assert unknown.exit_code == 1 and unknown.stderr == "error: no result for event e-2\n"
