"""Denial to webhook receipt, through real workers and a real HTTP receiver.

    .venv/bin/python bench/bench_webhooks.py [--denials 100]

One limit (1 an hour), one endpoint subscribed to ``limit.denied``: a plain
``http.server`` receiver on loopback that answers 204. Each denial is a new
subject's second event; denials are paced 20 to 200 ms apart (random), so
they do not line up with any poll. For each setup:

* queued: ``UsageProducer`` (default batching: 0.25 s flush) → broker →
  ``celery -A workers worker`` applies the batch and writes the outbox → the
  worker's delivery thread → receiver. Latency from the second ``emit`` to
  receipt, and from the decision's commit (``decided_at``) to receipt;
* synchronous: ``Meter.consume`` in this process writes the outbox; a worker
  delivers. Latency from ``consume`` returning to receipt.

Setups: the embedded default (SQLite, kombu's SQLAlchemy transport, one
``--pool solo`` worker as ``metering worker`` runs it), and a durable
PostgreSQL with Redis (two prefork processes); each alone and with a second
endpoint that accepts connections and never answers (15 s timeout, its
deliveries in flight the whole run); and, for comparison, the embedded
default with ``METERING_WEBHOOKS_DISPATCH=0`` (beat's 5 s tick delivers: the
behaviour before issue 11).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from common import durable_postgres, make_base_dir, print_table
from servers import RedisServer

from metering import Limit, Meter, UsageProducer
from metering.storage.connections import upgrade_schema
from metering.webhooks import Webhooks


class Receiver:
    """Records when each subject's ``limit.denied`` arrived (wall clock)."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        received = self.arrived

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                now = time.time()
                received.setdefault(json.loads(body)["data"]["subject"], now)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def silent_endpoint() -> Iterator[str]:
    """A URL whose server accepts connections and never answers."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=128)
    held: list[socket.socket] = []

    def accept() -> None:
        try:
            while True:
                held.append(sock.accept()[0])
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    finally:
        sock.close()
        for connection in held:
            connection.close()


def start_worker(
    database_url: str, broker_url: str, workdir: Path, pool: list[str], **env: str
) -> subprocess.Popen[bytes]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    environment.update(
        METERING_DATABASE_URL=database_url,
        METERING_BROKER_URL=broker_url,
        METERING_WEBHOOKS_ALLOW_PRIVATE="1",
        **env,
    )
    log = workdir / "worker.log"
    command = [sys.executable, "-m", "celery", "-A", "workers", "worker", "--loglevel", "INFO"]
    command += ["--without-heartbeat", "--without-gossip", "--without-mingle", *pool]
    command += ["--beat", "--schedule", str(workdir / "beat")]
    with log.open("wb") as out:
        worker = subprocess.Popen(
            command,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while "ready." not in log.read_text(errors="replace"):
        if time.monotonic() > deadline or worker.poll() is not None:
            raise SystemExit(f"worker did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.1)
    return worker


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(30)


def percentile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wait_for(receiver: Receiver, subjects: list[str], seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not all(s in receiver.arrived for s in subjects):
        if time.monotonic() > deadline:
            missing = [s for s in subjects if s not in receiver.arrived]
            raise SystemExit(f"{len(missing)} webhooks never arrived, e.g. {missing[:3]}")
        time.sleep(0.02)


def queued(
    meter: Meter, broker_url: str, receiver: Receiver, tag: str, denials: int
) -> tuple[list[float], list[float]]:
    """(emit → receipt, decided → receipt) in seconds, one pair per denial."""
    rng = random.Random(7)
    sent: dict[str, tuple[float, str]] = {}
    with UsageProducer(broker_url) as producer:
        for n in range(denials):
            subject = f"{tag}-q-{n}"
            producer.emit(subject, "send")
            event_id = producer.emit(subject, "send")
            sent[subject] = (time.time(), event_id)
            time.sleep(rng.uniform(0.02, 0.2))
        wait_for(receiver, list(sent))
    from_emit, from_decision = [], []
    for subject, (at, event_id) in sent.items():
        from_emit.append(receiver.arrived[subject] - at)
        decision = meter.result(event_id)
        assert decision is not None and not decision.allowed
        from_decision.append(receiver.arrived[subject] - decision.decided_at.timestamp())
    return from_emit, from_decision


def synchronous(meter: Meter, receiver: Receiver, tag: str, denials: int) -> list[float]:
    rng = random.Random(11)
    sent: dict[str, float] = {}
    for n in range(denials):
        subject = f"{tag}-s-{n}"
        meter.consume(subject, "send")
        assert not meter.consume(subject, "send").allowed
        sent[subject] = time.time()
        time.sleep(rng.uniform(0.02, 0.2))
    wait_for(receiver, list(sent))
    return [receiver.arrived[s] - at for s, at in sent.items()]


def measure(
    name: str,
    database_url: str,
    broker_url: str,
    pool: list[str],
    denials: int,
    *,
    hanging: bool = False,
    **env: str,
) -> list[list[str]]:
    workdir = Path(tempfile.mkdtemp(prefix="metering-bench-webhooks-"))
    receiver = Receiver()
    tag = f"r{random.randrange(10**9)}"
    with Meter(database_url) as meter, silent_endpoint() as silent_url:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter)
        hooks.add(receiver.url, types=["limit.denied"])
        if hanging:
            hooks.add(silent_url, types=["limit.denied"])
        worker = start_worker(database_url, broker_url, workdir, pool, **env)
        try:
            from_emit, from_decision = queued(meter, broker_url, receiver, tag, denials)
            direct = synchronous(meter, receiver, tag, denials)
        finally:
            stop_worker(worker)
            receiver.close()
    rows = []
    for path, values in (
        ("queued: emit → receipt", from_emit),
        ("queued: decided → receipt", from_decision),
        ("consume → receipt", direct),
    ):
        p50, p99 = percentile_ms(values, 0.5), percentile_ms(values, 0.99)
        rows.append([name, path, str(len(values)), f"{p50:.0f}", f"{p99:.0f}"])
        print(f"  {name}, {path}: {len(values)} events, p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    return rows


def embedded_urls() -> tuple[str, str]:
    base = Path(tempfile.mkdtemp(prefix="metering-bench-embedded-"))
    database_url = f"sqlite:///{base / 'metering.db'}"
    upgrade_schema(database_url)
    return database_url, f"sqla+sqlite:///{base / 'broker.db'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--denials", type=int, default=100, help="denials per path and setup")
    parser.add_argument("--skip-postgres", action="store_true", help="the embedded default only")
    args = parser.parse_args()
    n = args.denials
    rows: list[list[str]] = []
    solo = ["--pool", "solo"]
    rows += measure("embedded default", *embedded_urls(), solo, n)
    rows += measure("embedded, + a hanging endpoint", *embedded_urls(), solo, n, hanging=True)
    rows += measure(
        "embedded, beat only (before)", *embedded_urls(), solo, n, METERING_WEBHOOKS_DISPATCH="0"
    )
    if not args.skip_postgres:
        workdir = Path(tempfile.mkdtemp(prefix="metering-bench-"))
        with durable_postgres() as server, RedisServer(make_base_dir(workdir, "redis-")) as redis:
            redis.start()
            prefork = ["--concurrency", "2"]
            for name, hanging in (
                ("PostgreSQL + Redis", False),
                ("PostgreSQL + Redis, + a hanging endpoint", True),
            ):
                database = f"bench{len(rows)}"
                server.create_database(database)
                upgrade_schema(server.url(database))
                rows += measure(
                    name, server.url(database), redis.url(), prefork, n, hanging=hanging
                )
    print_table(
        "Denial to webhook receipt (loopback receiver, real workers)",
        ["setup", "path", "denials", "p50 ms", "p99 ms"],
        rows,
    )


if __name__ == "__main__":
    main()
