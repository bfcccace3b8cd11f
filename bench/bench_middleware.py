"""Middleware overhead per request: the same FastAPI app with and without it.

    .venv/bin/python bench/bench_middleware.py [--seconds 5] [--rounds 3] [--concurrency 16]

Starts a durable PostgreSQL, then serves `middleware_app.py` with uvicorn
(one process) in each case, one after the other: no middleware (the peer),
one per-IP limit, and the stacked pair (per-IP reservation, authentication,
per-user limit), each with quota leases off (``leases=False``: every
request to the database, as before leases) and on (the default), from one
client address, 10,000 addresses, or 100 users. The load generator keeps
``concurrency`` requests in flight on the same machine and reports
requests/s and latency p50/p99: ``wrk`` when it is installed (Debian:
``apt-get install wrk``), else an httpx async client, which is much slower
than the server and then bounds the figures (and cannot spread addresses).
Each case is first warmed up for five seconds with the same mix of clients
(long enough for 200 keys to become hot: each takes 8 requests on the
database first).
With ``--rounds N`` every case runs N times, round after round, and the
table gives the median of each column (each ratio is to the bare app of
its own round).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from common import Figures, durable_postgres, print_table

from metering import Limit, Meter
from metering.storage.connections import upgrade_schema

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(mode: str, url: str, leases: bool) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {
        **os.environ,
        "METERING_DATABASE_URL": url,
        "METERING_BENCH_MODE": mode,
        "METERING_BENCH_LEASES": "1" if leases else "0",
    }
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


# Each request from one of SPREAD client addresses (and users), through a
# proxy the app trusts: many counters, as in real traffic. wrk's Lua is
# LuaJIT (Lua 5.1): no ``//``. A script wrk cannot load is reported on
# stderr and then ignored, so `load_wrk` refuses any stderr.
SPREAD_LUA = """
request = function()
  local n = math.random(0, SPREAD - 1)
  local headers = {["X-Forwarded-For"] = "10.1." .. math.floor(n / 100) .. "." .. (n % 100)}
  if wrk.headers["Authorization"] then headers["Authorization"] = "Bearer user-" .. n end
  return wrk.format(nil, nil, headers)
end
"""


def load_wrk(
    base: str, seconds: int, concurrency: int, token: str | None, spread: int
) -> list[str]:
    """requests/s, p50 and p99 ms as wrk measures them."""
    command = ["wrk", "-t", "1", "-c", str(concurrency), "-d", f"{seconds}s", "--latency"]
    if token:
        command += ["-H", f"Authorization: Bearer {token}"]
    if spread:
        script = Path(os.environ.get("TMPDIR", "/tmp")) / f"metering-bench-spread-{spread}.lua"
        script.write_text(SPREAD_LUA.replace("SPREAD", str(spread)))
        command += ["-s", str(script)]
    out = subprocess.run([*command, f"{base}/hello"], capture_output=True, text=True, check=True)
    if out.stderr.strip():
        raise SystemExit(f"wrk complained:\n{out.stderr}")
    if "Non-2xx" in out.stdout:
        raise SystemExit(f"wrk saw failed requests:\n{out.stdout}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out.stdout).group(1))  # type: ignore[union-attr]
    # The distribution's lines, not a "92.50%" of the thread statistics.
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out.stdout, re.M).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out.stdout, re.M).group(1))  # type: ignore[union-attr]
    return [f"{rate:,.0f}", f"{p50:.2f}", f"{p99:.2f}"]


WARM_UP_SECONDS = 5
# (name, app mode, bearer token, client addresses (0: one), leases)
CASES = [
    ("no middleware", "none", None, 0, False),
    ("per-IP limit, 1 client, leases off", "ip", None, 0, False),
    ("per-IP limit, 1 client, leases on", "ip", None, 0, True),
    ("per-IP limit, 10,000 clients, leases off", "ip", None, 10_000, False),
    ("per-IP limit, 10,000 clients, leases on", "ip", None, 10_000, True),
    ("stacked per-IP + per-user, 100 users, leases off", "stacked", "ada", 100, False),
    ("stacked per-IP + per-user, 100 users, leases on", "stacked", "ada", 100, True),
    ("stacked, anonymous, 10,000 clients, leases on", "stacked", None, 10_000, True),
]


def run_case(
    url: str, args: argparse.Namespace, case: tuple[str, str, str | None, int, bool]
) -> list[str]:
    """requests/s, p50 ms, p99 ms of one case."""
    _name, mode, token, spread, leases = case
    process, base = serve(mode, url, leases)
    try:
        asyncio.run(load(base, 200, args.concurrency, token))  # warm up
        if shutil.which("wrk"):
            # Warm up with the same mix of clients: the steady state of a
            # server that has been running (its keys hot, or cold, as they are).
            load_wrk(base, WARM_UP_SECONDS, args.concurrency, token, spread)
            return load_wrk(base, args.seconds, args.concurrency, token, spread)
        figures = asyncio.run(load(base, args.requests, args.concurrency, token))
        return [f"{figures.rate:,.0f}", *figures.row()[3:]]
    finally:
        process.terminate()
        process.wait(30)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=10, help="per case, with wrk")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every case; medians")
    parser.add_argument("--only", default="", help="cases whose name has this (and the bare app)")
    args = parser.parse_args()
    cases = [c for c in CASES if not c[3] or shutil.which("wrk")]
    cases = [c for i, c in enumerate(cases) if i == 0 or args.only in c[0]]
    measured: dict[str, list[tuple[float, float, float, float]]] = {c[0]: [] for c in cases}
    with durable_postgres() as server:
        server.create_database("bench")
        url = server.url("bench")
        upgrade_schema(url)
        with Meter(url) as meter:
            meter.set_limit(Limit("per_ip", maximum=10**12, period="1h"))
            meter.set_limit(Limit("per_user", maximum=10**12, period="1h"))
        for round_number in range(1, args.rounds + 1):
            bare = 0.0  # the first case, without the middleware: the peer
            for case in cases:
                row = run_case(url, args, case)
                rate = float(row[0].replace(",", ""))
                bare = bare or rate
                figures = (rate, float(row[1]), float(row[2]), rate / bare)
                measured[case[0]].append(figures)
                print(f"  round {round_number}: {case[0]:52} {row[0]:>8} requests/s", flush=True)
    rows = []
    for name, runs in measured.items():
        rate, p50, p99, ratio = (_median([run[i] for run in runs]) for i in range(4))
        rows.append([name, f"{rate:,.0f}", f"{p50:.2f}", f"{p99:.2f}", f"{ratio:.2f}"])
    print_table(
        f"middleware overhead (uvicorn, 1 process, {args.concurrency} in flight, "
        f"{'wrk' if shutil.which('wrk') else 'httpx'}, durable PostgreSQL"
        f"{f', medians of {args.rounds} rounds' if args.rounds > 1 else ''})",
        ["app", "requests/s", "p50 ms", "p99 ms", "ratio to the bare app"],
        rows,
    )


if __name__ == "__main__":
    main()
