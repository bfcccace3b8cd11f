"""A worker on the embedded broker stops on a SIGTERM sent to its whole process group.

systemd stops a service that way (``KillMode=control-group``, its default):
every process of the worker gets the signal at once, pool processes too.
Each worker here has applied an event first, so a pool would have a process
waiting on its queue. Several workers run side by side, each on its own
broker and database: one warm shutdown that hangs fails the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pipeline_checks import RESULT_TIMEOUT, wait_until
from servers import copy_sqlite

from metering import Limit, Meter
from metering.pipeline.producer import UsageProducer

pytestmark = pytest.mark.slow

WORKERS = 3
# The harness's own wait before it SIGKILLs a worker.
STOP_TIMEOUT = 30.0


def decided(database: str, event_id: str) -> bool:
    with Meter(database) as meter:
        return meter.result(event_id) is not None


def test_a_worker_on_the_embedded_broker_stops_on_a_sigterm_to_its_group(
    tmp_path: Path, sqlite_template: Path, start_worker: Callable[..., Any]
) -> None:
    started = []
    for number in range(WORKERS):
        database = copy_sqlite(sqlite_template, tmp_path / f"m{number}.db")
        broker = f"sqla+sqlite:///{tmp_path}/b{number}.db"
        with Meter(database) as meter:
            meter.set_limit(Limit("calls", maximum=10, period="1d"))
        with UsageProducer(broker) as producer:
            producer.emit("org-1", "calls", cost=1, event_id=f"e{number}")
        worker = start_worker(
            wait=False, METERING_DATABASE_URL=database, METERING_BROKER_URL=broker
        )
        started.append((worker, database, f"e{number}"))
    for worker, database, event_id in started:
        worker.wait_ready()
        wait_until(
            lambda: decided(database, event_id),  # noqa: B023 (called before the next round)
            RESULT_TIMEOUT,
            lambda: f"{event_id} not decided",  # noqa: B023
            [worker],
        )

    for worker, _, _ in started:
        os.killpg(worker.pid, signal.SIGTERM)
    for worker, _, _ in started:
        try:
            code = worker.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            stuck = f"worker {worker.name} still running {STOP_TIMEOUT} s after SIGTERM"
            pytest.fail(f"{stuck}\n{worker.tail()}")
        assert code == 0, worker.tail()
