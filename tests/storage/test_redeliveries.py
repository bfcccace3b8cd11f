"""Deliveries counted past the first (`metering/storage/redeliveries.py`) on the
session's Redis, through a kombu Redis channel's own client as the worker's task
uses it: one count per task id, renewed expiry, errors as `BrokerUnavailable`."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection

from metering.errors import BrokerUnavailable
from metering.storage.redeliveries import (
    REDELIVERIES_KEY,
    REDELIVERIES_TTL_SECONDS,
    count_redelivery,
)


def test_each_task_counts_its_own_deliveries_and_the_count_lapses(redis_url: str) -> None:
    with Connection(redis_url) as connection:
        client = connection.default_channel.client
        assert [count_redelivery(client, "task-a") for _ in range(3)] == [1, 2, 3]
        assert count_redelivery(client, "task-b") == 1
        key = f"{REDELIVERIES_KEY}task-a"
        assert 0 < client.ttl(key) <= REDELIVERIES_TTL_SECONDS
        client.expire(key, 5)
        assert count_redelivery(client, "task-a") == 4
        assert client.ttl(key) > 5  # renewed by each count


def test_a_redis_that_does_not_answer_is_broker_unavailable() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    with pytest.raises(BrokerUnavailable, match="deliveries not counted"):
        count_redelivery(client, "task-a")
