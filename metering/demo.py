"""`metering demo`: the whole pipeline on the embedded default, no server.

Starts a worker process on fresh SQLite files in a data directory (the CLI
passes ``METERING_HOME``, default ./.metering), emits a few minutes of
realistic usage through a `UsageProducer`, waits for every event's result,
and shows what happened. A `WebhookReceiver` on loopback takes the webhooks
the worker's own delivery thread sends (the worker may reach 127.0.0.1 only).
"""

from __future__ import annotations

import queue
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

from metering.domain.limits import Limit
from metering.errors import MeteringError
from metering.meter import Meter
from metering.pipeline.producer import UsageProducer
from metering.settings import child_environment

DEMO_LIMITS: Final = (
    Limit("api_calls", 400, "1mo", window="calendar", enforcement="soft", thresholds=(80, 100)),
    Limit("send_message", 5, "1m"),
    Limit("search", 10, "10s", algorithm="token_bucket"),
)
ChargeTuple = tuple[str, str, int]
RESULTS_TIMEOUT_SECONDS: Final = 60.0
WEBHOOK_TIMEOUT_SECONDS: Final = 20.0
# The worker delivers to the demo's receiver only: loopback is refused by default.
WORKER_WEBHOOK_SETTINGS: Final = {
    "METERING_WEBHOOKS_DISPATCH": "1",
    "METERING_WEBHOOKS_ALLOW_NETWORKS": "127.0.0.1/32",
    "METERING_WEBHOOKS_POLL_INTERVAL": "0.1",
}


@dataclass(frozen=True)
class DemoFiles:
    database: Path
    broker: Path
    worker_log: Path
    chart: Path

    @classmethod
    def fresh(cls, directory: Path) -> DemoFiles:
        files = cls(
            directory / "metering-demo.db",
            directory / "metering-demo-broker.db",
            directory / "metering-demo-worker.log",
            directory / "metering-demo-overage.png",
        )
        for base in (files.database, files.broker, files.worker_log, files.chart):
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{base}{suffix}").unlink(missing_ok=True)
        return files

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.database}"

    @property
    def broker_url(self) -> str:
        return f"sqla+sqlite:///{self.broker}"


def demo_events(start: datetime) -> list[tuple[datetime, list[ChargeTuple]]]:
    """Three minutes of usage: three orgs with two users each, a chatty
    visitor who runs into the per-minute limit, and search bursts."""
    rng = random.Random(2026)
    events: list[tuple[float, list[ChargeTuple]]] = []
    for org in ("acme", "globex", "initech"):
        for user in ("alice", "bob"):
            subject = f"{user}@{org}.example"
            stacked = [(subject, "send_message", 1), (f"org:{org}", "api_calls", 1)]
            events += [(rng.uniform(0, 175), stacked) for _ in range(rng.randrange(8, 16))]
            events += [(rng.uniform(0, 175), [(f"org:{org}", "api_calls", 5)]) for _ in range(40)]
            burst = rng.uniform(20, 150)
            events += [(burst + 0.2 * i, [(subject, "search", 1)]) for i in range(14)]
    events += [(40 + 2.5 * i, [("visitor-1", "send_message", 1)]) for i in range(12)]
    events.sort(key=lambda event: event[0])
    return [(start + timedelta(seconds=offset), charges) for offset, charges in events]


def start_worker(files: DemoFiles) -> subprocess.Popen[bytes]:
    env = child_environment(
        METERING_DATABASE_URL=files.database_url,
        METERING_BROKER_URL=files.broker_url,
        **WORKER_WEBHOOK_SETTINGS,
    )
    command = [sys.executable, "-m", "celery", "-A", "workers", "worker"]
    command += ["--pool", "solo", "--loglevel", "INFO", "--without-heartbeat"]
    with files.worker_log.open("wb") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.terminate()
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(5)


def emit_all(files: DemoFiles, events: list[tuple[datetime, list[ChargeTuple]]]) -> None:
    with UsageProducer(files.broker_url, batch_size=100) as producer:
        for number, (when, charges) in enumerate(events, 1):
            producer.emit(charges=charges, event_id=f"demo-{number:04d}", occurred_at=when)


def wait_for_results(
    meter: Meter,
    expected: int,
    worker: subprocess.Popen[bytes],
    files: DemoFiles,
    progress: Callable[[int], None],
) -> None:
    deadline = time.monotonic() + RESULTS_TIMEOUT_SECONDS
    while (done := meter.count_results()) < expected:
        progress(done)
        if worker.poll() is not None:
            raise MeteringError(f"the demo worker stopped; see {files.worker_log}")
        if time.monotonic() > deadline:
            raise MeteringError(f"results did not arrive in time; see {files.worker_log}")
        time.sleep(0.1)
    progress(done)


@dataclass(frozen=True)
class ReceivedWebhook:
    """One POST the receiver took: its headers and body, as sent."""

    path: str
    headers: dict[str, str]
    body: bytes


class WebhookReceiver:
    """A small HTTP server on 127.0.0.1 (a free port) in a thread of its own:
    it answers every POST with 204 and keeps what it received, in order."""

    def __init__(self) -> None:
        self.received: queue.Queue[ReceivedWebhook] = queue.Queue()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                received.put(ReceivedWebhook(self.path, dict(self.headers.items()), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass  # the demo prints what it received itself

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="demo-webhook-receiver", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/metering-webhooks"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def wait(
        self,
        accept: Callable[[ReceivedWebhook], bool],
        worker: subprocess.Popen[bytes],
        files: DemoFiles,
        timeout: float = WEBHOOK_TIMEOUT_SECONDS,
    ) -> ReceivedWebhook:
        """The first webhook ``accept`` takes, waiting at most ``timeout`` seconds;
        `MeteringError` saying where to look when none comes."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if worker.poll() is not None:
                raise MeteringError(f"the demo worker stopped; see {files.worker_log}")
            try:
                webhook = self.received.get(timeout=min(left, 0.2))
            except queue.Empty:
                continue
            if accept(webhook):
                return webhook
        raise MeteringError(
            f"no webhook reached the demo's receiver in {timeout:g} s; "
            f"see the worker's log, {files.worker_log}"
        )
