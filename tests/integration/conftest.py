"""Real Celery workers for the pipeline tests.

Two harnesses run the same Celery app. `start_worker` here starts
``celery -A workers worker`` subprocesses: only a process can be SIGKILLed
holding messages, have them redelivered, ride out a server outage or have
its pool processes counted, so `test_pipeline.py` (and beat, in
`test_reservation_sweep.py`) use it. Every other pipeline test is in
`test_inprocess_pipeline.py`: a worker of ``workers.app.create_app`` as
created (guarded transport and consumer, bootsteps) in a thread of the
test process, through ``celery.contrib.testing.worker.start_worker``
(pytest-celery's classic helper; its Docker fixtures are never used). It
is ready in a tenth of a second where a subprocess takes seconds. Both
wait and check with `pipeline_checks.py`.

`start_worker` starts ``celery -A workers worker`` (celery's own worker
command without its umbrella: `celery_worker.py`) as a subprocess in a new
session (so the whole process group, prefork children included, can be
killed at once), configured only through ``METERING_*`` environment
variables, logging to a file in the test's ``tmp_path``, and waits until the
log says it is ready. Every worker a test started is stopped when the test
ends, and a session fixture kills any survivor, so no worker process
outlives the test session.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from celery_worker import WORKER
from servers import RedisServer

READY_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
LOG_TAIL_LINES = 60
# Seconds before Redis hands a message a dead worker held to another worker.
VISIBILITY_TIMEOUT = 5

_numbers = itertools.count(1)
_every_worker: list[Worker] = []


@dataclass
class Worker:
    """One ``celery -A workers worker`` process group."""

    name: str
    process: subprocess.Popen[bytes]
    log_file: Path
    env: dict[str, str] = field(repr=False)
    gone: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def members(self) -> list[int]:
        """Pids of the live processes of the worker: the main process and its pool."""
        return [] if self.gone else group_members(self.process.pid)

    def log(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = "\n".join(self.log().splitlines()[-lines:])
        return f"--- last {lines} lines of {self.log_file} ---\n{text}"

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while "ready." not in self.log():
            if not self.alive():
                raise AssertionError(
                    f"worker {self.name} exited with {self.process.returncode} "
                    f"before it was ready\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(
                    f"worker {self.name} not ready within {timeout} s\n{self.tail()}"
                )
            time.sleep(0.1)

    def _signal_group(self, signum: int) -> None:
        # The worker is the leader of its own session and process group. Once
        # the whole group is gone its id may be reused: never signal it again.
        if self.gone:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole process group: the worker and its pool children."""
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_TIMEOUT)
        self._reap_group()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Warm shutdown (SIGTERM to the group); SIGKILL if it takes too long."""
        if self.alive():
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        self.kill()

    def _reap_group(self) -> None:
        # Pool children may outlive the leader for a moment; they are in the
        # same group, so SIGKILL the group until nothing of it is left.
        deadline = time.monotonic() + STOP_TIMEOUT
        while _group_alive(self.process.pid):
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.name}: process group survived SIGKILL")
            self._signal_group(signal.SIGKILL)
            time.sleep(0.05)
        self.gone = True


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``, from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may contain spaces and parentheses.
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def worker_env(database_url: str, broker_url: str, **overrides: str) -> dict[str, str]:
    """The environment of a worker: ours, minus any METERING_* we did not choose."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(
        METERING_DATABASE_URL=database_url,
        METERING_BROKER_URL=broker_url,
        METERING_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT),
        METERING_QUEUES="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(overrides)
    return env


StartWorker = Callable[..., Worker]


@pytest.fixture
def start_worker(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[StartWorker]:
    """Start a ready worker on this test's database and broker; all stopped at the end.

    ``start_worker(wait=True, only_default_queue=True, **env_overrides)`` returns
    a `Worker`; with ``only_default_queue=False`` it gets no ``-Q`` and consumes
    the queues the Celery app declares (``METERING_QUEUES``); ``queues="a,b"``
    is its ``-Q`` instead; with ``beat=True`` it also runs the periodic sweeps;
    with ``cli=True`` it is started as ``metering worker`` (which runs celery).
    """
    started: list[Worker] = []

    def start(
        *,
        wait: bool = True,
        only_default_queue: bool = True,
        queues: str | None = None,
        beat: bool = False,
        cli: bool = False,
        **overrides: str,
    ) -> Worker:
        number = next(_numbers)
        name = f"w{number}"
        log_file = tmp_path / f"worker-{name}.log"
        env = worker_env(pg_url, redis_url, **overrides)
        quiet = ["--without-heartbeat", "--without-gossip", "--without-mingle", "-n", f"{name}@%h"]
        if cli:
            # As an operator starts it: `metering worker` (which runs celery).
            command = [
                sys.executable,
                *["-m", "metering", "worker", "--loglevel", "INFO", "--concurrency", "2"],
                *(["--beat"] if beat else ["--no-beat"]),
                *quiet,
            ]
        else:
            command = [
                *WORKER,
                *["--loglevel", "INFO", "--concurrency", "2"],
                *(["-Q", queues] if queues else ["-Q", "metering"] if only_default_queue else []),
                *(["--beat", "--schedule", str(tmp_path / f"beat-{name}")] if beat else []),
                *quiet,
            ]
        with log_file.open("ab") as log:
            process = subprocess.Popen(
                command,
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(name, process, log_file, env)
        started.append(worker)
        _every_worker.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    try:
        yield start
    finally:
        problems = []
        for worker in started:
            try:
                worker.stop()
            except AssertionError as exc:
                problems.append(str(exc))
        assert not problems, problems


@pytest.fixture
def client(redis_server: RedisServer, redis_url: str) -> Iterator[redis.Redis]:
    """A Redis client on the (emptied) broker, to look at or fill the queue."""
    with redis_server.client() as connection:
        yield connection


@pytest.fixture(scope="session", autouse=True)
def _no_worker_survives_the_session() -> Iterator[None]:
    yield
    for worker in _every_worker:
        worker.kill()
