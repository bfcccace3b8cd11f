"""Middleware overhead per request: the same FastAPI app with and without it.

    .venv/bin/python bench/bench_middleware.py [--requests 3000] [--concurrency 16]

Starts a durable PostgreSQL, then serves `middleware_app.py` with uvicorn
(one process) in three modes, one after the other: no middleware, one
per-IP limit (a `consume` per request), and the stacked pair (per-IP
reservation, authentication, per-user limit: reserve, consume, cancel per
request). An httpx async client on the same machine keeps ``concurrency``
requests in flight and reports requests/s and latency p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from common import Figures, durable_postgres, print_table

from metering import Limit, Meter
from metering.storage.engine import upgrade_schema

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(mode: str, url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "METERING_DATABASE_URL": url, "METERING_BENCH_MODE": mode}
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(HERE), "middleware_app:app"]
    command += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    process = subprocess.Popen(command, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/hello").status_code == 200:
                return process, base
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"uvicorn did not start in mode {mode}")


async def load(base: str, requests: int, concurrency: int, token: str | None) -> Figures:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    latencies: list[int] = []
    remaining = iter(range(requests))
    failures = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failures
        for _ in remaining:
            began = time.perf_counter_ns()
            answer = await client.get("/hello")
            latencies.append(time.perf_counter_ns() - began)
            failures += answer.status_code != 200

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        seconds = time.perf_counter() - began
    if failures:
        raise SystemExit(f"{failures} requests failed")
    return Figures("", 1, len(latencies), seconds, latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    rows = []
    with durable_postgres() as server:
        server.create_database("bench")
        url = server.url("bench")
        upgrade_schema(url)
        with Meter(url) as meter:
            meter.set_limit(Limit("per_ip", maximum=10**12, period="1h"))
            meter.set_limit(Limit("per_user", maximum=10**12, period="1h"))
        cases = [
            ("no middleware", "none", None),
            ("per-IP limit (consume)", "ip", None),
            ("stacked, authenticated (reserve, consume, cancel)", "stacked", "ada"),
            ("stacked, anonymous (reserve, commit)", "stacked", None),
        ]
        for name, mode, token in cases:
            process, base = serve(mode, url)
            try:
                asyncio.run(load(base, 200, args.concurrency, token))  # warm up
                figures = asyncio.run(load(base, args.requests, args.concurrency, token))
            finally:
                process.terminate()
                process.wait(30)
            rows.append([name, f"{figures.rate:,.0f}", *figures.row()[3:]])
            print(f"  {name:52} {figures.rate:8,.0f} requests/s", flush=True)
    print_table(
        f"middleware overhead (uvicorn, 1 process, {args.concurrency} in flight, "
        f"{args.requests} requests, durable PostgreSQL)",
        ["app", "requests/s", "p50 ms", "p99 ms"],
        rows,
    )


if __name__ == "__main__":
    main()
