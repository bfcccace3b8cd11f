"""The HTTP API: ingestion over HTTP against the producer, and ``POST /v1/check``.

    .venv/bin/python bench/bench_api.py [--seconds 10] [--rounds 3] [--concurrency 8]
                                        [--framework]

Starts a durable PostgreSQL (fsync on) and a Redis (append-only), then:

(a) ``metering serve`` (one process, Redis broker): ``POST /v1/events`` with
    batches of 100 plain events (every id new), ``concurrency`` requests in
    flight; events/s accepted (every answer must be 202) and request
    latency p50/p99.
(p) the peer, in the same run: the same number of events emitted by
    `UsageProducer` in this process to the same Redis (its own batching,
    flushed at the end); events/s. The ratio is (a) / (p). (a) and (p) run
    in turn ``rounds`` times; the table gives the median of each.
(c) ``POST /v1/check`` on the same server against (b), the bare app: FastAPI
    with the same route returning a constant, served the same way;
    requests/s and p50/p99.
Each row also gives the CPU the server process spent per event (or per
request), from /proc, and the producer's process CPU per event: on a
shared machine these move much less than the rates.
``--framework``: the minimal ``POST /v1/events`` of `api_framework_apps.py`
    (FastAPI + pydantic; FastAPI with the body read by hand; Starlette + hand
    validation; each with the library's `make_event`, no broker) under the
    same load.

The load generator is ``wrk`` (one thread, a Lua script writing each body)
when it is installed (Debian: ``apt-get install wrk``), else an httpx async
client in this process, which bounds the rates of small requests. Either
runs on the same machine and competes with the server for its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
from common import Figures, durable_postgres, print_table
from servers import RedisServer, make_base_dir

from metering import Limit, Meter, UsageProducer
from metering.storage.connections import upgrade_schema

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


EVENTS_LUA = """
counter = 0
request = function()
  counter = counter + 1
  local parts = {}
  for i = 0, 99 do
    parts[#parts + 1] = string.format(
      '{"event_id":"%s-%d-%d","subject":"org-%d","limit":"api_calls","cost":%d,'
      .. '"occurred_at":"%s","metadata":{"route":"/v1/things"}}',
      "TAG", counter, i, (counter * 100 + i) % SUBJECTS, 1 + i % 3, "NOW")
  end
  return wrk.format("POST", "/v1/events", {["Content-Type"] = "application/json"},
                    "[" .. table.concat(parts, ",") .. "]")
end
"""

CHECK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"subject": "org-1", "limit": "api_calls"}'
"""


def _ms(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if found is None:
        raise SystemExit(f"wrk printed a latency this cannot read: {text!r}")
    value, unit = found.groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used: /proc/PID/stat, fields 14 and 15."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_wrk(
    base: str, path: str, script: str, seconds: int, concurrency: int, pid: int, each: int = 1
) -> Measured:
    """Requests/s, p50 and p99 ms as wrk measures them, and the server's CPU per
    unit (``each`` units a request); any non-2xx answer fails."""
    lua = Path(tempfile.mkstemp(suffix=".lua")[1])
    lua.write_text(script)
    command = ["wrk", "-t", "1", "-c", str(concurrency), "-d", f"{seconds}s", "--latency"]
    cpu_before = cpu_seconds(pid)
    out = subprocess.run(
        [*command, "-s", str(lua), f"{base}{path}"], capture_output=True, text=True, check=True
    )
    cpu = cpu_seconds(pid) - cpu_before
    lua.unlink()
    if "Non-2xx" in out.stdout:
        raise SystemExit(f"wrk saw failed requests:\n{out.stdout}")
    rate = float(_grab(r"Requests/sec:\s+([\d.]+)", out.stdout))
    requests = int(_grab(r"(\d+) requests in", out.stdout))
    return Measured(
        rate,
        _ms(_grab(r"(?m)^\s+50%\s+(\S+)", out.stdout)),
        _ms(_grab(r"(?m)^\s+99%\s+(\S+)", out.stdout)),
        cpu * 1e6 / (requests * each),
    )


def _grab(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    if found is None:
        raise SystemExit(f"wrk printed no {pattern!r}:\n{text}")
    return found.group(1)


@dataclass(frozen=True)
class Measured:
    """Requests/s and request latency percentiles, ms."""

    requests_per_second: float
    p50_ms: float
    p99_ms: float
    # The server's CPU per event (or request): what a busy machine changes least.
    cpu_us: float | None = None

    @classmethod
    def of(cls, figures: Figures, events_each: int) -> Measured:
        return cls(
            figures.rate / events_each, figures.percentile_ms(0.50), figures.percentile_ms(0.99)
        )


def ingest(base: str, args: argparse.Namespace, tag: str, pid: int) -> Measured:
    if shutil.which("wrk"):
        script = EVENTS_LUA.replace("TAG", tag).replace("SUBJECTS", str(SUBJECTS))
        script = script.replace("NOW", datetime.now(UTC).isoformat())
        warm = script.replace(f'"{tag}"', f'"{tag}-warm"')
        load_wrk(base, "/v1/events", warm, 2, 2, pid, BATCH)
        return load_wrk(base, "/v1/events", script, args.seconds, args.concurrency, pid, BATCH)
    bodies = event_bodies(args.requests, tag)
    return Measured.of(measure(base, "/v1/events", bodies, args.concurrency, 202, BATCH), BATCH)


def check(base: str, args: argparse.Namespace, pid: int) -> Measured:
    if shutil.which("wrk"):
        load_wrk(base, "/v1/check", CHECK_LUA, 2, 2, pid)
        return load_wrk(base, "/v1/check", CHECK_LUA, args.seconds, args.concurrency, pid)
    body = json.dumps({"subject": "org-1", "limit": "api_calls"}).encode()
    bodies = [body] * args.check_requests
    return Measured.of(measure(base, "/v1/check", bodies, args.concurrency, 200, 1), 1)


def producer_rate(redis_url: str, requests: int, tag: str) -> Measured:
    """The peer: the same events through `UsageProducer` (batches of 500);
    events/s, and this process's CPU per event."""
    events = [json.loads(body) for body in event_bodies(requests, tag)]
    with UsageProducer(redis_url) as producer:
        began, cpu = time.perf_counter(), time.process_time()
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
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    return Measured(requests / seconds, 0.0, 0.0, cpu * 1e6 / (requests * BATCH))


def row(
    name: str, rate: float, measured: Measured, peer: float | None, latency: bool = True
) -> list[str]:
    return [
        name,
        f"{rate:,.0f}",
        f"{measured.p50_ms:.1f}" if latency else "",
        f"{measured.p99_ms:.1f}" if latency else "",
        f"{measured.cpu_us:,.0f}" if measured.cpu_us is not None else "",
        f"{rate / peer:.2f}" if peer else "1.00",
    ]


def bench_framework(args: argparse.Namespace) -> list[list[str]]:
    """Both apps in turn, ``rounds`` times; the median round of each."""
    found: dict[str, list[Measured]] = {"fastapi": [], "fastapi-raw": [], "starlette": []}
    for round_ in range(args.rounds):
        for name, results in found.items():
            env = {**os.environ, "METERING_BENCH_FRAMEWORK": name}
            process, base = serve_uvicorn("api_framework_apps:app", env)
            try:
                results.append(ingest(base, args, f"framework-{name}-{round_}", process.pid))
            finally:
                stop(process)
            rate = results[-1].requests_per_second * BATCH
            print(f"  {name}: {rate:,.0f} events/s", flush=True)
    rows = []
    for name, results in found.items():
        middle = median_of(results)
        rate = middle.requests_per_second * BATCH
        rows.append(row(f"{name}: POST /v1/events, 100 events", rate, middle, None))
    return rows


def median_of(results: list[Measured]) -> Measured:
    return sorted(results, key=lambda m: m.requests_per_second)[len(results) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10, help="per case, with wrk")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=600, help="without wrk: of 100 events")
    parser.add_argument("--check-requests", type=int, default=4000, help="without wrk")
    parser.add_argument("--framework", action="store_true", help="FastAPI against Starlette")
    parser.add_argument("--rounds", type=int, default=3, help="the median of this many runs")
    args = parser.parse_args()
    client = "wrk" if shutil.which("wrk") else "httpx"
    if args.framework:
        print_table(
            f"Minimal POST /v1/events, batches of 100, one uvicorn process ({client})",
            ["app", "events/s", "p50 ms", "p99 ms", "server CPU µs/event", "ratio"],
            bench_framework(args),
        )
        return
    workdir = Path(tempfile.mkdtemp(prefix="metering-bench-api-"))
    try:
        rows = run_servers(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(
        f"HTTP API, one `metering serve` process, {args.concurrency} requests in flight ({client})",
        [
            "case",
            "events or requests/s",
            "p50 ms",
            "p99 ms",
            "CPU µs per event or request",
            "ratio",
        ],
        rows,
    )


def run_servers(args: argparse.Namespace, workdir: Path) -> list[list[str]]:
    """Every case but --framework, on a durable PostgreSQL and a Redis of their own."""
    with durable_postgres() as server, RedisServer(make_base_dir(workdir, "redis-")) as redis:
        redis.start()
        server.create_database("bench")
        url = server.url("bench")
        upgrade_schema(url)
        with Meter(url) as meter:
            meter.set_limit(Limit("api_calls", maximum=10**12, period="1h"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
        env.update(METERING_DATABASE_URL=url, METERING_BROKER_URL=redis.url())
        # HTTP and the producer in turn, ``rounds`` times: the median of each.
        ingests: list[Measured] = []
        peers: list[Measured] = []
        for round_ in range(args.rounds):
            process, base = serve_metering(env)
            try:
                ingests.append(ingest(base, args, f"http-{round_}", process.pid))
                if round_ == args.rounds - 1:
                    checked = check(base, args, process.pid)
                    print(f"  (c) check: {checked.requests_per_second:,.0f} /s", flush=True)
            finally:
                stop(process)
            rate = ingests[-1].requests_per_second * BATCH
            print(f"  (a) HTTP: {rate:,.0f} events/s", flush=True)
            # As many events as HTTP accepted, at least 20,000.
            peer_requests = max(int(rate * args.seconds) // BATCH, 200)
            peers.append(producer_rate(redis.url(), peer_requests, f"producer-{round_}"))
            print(f"  (p) producer: {peers[-1].requests_per_second * BATCH:,.0f} events/s")
        ingested = median_of(ingests)
        events_per_second = ingested.requests_per_second * BATCH
        producer = median_of(peers)
        peer = producer.requests_per_second * BATCH
        bare_env = {**env, "METERING_BENCH_FRAMEWORK": "bare"}
        process, bare_base = serve_uvicorn("api_framework_apps:app", bare_env)
        try:
            bare = check(bare_base, args, process.pid)
            print(f"  (b) bare: {bare.requests_per_second:,.0f} requests/s", flush=True)
        finally:
            stop(process)
    rows = [
        row("(p) peer: UsageProducer.emit, the same events", peer, producer, None, False),
        row("(a) POST /v1/events, 100 per request (202)", events_per_second, ingested, peer),
        row("(b) bare app: POST /v1/check, a constant", bare.requests_per_second, bare, None),
        row("(c) POST /v1/check", checked.requests_per_second, checked, bare.requests_per_second),
    ]
    return rows


if __name__ == "__main__":
    main()
