"""A real worker's ``/metrics`` and JSON logs: producer -> Redis -> prefork worker -> PostgreSQL.

``celery -A workers worker --concurrency 2`` (conftest's `start_worker`)
with ``METERING_METRICS_PORT``: batches are applied in two pool processes
while the main process serves ``/metrics``, so the exact counts below hold
only if every pool process's counts reach it (prometheus-client's
multiprocess mode, `workers.observability`). The stream is queued before the
worker starts, so both pool processes take batches; the test reads the
per-process files to show both counted, then kills one with SIGKILL and
shows its counts outlive it. Nothing here asserts a duration.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import httpx
import pytest
from pipeline_checks import wait_for_results, wait_until
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families
from servers import free_port

from metering import Limit, Meter
from metering.pipeline.producer import UsageProducer, make_celery
from metering.pipeline.routing import APPLY_BATCH_TASK, DEFAULT_QUEUE
from metering.telemetry.metrics import UNKNOWN_LIMIT

pytestmark = pytest.mark.slow

HARD = Limit("wm_hard", maximum=40, period="1d", window="calendar")
SOFT = Limit("wm_soft", maximum=3, period="1d", enforcement="soft")
# Celery's text format: "[2026-11-22 12:00:00,000: INFO/MainProcess] ...".
TEXT_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+: [A-Z]+/")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Worker(Protocol):
    """What these tests use of conftest's `Worker` (a ``celery -A workers worker``)."""

    @property
    def pid(self) -> int: ...
    def alive(self) -> bool: ...
    def members(self) -> list[int]: ...
    def log(self) -> str: ...
    def tail(self, lines: int = ...) -> str: ...
    def stop(self, timeout: float = ...) -> None: ...


class StartWorker(Protocol):
    def __call__(self, *, wait: bool = ..., **overrides: str) -> Worker: ...


def scrape(port: int) -> Samples:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def events_by_process(directory: Path) -> dict[int, float]:
    """metering_events_total per process, from the multiprocess files."""
    found: dict[int, float] = {}
    for path in directory.glob("counter_*.db"):
        pid = int(path.stem.split("_")[1])
        for key, count, _, _ in MmapedDict.read_all_values_from_file(str(path)):
            if json.loads(key)[1] == "metering_events_total":
                found[pid] = found.get(pid, 0.0) + count
    return found


def pool_processes(worker: Worker) -> set[int]:
    return set(worker.members()) - {worker.pid}


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    with Meter(pg_url) as meter:
        meter.set_limits([HARD, SOFT])
        yield meter


def emit_stream(redis_url: str, prefix: str, subject: str, hard: int) -> int:
    """``hard`` events on wm_hard, 5 on wm_soft, 2 on an unknown limit and a
    copy of the first event, two events a message; returns the ids decided."""
    at = datetime.now(UTC)
    with UsageProducer(redis_url, batch_size=2, flush_interval_seconds=60) as producer:
        for n in range(hard):
            producer.emit(subject, "wm_hard", event_id=f"{prefix}-h{n}", occurred_at=at)
        for n in range(5):
            producer.emit(f"{subject}-soft", "wm_soft", event_id=f"{prefix}-s{n}", occurred_at=at)
        for n in range(2):
            producer.emit(subject, "wm_nope", event_id=f"{prefix}-u{n}", occurred_at=at)
        producer.emit(subject, "wm_hard", event_id=f"{prefix}-h0", occurred_at=at)
    return hard + 5 + 2


def test_a_prefork_workers_metrics_count_every_pool_process_exactly(
    meter: Meter, redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    port = free_port()
    temporary = tmp_path / "worker-tmp"
    temporary.mkdir()
    decided = emit_stream(redis_url, "a", "wm-a", hard=60)
    app = make_celery(redis_url)
    try:  # a message that is not a batch: a dead letter
        app.send_task(APPLY_BATCH_TASK, args=[{"nope": 1}], queue=DEFAULT_QUEUE)
    finally:
        app.close()

    worker = start_worker(METERING_METRICS_PORT=str(port), TMPDIR=str(temporary))
    directory = temporary / "metering-metrics" / f"worker-{worker.pid}"
    wait_for_results(meter, decided, [worker])

    expected = {
        ("metering_events_total", "wm_hard", "allowed"): 40,
        ("metering_events_total", "wm_hard", "denied"): 20,
        ("metering_events_total", "wm_soft", "allowed"): 3,
        ("metering_events_total", "wm_soft", "overage"): 2,
        ("metering_events_total", UNKNOWN_LIMIT, "rejected"): 2,
    }

    def counts() -> dict[tuple[str, str, str], float]:
        samples = scrape(port)
        return {key: value(samples, key[0], limit=key[1], outcome=key[2]) for key in expected} | {
            ("metering_denials_total", "wm_hard", ""): value(
                samples, "metering_denials_total", limit="wm_hard"
            ),
            ("metering_events_repeated_total", "duplicate", ""): value(
                samples, "metering_events_repeated_total", kind="duplicate"
            ),
            ("metering_dead_letters_total", "", ""): value(samples, "metering_dead_letters_total"),
            ("metering_batch_events_total", "", ""): value(samples, "metering_batch_events_total"),
        }

    want = expected | {
        ("metering_denials_total", "wm_hard", ""): 20,
        ("metering_events_repeated_total", "duplicate", ""): 1,
        ("metering_dead_letters_total", "", ""): 1,
        # Every event of every batch, the copy and the message that is not one included.
        ("metering_batch_events_total", "", ""): decided + 1 + 1,
    }
    # A pool process counts just after it commits: wait for the last one.
    wait_until(lambda: counts() == want, 60, lambda: f"{counts()} != {want}", [worker])

    # Both pool processes applied batches, each counted in a file of its own.
    children = pool_processes(worker)
    assert len(children) == 2, worker.tail()
    by_process = events_by_process(directory)
    assert {pid for pid, count in by_process.items() if count > 0} == children, by_process
    assert sum(by_process.values()) == decided

    # A pool process killed (idle) is replaced; what it counted stays.
    victim = min(children)
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: len(pool_processes(worker)) == 2 and victim not in pool_processes(worker),
        60,
        lambda: f"pool processes {pool_processes(worker)}",
        [worker],
    )
    assert counts() == want

    # And the replacement's counts add up with the rest.
    more = emit_stream(redis_url, "b", "wm-b", hard=10)
    wait_for_results(meter, decided + more, [worker])
    want |= {
        ("metering_events_total", "wm_hard", "allowed"): 50,
        ("metering_events_total", "wm_soft", "allowed"): 6,
        ("metering_events_total", "wm_soft", "overage"): 4,
        ("metering_events_total", UNKNOWN_LIMIT, "rejected"): 4,
        ("metering_events_repeated_total", "duplicate", ""): 2,
        ("metering_batch_events_total", "", ""): decided + more + 3,
    }
    wait_until(lambda: counts() == want, 60, lambda: f"{counts()} != {want}", [worker])
    assert worker.alive(), worker.tail()

    # The lag gauges are read at scrape time: the queue is empty, nothing waits.
    samples = scrape(port)
    assert value(samples, "metering_lag_up", source="broker") == 1
    assert value(samples, "metering_lag_up", source="database") == 1
    assert value(samples, "metering_queue_depth", queue=DEFAULT_QUEUE) == 0
    assert value(samples, "metering_oldest_undecided_age_seconds") == 0
    assert value(samples, "metering_webhook_backlog") == 0

    # A warm shutdown removes the worker's directory.
    worker.stop()
    assert not directory.exists()


def test_a_worker_logs_one_json_object_per_line(
    meter: Meter, redis_url: str, start_worker: StartWorker
) -> None:
    worker = start_worker(METERING_LOG_FORMAT="json")
    decided = emit_stream(redis_url, "j", "wm-j", hard=4)
    wait_for_results(meter, decided, [worker])
    wait_until(
        lambda: worker.log().count("batch applied") >= 2, 30, lambda: "no batch logged", [worker]
    )
    # The pool logs a lost process through billiard's logger, of its own.
    os.kill(min(pool_processes(worker)), signal.SIGKILL)
    wait_until(lambda: "exited with" in worker.log(), 30, lambda: "no exit logged", [worker])
    worker.stop()

    lines = worker.log().splitlines()
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    # What is not JSON is printed, not logged: Celery's banner, Python's
    # warnings before logging starts and Celery's shutdown notice.
    text_records = [line for line in lines if TEXT_RECORD.match(line)]
    assert not text_records, text_records
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry), entry
        assert datetime.fromisoformat(entry["time"]).tzinfo is not None
    applied = [e for e in entries if e["message"].startswith("batch applied")]
    assert applied, entries
    assert all(e["logger"] == "workers.tasks" and e["level"] == "INFO" for e in applied)
    assert all(e["task_name"] == APPLY_BATCH_TASK and e["task_id"] for e in applied)
    assert any(e["message"].endswith("ready.") for e in entries)
    # The pool says so once; were a batch in the killed process, Celery's
    # WorkerLostError names the signal too, also at ERROR.
    [lost] = [e for e in entries if "exited with" in e["message"]]
    assert "signal 9" in lost["message"], lost
    killed = [e for e in entries if "signal 9" in e["message"]]
    assert all(e["level"] == "ERROR" for e in killed), killed
    received = [e for e in entries if e["message"].endswith("received")]
    assert received, entries
    # Celery's own fields stay, without the batch itself.
    assert all(e["data"]["name"] == APPLY_BATCH_TASK for e in received)
    assert not any("args" in e["data"] for e in received)
