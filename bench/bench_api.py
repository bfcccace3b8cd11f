"""The HTTP API: ingestion over HTTP against the producer, and ``POST /v1/check``.

    .venv/bin/python bench/bench_api.py [--requests 600] [--concurrency 8]
                                        [--check-requests 4000] [--framework]

Starts a durable PostgreSQL (fsync on) and a Redis (append-only), then:

(a) ``metering serve`` (one process, Redis broker): ``POST /v1/events`` with
    batches of 100 plain events, ``concurrency`` requests in flight from an
    httpx async load generator in this process; events/s accepted (every
    answer must be 202) and request latency p50/p99.
(p) the peer, in the same run: the same number of events emitted by
    `UsageProducer` in this process to the same Redis (its own batching,
    flushed at the end); events/s. The ratio is (a) / (p).
(c) ``POST /v1/check`` on the same server against (b), the bare app: FastAPI
    with the same route returning a constant, served the same way;
    requests/s and p50/p99.
``--framework``: the minimal ``POST /v1/events`` of `api_framework_apps.py`
    (FastAPI + pydantic, and Starlette + hand validation, both with the
    library's `make_event`, no broker) under the same load.

One load generator on the same machine: on few cores it competes with the
server, and a python client bounds the request rates of small requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
from common import Figures, durable_postgres, print_table
from servers import RedisServer, make_base_dir

from metering import Limit, Meter, UsageProducer
from metering.storage.engine import upgrade_schema

HERE = Path(__file__).resolve().parent
BATCH = 100
SUBJECTS = 1000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(
    command: list[str], env: dict[str, str], probe: str
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    process = subprocess.Popen([*command, "--port", str(port)], env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{base}{probe}")
            return process, base
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"the server did not start: {command}")


def serve_metering(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    command = [sys.executable, "-m", "metering", "serve", "--workers", "1"]
    command += ["--log-level", "warning", "--no-access-log"]
    return start(command, env, "/openapi.json")


def serve_uvicorn(app: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(HERE), app]
    command += ["--log-level", "warning", "--no-access-log"]
    return start(command, env, "/")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(30)


def event_bodies(requests: int, tag: str) -> list[bytes]:
    """``requests`` JSON arrays of 100 events, every id unique."""
    now = datetime.now(UTC).isoformat()
    bodies = []
    for r in range(requests):
        events = [
            {
                "event_id": f"{tag}-{r}-{i}",
                "subject": f"org-{(r * BATCH + i) % SUBJECTS}",
                "limit": "api_calls",
                "cost": 1 + i % 3,
                "occurred_at": now,
                "metadata": {"route": "/v1/things"},
            }
            for i in range(BATCH)
        ]
        bodies.append(json.dumps(events).encode())
    return bodies


async def load(
    base: str, path: str, bodies: list[bytes], concurrency: int, want: int, events_each: int
) -> Figures:
    latencies: list[int] = []
    pending = iter(bodies)
    failures: list[str] = []
    headers = {"content-type": "application/json"}

    async def worker(client: httpx.AsyncClient) -> None:
        for body in pending:
            began = time.perf_counter_ns()
            answer = await client.post(path, content=body, headers=headers)
            latencies.append(time.perf_counter_ns() - began)
            if answer.status_code != want:
                failures.append(answer.text[:300])

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        seconds = time.perf_counter() - began
    if failures:
        raise SystemExit(f"{len(failures)} requests failed, the first: {failures[0]}")
    return Figures("", 1, len(latencies) * events_each, seconds, latencies)


def measure(
    base: str, path: str, bodies: list[bytes], concurrency: int, want: int, each: int
) -> Figures:
    # A warm-up of a tenth, not counted.
    asyncio.run(load(base, path, bodies[: max(len(bodies) // 10, 1)], concurrency, want, each))
    return asyncio.run(load(base, path, bodies, concurrency, want, each))


def producer_rate(redis_url: str, requests: int) -> float:
    """The peer: the same events through `UsageProducer` (batches of 500)."""
    events = [json.loads(body) for body in event_bodies(requests, "producer")]
    with UsageProducer(redis_url) as producer:
        began = time.perf_counter()
        for batch in events:
            for e in batch:
                producer.emit(
                    e["subject"],
                    e["limit"],
                    e["cost"],
                    event_id=e["event_id"],
                    occurred_at=datetime.fromisoformat(e["occurred_at"]),
                    metadata=e["metadata"],
                )
        producer.flush()
        seconds = time.perf_counter() - began
    return requests * BATCH / seconds


def row(name: str, figures: Figures, unit_rate: float, peer: float | None) -> list[str]:
    ratio = f"{unit_rate / peer:.2f}" if peer else "1.00"
    return [
        name,
        f"{unit_rate:,.0f}",
        f"{figures.percentile_ms(0.50):.1f}",
        f"{figures.percentile_ms(0.99):.1f}",
        ratio,
    ]


def bench_framework(args: argparse.Namespace) -> list[list[str]]:
    rows = []
    bodies = event_bodies(args.requests, "framework")
    for name in ("fastapi", "starlette"):
        env = {**os.environ, "METERING_BENCH_FRAMEWORK": name}
        process, base = serve_uvicorn("api_framework_apps:app", env)
        try:
            figures = measure(base, "/v1/events", bodies, args.concurrency, 202, BATCH)
        finally:
            stop(process)
        rows.append(row(f"{name}: POST /v1/events, 100 events", figures, figures.rate, None))
        print(f"  {name}: {figures.rate:,.0f} events/s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="requests of 100 events")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--check-requests", type=int, default=4000)
    parser.add_argument("--framework", action="store_true", help="FastAPI against Starlette")
    args = parser.parse_args()
    if args.framework:
        print_table(
            "Minimal POST /v1/events, batches of 100, one uvicorn process",
            ["app", "events/s", "p50 ms", "p99 ms", "ratio"],
            bench_framework(args),
        )
        return
    rows: list[list[str]] = []
    workdir = Path(tempfile.mkdtemp(prefix="metering-bench-api-"))
    with durable_postgres() as server, RedisServer(make_base_dir(workdir, "redis-")) as redis:
        redis.start()
        server.create_database("bench")
        url = server.url("bench")
        upgrade_schema(url)
        with Meter(url) as meter:
            meter.set_limit(Limit("api_calls", maximum=10**12, period="1h"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
        env.update(METERING_DATABASE_URL=url, METERING_BROKER_URL=redis.url())

        peer = producer_rate(redis.url(), args.requests)
        print(f"  (p) producer: {peer:,.0f} events/s", flush=True)
        process, base = serve_metering(env)
        try:
            bodies = event_bodies(args.requests, "http")
            ingest = measure(base, "/v1/events", bodies, args.concurrency, 202, BATCH)
            print(f"  (a) HTTP: {ingest.rate:,.0f} events/s", flush=True)
            check_body = json.dumps({"subject": "org-1", "limit": "api_calls"}).encode()
            checks = [check_body] * args.check_requests
            check = measure(base, "/v1/check", checks, args.concurrency, 200, 1)
            print(f"  (c) check: {check.rate:,.0f} requests/s", flush=True)
        finally:
            stop(process)
        bare_env = {**env, "METERING_BENCH_FRAMEWORK": "bare"}
        process, bare_base = serve_uvicorn("api_framework_apps:app", bare_env)
        try:
            bare = measure(bare_base, "/v1/check", checks, args.concurrency, 200, 1)
            print(f"  (b) bare: {bare.rate:,.0f} requests/s", flush=True)
        finally:
            stop(process)
    rows.append(row("(p) peer: UsageProducer.emit, same events", ingest, peer, None))
    rows[-1][2:4] = ["", ""]
    rows.append(row("(a) POST /v1/events, 100 per request (202)", ingest, ingest.rate, peer))
    rows.append(row("(b) bare app: POST /v1/check, a constant", bare, bare.rate, None))
    rows.append(row("(c) POST /v1/check", check, check.rate, bare.rate))
    print_table(
        f"HTTP API, one `metering serve` process, {args.concurrency} requests in flight",
        ["case", "events or requests/s", "p50 ms", "p99 ms", "ratio"],
        rows,
    )


Timer = Callable[[], float]

if __name__ == "__main__":
    main()
