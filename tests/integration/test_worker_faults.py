"""A `metering worker` rides out its servers going away.

The worker is started as an operator starts it (``metering worker``), on the
test session's real Redis and PostgreSQL, which are stopped and started again
on the same port while the worker is applying.
"""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
from pipeline_checks import (
    CALLS,
    assert_each_once_and_counters_exact,
    queue_state,
    stream,
    wait_for_results,
    wait_until,
)
from servers import RedisServer
from sqlalchemy.engine import make_url
from test_pipeline import StartWorker, Worker

from metering import Meter

pytestmark = pytest.mark.slow


def psycopg_connection(url: str) -> psycopg.Connection:
    """A plain psycopg connection to the database of a SQLAlchemy ``url``."""
    parsed = make_url(url)
    return psycopg.connect(
        host=parsed.host, port=parsed.port, user=parsed.username, dbname=parsed.database
    )


def stopped(worker: Worker) -> bool:
    return not worker.alive() or "Unrecoverable error" in worker.log()


# -- Redis restarted under load -----------------------------------------------------


def test_a_worker_survives_a_redis_restart_while_it_holds_a_message(
    pg_url: str, redis_url: str, redis_server: RedisServer, start_worker: StartWorker
) -> None:
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker(cli=True)
        with psycopg_connection(pg_url) as blocker:
            # The worker takes the one batch queued before the restart and
            # cannot commit it (results are locked): it holds the message,
            # unacknowledged, while it waits on the empty queue for more.
            blocker.execute("LOCK TABLE results IN SHARE ROW EXCLUSIVE MODE")
            before = list(stream(redis_url, at, "before", 50, subjects=10, seed=6))
            with redis_server.client() as client:
                wait_until(
                    lambda: queue_state(client) == (0, 1),
                    30,
                    lambda: f"queue (waiting, unacked) = {queue_state(client)}",
                    [worker],
                )
            try:
                redis_server.stop()
            finally:
                redis_server.start()
            # The worker reconnects (or, as it did, stops: "Unrecoverable error").
            wait_until(
                lambda: worker.log().count("Connected to") == 2 or stopped(worker),
                60,
                lambda: "the worker did not reconnect",
                [worker],
            )
            assert not stopped(worker), worker.tail()
        after = list(stream(redis_url, at, "after", 1_000, subjects=10, seed=7))
        emitted = before + after
        wait_for_results(meter, len(emitted), [worker])
        with redis_server.client() as client:  # a connection made after the restart
            wait_until(
                lambda: queue_state(client) == (0, 0),
                60,
                lambda: f"queue (waiting, unacked) = {queue_state(client)}",
                [worker],
            )
        assert_each_once_and_counters_exact(meter, emitted, [worker])
        assert not stopped(worker), worker.tail()
