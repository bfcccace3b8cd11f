"""The hot path with entitlements and grants on 10% of subjects, against without.

    .venv/bin/python bench/bench_allowances.py [--events 20000] [--rounds 3]

Two databases on one durable PostgreSQL (fsync on), the same limit (a
calendar day, high enough that nothing is denied) and the same events over
10,000 subjects. In the second, 1,000 of the subjects (10%) have an
entitlement of their own and two grants (one expiring, one not), and a
quarter of those have used up their own allowance, so their events are paid
by grants. The peer is the first database: the same code with no
entitlement and no grant. Rounds alternate between the two so that the
machine's drift hits both alike; each figure is the median round.

(a) batch apply (`metering.pipeline.batches.apply_batch`, 1,000-event batches);
(b) `Meter.consume`, one process.

Prints events/s, p50/p99 and the ratio of each path with allowances to the
same path without.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from common import durable_postgres, print_table
from servers import PostgresServer

from metering import Limit, Meter, make_event
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event
from metering.storage.connections import upgrade_schema

SUBJECTS = 10_000
ENTITLED = SUBJECTS // 10
DEFAULT_MAXIMUM = 10**9
LIMIT = Limit("calls", maximum=DEFAULT_MAXIMUM, period="1d", window="calendar")


def subject(n: int) -> str:
    return f"subject-{n}"


def prepare(server: PostgresServer, name: str, allowances: bool) -> str:
    server.create_database(name)
    url = server.url(name)
    upgrade_schema(url)
    with Meter(url) as meter:
        meter.set_limit(LIMIT)
        if not allowances:
            return url
        later = datetime.now(UTC) + timedelta(days=30)
        for n in range(ENTITLED):
            # Every tenth subject: 0, 10, 20 ...; a quarter of them are at
            # their own maximum already, so their events draw on grants.
            who = subject(n * 10)
            exhausted = n % 4 == 0
            own = 10 if exhausted else 10**8 + n
            meter.set_entitlement(who, "calls", own)
            meter.grant(who, "calls", 10**7, later, grant_id=f"month-{n}")
            meter.grant(who, "calls", 10**7, grant_id=f"forever-{n}")
            if exhausted:
                meter.consume(who, "calls", 10)
    return url


def batches(seed: int, count: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[subject(rng.randrange(SUBJECTS)) for _ in range(1000)] for _ in range(count)]


def batch_round(url: str, seed: int, count: int) -> tuple[float, list[float]]:
    meter = Meter(url)
    now = meter.clock()
    payloads = [
        encode_batch([encode_event(make_event([(s, "calls", 1)], now)) for s in batch])
        for batch in batches(seed, count + 1)
    ]
    apply_batch(meter, payloads[0])  # warm the caches and prepared statements
    times = []
    began = time.perf_counter()
    for payload in payloads[1:]:
        start = time.perf_counter()
        apply_batch(meter, payload)
        times.append(time.perf_counter() - start)
    seconds = time.perf_counter() - began
    meter.close()
    return 1000 * count / seconds, times


def consume_round(url: str, seed: int, events: int) -> tuple[float, list[float]]:
    meter = Meter(url)
    meter.consume("warm-up", "calls")
    rng = random.Random(seed)
    times = []
    began = time.perf_counter()
    for _ in range(events):
        start = time.perf_counter()
        meter.consume(subject(rng.randrange(SUBJECTS)), "calls")
        times.append(time.perf_counter() - start)
    seconds = time.perf_counter() - began
    meter.close()
    return events / seconds, times


def percentile_ms(times: list[float], q: float) -> str:
    ordered = sorted(times)
    return f"{1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}"


def measure(run: Any, urls: dict[str, str], rounds: int, size: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {name: [] for name in urls}
    times: dict[str, list[float]] = {name: [] for name in urls}
    for round_ in range(rounds):
        for name, url in urls.items():
            rate, taken = run(url, 1000 + round_, size)
            rates[name].append(rate)
            times[name].extend(taken)
            print(f"  {run.__name__} {name} round {round_ + 1}: {rate:,.0f}/s", flush=True)
    return {name: (statistics.median(rates[name]), times[name]) for name in urls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000, help="events per batch round")
    parser.add_argument("--consume", type=int, default=2_000, help="events per consume round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows: list[list[str]] = []
    with durable_postgres() as server:
        urls = {
            "without": prepare(server, "plain", allowances=False),
            "with 10%": prepare(server, "entitled", allowances=True),
        }
        for label, run, size in (
            ("batch apply, 1,000 per batch", batch_round, args.events // 1000),
            ("Meter.consume, 1 process", consume_round, args.consume),
        ):
            found = measure(run, urls, args.rounds, size)
            peer = found["without"][0]
            unit = "batch" if run is batch_round else "event"
            for name, (rate, times) in found.items():
                rows.append(
                    [
                        f"{label}, {name}",
                        f"{rate:,.0f}",
                        f"{percentile_ms(times, 0.5)} per {unit}",
                        f"{percentile_ms(times, 0.99)} per {unit}",
                        f"{rate / peer:.2f}",
                    ]
                )
    print_table(
        f"the hot path with entitlements and grants on {ENTITLED:,} of {SUBJECTS:,} subjects",
        ["path", "events/s", "p50 ms", "p99 ms", "ratio to without"],
        rows,
    )


if __name__ == "__main__":
    main()
