"""`metering status` and `metering result` against real ``celery -A workers worker``s.

Both brokers: Redis with PostgreSQL (workers answer Celery's ping), and the
embedded default, kombu's SQL transport with SQLite files (workers and beat
are found by their heartbeats). Each worker runs beat embedded (``--beat``).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from metering import Limit, Meter
from metering.cli import main
from metering.pipeline.producer import UsageProducer

pytestmark = pytest.mark.slow

TIMEOUT = 60.0
POLL = 0.25


@dataclass(frozen=True)
class Stack:
    """Where a worker of this test works: its database and broker."""

    kind: str
    database: str
    broker: str

    def overrides(self) -> dict[str, str]:
        """``start_worker`` environment for this stack."""
        return {"METERING_DATABASE_URL": self.database, "METERING_BROKER_URL": self.broker}

    def run(self, *args: str) -> Result:
        return CliRunner().invoke(main, ["--database", self.database, *args])

    def status(self, *args: str) -> Result:
        return self.run("status", "--broker", self.broker, "--timeout", "2", *args)

    def result(self, event_id: str) -> Result:
        return self.run("result", event_id, "--broker", self.broker)


@pytest.fixture(params=["redis", "embedded"])
def stack(request: pytest.FixtureRequest, pg_url: str, redis_url: str, tmp_path: Path) -> Stack:
    if request.param == "redis":
        return Stack("redis", pg_url, redis_url)
    database: str = request.getfixturevalue("sqlite_url")
    return Stack("embedded", database, f"sqla+sqlite:///{tmp_path}/b.db")


def wait_for(what: str, attempt: Callable[[], Result], done: Callable[[Result], bool]) -> Result:
    """Run ``attempt`` until ``done`` says yes; fail with the last output after TIMEOUT."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        last = attempt()
        if done(last):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {TIMEOUT} s\n{last.output}")
        time.sleep(POLL)


def report_of(result: Result) -> dict[str, Any]:
    document = json.loads(result.stdout)
    assert isinstance(document, dict)
    return document


def test_healthy_with_a_worker_and_beat_then_not_without_them(
    stack: Stack, start_worker: Callable[..., Any]
) -> None:
    before = stack.status("--require", "worker,beat")
    assert before.exit_code == 1
    assert [line.split(":")[1].strip() for line in before.stderr.splitlines()] == [
        "workers",
        "beat",
    ]

    worker = start_worker(beat=True, **stack.overrides())
    node = f"{worker.name}@{socket.gethostname()}"
    healthy = wait_for(
        "healthy with a worker and beat",
        lambda: stack.status("--require", "worker,beat", "--format", "json"),
        lambda result: result.exit_code == 0,
    )
    report = report_of(healthy)
    assert report["healthy"] is True and healthy.stderr == ""
    method = "ping" if stack.kind == "redis" else "heartbeat"
    assert report["workers"] == {"method": method, "alive": [node]}
    assert re.fullmatch(rf"beat\.\d+@{re.escape(socket.gethostname())}", report["beat"]["name"])
    assert report["beat"]["alive"] == [report["beat"]["name"]]
    assert report["database"]["revision"] == report["database"]["head"]
    assert report["queues"][0]["queue"] == "metering"
    [workers] = [check for check in report["checks"] if check["check"] == "workers"]
    assert workers["state"] == "ok" and workers["detail"].endswith(f"(by {method}): {node}")

    # This worker by name (%h: this host), and one that does not exist.
    assert stack.status("--node", f"{worker.name}@%h").exit_code == 0
    nobody = stack.status("--node", "nobody@%h")
    assert nobody.exit_code == 1
    [line] = nobody.stderr.splitlines()
    assert line.startswith("unhealthy: workers: no ") and f"nobody@{socket.gethostname()}" in line

    worker.stop()
    gone = stack.status()
    assert gone.exit_code == 1
    [line] = gone.stderr.splitlines()
    if stack.kind == "redis":
        assert line == "unhealthy: workers: no answer from a worker to a ping within 2 s (by ping)"
    else:  # a worker that stops deletes its heartbeat
        assert line == "unhealthy: workers: no heartbeat from a worker ever (by heartbeat)"
    # Beat stopped with it; its heartbeat stays, to say when it was last seen.
    beat = report_of(stack.status("--require", "none", "--format", "json"))["beat"]
    assert beat["name"] == report["beat"]["name"] and beat["last_seen"] is not None


def test_result_is_pending_until_a_worker_applies_the_event(
    stack: Stack, start_worker: Callable[..., Any]
) -> None:
    with Meter(stack.database) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1d"))
    with UsageProducer(stack.broker) as producer:
        producer.emit("org-1", "calls", cost=2, event_id="queued-1")

    pending = stack.result("queued-1")
    assert pending.exit_code == 3, pending.output
    assert pending.stdout == "pending  event queued-1 is queued: no worker has decided it yet\n"
    depth = report_of(stack.status("--require", "none", "--format", "json"))["queues"][0]
    assert (depth["queue"], depth["waiting"] + depth["unacked"]) == ("metering", 1)

    start_worker(**stack.overrides())
    decided = wait_for(
        "the worker's result", lambda: stack.result("queued-1"), lambda r: r.exit_code != 3
    )
    assert decided.exit_code == 0, decided.output
    assert decided.stdout.startswith("allowed  org-1 calls  used 2/10, 8 left")
    assert stack.result("never-sent").exit_code == 1
