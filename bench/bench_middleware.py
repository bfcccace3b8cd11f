"""Middleware overhead per request: the same FastAPI app with and without it.

    .venv/bin/python bench/bench_middleware.py [--requests 3000] [--concurrency 16]

Starts a durable PostgreSQL, then serves `middleware_app.py` with uvicorn
(one process) in three modes, one after the other: no middleware, one
per-IP limit (a `consume` per request), and the stacked pair (per-IP
reservation, authentication, per-user limit: reserve, consume, cancel per
request). The load generator keeps ``concurrency`` requests in flight on
the same machine and reports requests/s and latency p50/p99: ``wrk`` when
it is installed (Debian: ``apt-get install wrk``), else an httpx async
client, which is much slower than the server and then bounds the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
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


def _ms(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if found is None:
        raise SystemExit(f"wrk printed a latency this cannot read: {text!r}")
    value, unit = found.groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


# Each request from one of 10,000 client addresses (and users), through a
# proxy the app trusts: many counters, as in real traffic.
SPREAD_LUA = """
request = function()
  local n = math.random(0, 9999)
  local headers = {["X-Forwarded-For"] = "10.1." .. (n // 100) .. "." .. (n % 100)}
  if wrk.headers["Authorization"] then headers["Authorization"] = "Bearer user-" .. n end
  return wrk.format(nil, nil, headers)
end
"""


def load_wrk(
    base: str, seconds: int, concurrency: int, token: str | None, spread: bool
) -> list[str]:
    """requests/s, p50 and p99 ms as wrk measures them."""
    command = ["wrk", "-t", "1", "-c", str(concurrency), "-d", f"{seconds}s", "--latency"]
    if token:
        command += ["-H", f"Authorization: Bearer {token}"]
    if spread:
        script = Path(os.environ.get("TMPDIR", "/tmp")) / "metering-bench-spread.lua"
        script.write_text(SPREAD_LUA)
        command += ["-s", str(script)]
    out = subprocess.run([*command, f"{base}/hello"], capture_output=True, text=True, check=True)
    if "Non-2xx" in out.stdout:
        raise SystemExit(f"wrk saw failed requests:\n{out.stdout}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out.stdout).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"50%\s+(\S+)", out.stdout).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"99%\s+(\S+)", out.stdout).group(1))  # type: ignore[union-attr]
    return [f"{rate:,.0f}", f"{p50:.2f}", f"{p99:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=10, help="per case, with wrk")
    args = parser.parse_args()
    rows = []
    bare = 0.0  # the first case, without the middleware: the peer
    with durable_postgres() as server:
        server.create_database("bench")
        url = server.url("bench")
        upgrade_schema(url)
        with Meter(url) as meter:
            meter.set_limit(Limit("per_ip", maximum=10**12, period="1h"))
            meter.set_limit(Limit("per_user", maximum=10**12, period="1h"))
        cases = [
            ("no middleware", "none", None, False),
            ("per-IP limit (consume), 1 client", "ip", None, False),
            ("per-IP limit (consume), 10,000 clients", "ip", None, True),
            ("stacked, authenticated (reserve, consume, cancel), 1 user", "stacked", "ada", False),
            ("stacked, authenticated, 10,000 users", "stacked", "ada", True),
            ("stacked, anonymous (reserve, commit), 10,000 clients", "stacked", None, True),
        ]
        for name, mode, token, spread in cases:
            if spread and not shutil.which("wrk"):
                continue
            process, base = serve(mode, url)
            try:
                asyncio.run(load(base, 200, args.concurrency, token))  # warm up
                if shutil.which("wrk"):
                    row = load_wrk(base, args.seconds, args.concurrency, token, spread)
                else:
                    figures = asyncio.run(load(base, args.requests, args.concurrency, token))
                    row = [f"{figures.rate:,.0f}", *figures.row()[3:]]
            finally:
                process.terminate()
                process.wait(30)
            rate = float(row[0].replace(",", ""))
            bare = bare or rate
            rows.append([name, *row, f"{rate / bare:.2f}"])
            print(f"  {name:52} {row[0]:>8} requests/s", flush=True)
    print_table(
        f"middleware overhead (uvicorn, 1 process, {args.concurrency} in flight, "
        f"{'wrk' if shutil.which('wrk') else 'httpx'}, durable PostgreSQL)",
        ["app", "requests/s", "p50 ms", "p99 ms", "ratio to the bare app"],
        rows,
    )


if __name__ == "__main__":
    main()
