"""Shared parts of the benchmarks: a durable throw-away PostgreSQL, timing, tables, workers."""

from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# This checkout's package first, then the test helpers: a bench measures the
# code beside it, whichever checkout the venv was installed from.
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from servers import PostgresServer, make_base_dir  # noqa: E402


@contextmanager
def durable_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server with fsync and synchronous_commit on, as in production."""
    base = make_base_dir(Path(tempfile.gettempdir()), prefix="metering-bench-")
    server = PostgresServer(base, durable=True)
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@dataclass(frozen=True)
class Figures:
    name: str
    processes: int
    events: int
    seconds: float
    latencies_ns: list[int]

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_ns)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6

    def row(self) -> list[str]:
        return [
            self.name,
            str(self.processes),
            f"{self.rate:,.0f}",
            f"{self.percentile_ms(0.50):.2f}",
            f"{self.percentile_ms(0.99):.2f}",
        ]


Job = Callable[[int, int], list[int]]  # (process index, events) -> latencies in ns


def _child(job: Job, index: int, events: int, start: object, out: object) -> None:
    start.wait(60)  # type: ignore[attr-defined]
    out.put(job(index, events))  # type: ignore[attr-defined]


def run_parallel(name: str, job: Job, processes: int, events_each: int) -> Figures:
    """Run ``job`` in ``processes`` forked processes started at the same instant."""
    context = multiprocessing.get_context("fork")
    start, out = context.Event(), context.Queue()
    procs = [
        context.Process(target=_child, args=(job, n, events_each, start, out))
        for n in range(processes)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.5)  # let every child connect before the clock starts
    return _timed(name, procs, start, out)


def _started(procs: list[Any], start: Any, out: Any) -> list[Any]:
    """Start the children's timed parts at one instant; what each returned."""
    start.set()
    return [out.get(timeout=600) for _ in procs]


def _timed(name: str, procs: list[Any], start: Any, out: Any) -> Figures:
    """`_started`: the children's latencies, and the wall time."""
    began = time.perf_counter()
    latencies = [ns for found in _started(procs, start, out) for ns in found]
    seconds = time.perf_counter() - began
    for proc in procs:
        proc.join(60)
    return Figures(name, len(procs), len(latencies), seconds, latencies)


Prepare = Callable[[int, int], Callable[[], list[int]]]  # (index, events) -> the timed part


def _prepared_child(prepare: Prepare, index: int, events: int, start: object, out: object) -> None:
    timed = prepare(index, events)
    out.put(None)  # type: ignore[attr-defined]
    start.wait(600)  # type: ignore[attr-defined]
    out.put(timed())  # type: ignore[attr-defined]


def _ready(prepare: Callable[[int, int], Callable[[], Any]], processes: int, events: int) -> Any:
    """``processes`` forked children, each prepared and waiting for the start."""
    context = multiprocessing.get_context("fork")
    start, out = context.Event(), context.Queue()
    procs = [
        context.Process(target=_prepared_child, args=(prepare, n, events, start, out))
        for n in range(processes)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        out.get(timeout=600)  # ready
    return procs, start, out


def run_prepared(name: str, prepare: Prepare, processes: int, events_each: int) -> Figures:
    """`run_parallel`, where each child first runs ``prepare`` (connects, warms up) and
    the clock starts once every child is ready; only the callable it returns is timed."""
    return _timed(name, *_ready(prepare, processes, events_each))


def run_prepared_each(
    prepare: Callable[[int, int], Callable[[], Any]], processes: int, events_each: int
) -> list[Any]:
    """`run_prepared`, returning what each child's timed part returned."""
    procs, start, out = _ready(prepare, processes, events_each)
    found = _started(procs, start, out)
    for proc in procs:
        proc.join(60)
    return found


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A Markdown table, ready to paste into the README."""
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(" --- " for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def median(values: list[float]) -> float:
    return statistics.median(values)


def start_worker(
    database_url: str, broker_url: str, log: Path, pool: list[str], settle: float = 3
) -> subprocess.Popen[bytes]:
    """A `celery -A workers worker` process on these servers, given ``settle`` s to start."""
    env = dict(os.environ, METERING_DATABASE_URL=database_url, METERING_BROKER_URL=broker_url)
    command = [sys.executable, "-m", "celery", "-A", "workers", "worker", "--loglevel", "WARNING"]
    command += ["--without-heartbeat", "--without-gossip", "--without-mingle", *pool]
    with log.open("wb") as out:
        worker = subprocess.Popen(
            command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
            start_new_session=True,
        )
    time.sleep(settle)
    return worker


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """A warm shutdown (SIGTERM to its process group), killed after 30 s."""
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
