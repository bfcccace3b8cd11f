"""What API keys cost a request: the key's lookup, and the per-key rate limit.

    .venv/bin/python bench/bench_api_auth.py [--requests 2000]

On SQLite (a file, WAL) and on a durable PostgreSQL this starts itself:

(1) `ApiKeys.authenticate` called directly: one primary-key read per call
    (the last use is written once a minute, so not here); p50/p99.
(2) three ``metering serve`` processes side by side, each on its own
    database, answering ``GET /v1/subjects/{subject}/usage`` (a read route):
    ``open`` (no key exists: the API answers everyone), ``key`` (a read
    key, ``METERING_API_RATE=off``: the lookup only) and ``key + rate``
    (the same with the per-key limit on: one more transaction, the
    middleware's token bucket). Requests go to the three in turn, one at a
    time, so load elsewhere on the machine falls on all three alike;
    p50/p99 of each and the difference of the p50s.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from common import ROOT, durable_postgres, print_table

from metering import Meter
from metering.apikeys import ApiKeys
from metering.storage.connections import upgrade_schema

ROUTE = "/v1/subjects/org-1/usage"


def percentiles(samples_ns: list[int]) -> tuple[float, float]:
    ordered = sorted(samples_ns)
    return (
        ordered[len(ordered) // 2] / 1000,
        ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] / 1000,
    )


def timed(call: Callable[[], object], count: int) -> list[int]:
    samples = []
    for _ in range(count):
        began = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - began)
    return samples


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(url: str, workdir: Path, rate: str) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env |= {
        "METERING_DATABASE_URL": url,
        "METERING_BROKER_URL": f"sqla+sqlite:///{workdir}/broker-{port}.db",
        "METERING_API_RATE": rate,
        "PYTHONPATH": str(ROOT),  # this tree's metering, wherever it is installed from
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "metering",
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env=env,
        cwd=workdir,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(base + "/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("metering serve did not start") from None
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        server.wait(30)


def measure(label: str, urls: dict[str, str], workdir: Path, count: int) -> list[list[str]]:
    import httpx

    rows = []
    meter = Meter(urls["key"])
    keys = ApiKeys(meter)
    _key, token = keys.create("read", name="bench")
    for _ in range(300):
        keys.authenticate(token)
    p50, p99 = percentiles(timed(lambda: keys.authenticate(token), count))
    rows.append([label, "ApiKeys.authenticate()", f"{p50:.0f}", f"{p99:.0f}", ""])
    with Meter(urls["rate"]) as rate_meter:
        _rate_key, rate_token = ApiKeys(rate_meter).create("read", name="bench")
    meter.close()
    setups = {
        "open": (urls["open"], "off", {}),
        "key": (urls["key"], "off", {"Authorization": f"Bearer {token}"}),
        "key + rate": (urls["rate"], "1000000000/1m", {"Authorization": f"Bearer {rate_token}"}),
    }
    samples: dict[str, list[int]] = {name: [] for name in setups}
    with ExitStack() as stack:
        clients = {}
        for name, (url, rate, headers) in setups.items():
            base = stack.enter_context(serving(url, workdir, rate))
            client = stack.enter_context(httpx.Client(base_url=base, headers=headers))
            clients[name] = client
        for _ in range(200):  # warm up
            for client in clients.values():
                assert client.get(ROUTE).status_code == 200
        for _ in range(count):
            for name, client in clients.items():
                began = time.perf_counter_ns()
                answer = client.get(ROUTE)
                samples[name].append(time.perf_counter_ns() - began)
                assert answer.status_code == 200, answer.text
    open_p50 = percentiles(samples["open"])[0]
    for name, found in samples.items():
        p50, p99 = percentiles(found)
        extra = "" if name == "open" else f"+{p50 - open_p50:.0f}"
        rows.append([label, f"GET usage, {name}", f"{p50:.0f}", f"{p99:.0f}", extra])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="metering-bench-auth-") as tmp:
        workdir = Path(tmp)
        sqlite = {name: f"sqlite:///{workdir}/{name}.db" for name in ("open", "key", "rate")}
        for url in sqlite.values():
            Meter(url).close()
        rows += measure("SQLite", sqlite, workdir, args.requests)
        with durable_postgres() as server:
            postgres = {}
            for name in ("open", "key", "rate"):
                server.create_database(f"auth_{name}")
                postgres[name] = server.url(f"auth_{name}")
                upgrade_schema(postgres[name])
            rows += measure("PostgreSQL", postgres, workdir, args.requests)
    print_table(
        f"API keys per request ({os.cpu_count()} cores, {args.requests} requests each)",
        ["database", "what", "p50 µs", "p99 µs", "p50 over open"],
        rows,
    )


if __name__ == "__main__":
    main()
