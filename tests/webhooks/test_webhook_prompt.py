"""A worker delivers a notification within moments, without waiting for beat,
and a receiver that never answers delays only itself.

Real Celery workers (``celery -A workers worker --beat``, with beat's tick set
to a minute) on the embedded default (SQLite and kombu's SQLAlchemy
transport) and on PostgreSQL with Redis; real HTTP receivers on loopback.
Bounds are generous: the figures are in ``bench/bench_webhooks.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from celery_worker import WORKER
from pytest_httpserver import HTTPServer
from waiting import wait_for

from metering import Limit, Meter, UsageProducer
from metering.webhooks import Webhooks

pytestmark = pytest.mark.slow

# Far beyond what delivery takes (a fraction of a second), far below beat's tick.
PROMPT_SECONDS = 5.0
BEAT_SECONDS = "60"


@dataclass(frozen=True)
class Backend:
    database_url: str
    broker_url: str
    pool: list[str]


@pytest.fixture(params=["embedded", "postgres-redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "embedded":
        # As `metering worker` runs it on the embedded broker: one process.
        return Backend(
            request.getfixturevalue("sqlite_url"),
            f"sqla+sqlite:///{tmp_path / 'broker.db'}",
            ["--pool", "solo"],
        )
    pg_url = request.getfixturevalue("pg_url")
    redis_url = request.getfixturevalue("redis_url")
    return Backend(pg_url, redis_url, ["--concurrency", "2"])


@pytest.fixture
def worker(tmp_path: Path, backend: Backend) -> Iterator[Callable[..., None]]:
    """Starts one ready worker with beat (its tick a minute away); killed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(**overrides: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
        env.update(
            METERING_DATABASE_URL=backend.database_url,
            METERING_BROKER_URL=backend.broker_url,
            METERING_WEBHOOKS_ALLOW_PRIVATE="1",
            METERING_WEBHOOKS_INTERVAL=BEAT_SECONDS,
            PYTHONUNBUFFERED="1",
            **overrides,
        )
        log = tmp_path / "worker.log"
        command = [*WORKER, *backend.pool]
        command += ["--beat", "--schedule", str(tmp_path / "beat"), "-Q", "metering"]
        command += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
        command += ["--loglevel", "INFO"]
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        started.append(process)
        wait_for(lambda: "ready." in log.read_text(errors="replace"), lambda: log.read_text(), 60)

    try:
        yield start
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


@dataclass
class SilentServer:
    """Accepts connections and never answers (nor reads): a hanging receiver."""

    sock: socket.socket
    accepted: list[socket.socket] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.sock.accept()
                self.accepted.append(connection)


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    sock = socket.create_server(("127.0.0.1", 0), backlog=64)
    server = SilentServer(sock)
    threading.Thread(target=server.serve, daemon=True).start()
    try:
        yield server
    finally:
        sock.close()
        for connection in server.accepted:
            connection.close()


def arrivals(receiver: HTTPServer) -> list[str]:
    return [request.json["data"]["subject"] for request, _ in receiver.log]


def test_a_denial_is_delivered_within_seconds_without_beat(
    backend: Backend, receiver: HTTPServer, worker: Callable[..., None]
) -> None:
    receiver.expect_request("/hook").respond_with_data("ok")
    with Meter(backend.database_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        Webhooks(meter).add(receiver.url_for("/hook"), types=["limit.denied"])
        worker()
        # Queued: the worker applies the batch and writes the outbox.
        with UsageProducer(backend.broker_url) as producer:
            producer.emit("queued", "send")
            producer.emit("queued", "send")
            producer.flush()
            began = time.monotonic()
            wait_for(lambda: arrivals(receiver) == ["queued"], lambda: str(arrivals(receiver)))
        queued_seconds = time.monotonic() - began
        # Synchronous: `Meter.consume` in this process writes it; the worker delivers.
        meter.consume("direct", "send")
        assert not meter.consume("direct", "send").allowed
        began = time.monotonic()
        wait_for(
            lambda: arrivals(receiver) == ["queued", "direct"], lambda: str(arrivals(receiver))
        )
        direct_seconds = time.monotonic() - began
    assert queued_seconds < PROMPT_SECONDS and direct_seconds < PROMPT_SECONDS


def test_a_hanging_endpoint_does_not_delay_another_one(
    backend: Backend,
    receiver: HTTPServer,
    silent: SilentServer,
    worker: Callable[..., None],
) -> None:
    receiver.expect_request("/hook").respond_with_data("ok")
    subjects = [f"visitor-{n}" for n in range(6)]  # more than the per-endpoint bound
    with Meter(backend.database_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter)
        hanging, _ = hooks.add(silent.url, types=["limit.denied"])
        hooks.add(receiver.url_for("/hook"), types=["limit.denied"])
        worker(METERING_WEBHOOKS_TIMEOUT="60", METERING_WEBHOOKS_PER_ENDPOINT="2")
        began = time.monotonic()
        for subject in subjects:
            meter.consume(subject, "send")
            assert not meter.consume(subject, "send").allowed
        wait_for(
            lambda: sorted(arrivals(receiver)) == subjects,
            lambda: f"{arrivals(receiver)}; {hooks.deliveries()}",
            PROMPT_SECONDS * 3,
        )
        seconds = time.monotonic() - began
        # The hanging receiver holds its own attempts (no more than the bound)...
        assert 1 <= len(silent.accepted) <= 2
        stuck = hooks.deliveries(endpoint_id=hanging.id)
        assert len(stuck) == 6 and {d.status for d in stuck} == {"pending"}
        assert all(d.attempts == 0 for d in stuck)
    # ... while the other one received all six, long before the 60 s timeout.
    assert seconds < PROMPT_SECONDS * 2
