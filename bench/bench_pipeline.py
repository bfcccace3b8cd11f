"""The queued pipeline on PostgreSQL against the aggregate upsert, in the same run.

    .venv/bin/python bench/bench_pipeline.py [--events 40000]

Starts a durable PostgreSQL (fsync on) and a Redis (append-only), then over
the same events (1,000-event batches, 10,000 subjects, a calendar window):

(p) the peer: one ``unnest`` + ``GROUP BY`` upsert per batch
    (`peers.aggregate_upsert`), which decides and records nothing;
(a) the batch-apply function alone (`metering.pipeline.batches.apply_batch`), one
    process;
(e) the same, two processes, each applying its own half of the subjects
    (what two workers on subject-partitioned queues do);
(b) end to end: producer -> Redis -> `celery -A workers worker` (prefork,
    2 processes) -> PostgreSQL -> results; events/s from the first emit to
    the last result, and event-to-result latency p50/p99 read from the
    ledger (``decided_at - occurred_at``);
(d) the embedded default end to end (SQLite broker and database, one worker).

Each PostgreSQL row prints its ratio to (p).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, durable_postgres, make_base_dir, print_table, start_worker, stop_worker
from peers import aggregate_upsert, install
from servers import RedisServer
from sqlalchemy import select

from metering import Limit, Meter, make_event
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event
from metering.pipeline.producer import UsageProducer
from metering.storage.connections import upgrade_schema
from metering.storage.tables import results

SUBJECTS = 10_000
LIMIT = Limit("calls", maximum=10**12, period="1d", window="calendar")


def subjects(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [f"subject-{rng.randrange(SUBJECTS)}" for _ in range(n)]


def batches_of(events: int) -> list[list[str]]:
    return [subjects(seed, 1000) for seed in range(events // 1000)]


def payloads_of(batches: list[list[str]], meter: Meter) -> list[dict[str, Any]]:
    now = meter.clock()
    return [
        encode_batch([encode_event(make_event([(s, "calls", 1)], now)) for s in batch])
        for batch in batches
    ]


def batch_apply(url: str, batches: list[list[str]]) -> tuple[float, float]:
    """(events/s, ms per 1,000-event batch) of apply_batch alone, one process."""
    meter = Meter(url)
    payloads = payloads_of(batches, meter)
    apply_batch(meter, payloads[0])  # warm the caches and prepared statements
    began = time.perf_counter()
    for payload in payloads[1:]:
        apply_batch(meter, payload)
    seconds = time.perf_counter() - began
    meter.close()
    done = 1000 * (len(payloads) - 1)
    return done / seconds, 1000 * seconds / (len(payloads) - 1)


def _apply_partition(url: str, batches: list[list[str]], start: Any, out: Any) -> None:
    meter = Meter(url)
    payloads = payloads_of(batches, meter)
    apply_batch(meter, payloads[0])
    start.wait(60)
    for payload in payloads[1:]:
        apply_batch(meter, payload)
    out.put(1000 * (len(payloads) - 1))
    meter.close()


def partitioned_apply(url: str, batches: list[list[str]]) -> float:
    """Events/s of two processes, each applying the batches of its half of the subjects."""
    flat = [s for batch in batches for s in batch]
    halves = [[s for s in flat if hash(s) % 2 == part] for part in (0, 1)]
    parts = [[half[i : i + 1000] for i in range(0, len(half), 1000)] for half in halves]
    context = multiprocessing.get_context("fork")
    start, out = context.Event(), context.Queue()
    procs = [
        context.Process(target=_apply_partition, args=(url, part, start, out)) for part in parts
    ]
    for proc in procs:
        proc.start()
    time.sleep(3)  # both have encoded their payloads and warmed up
    began = time.perf_counter()
    start.set()
    done = sum(out.get(timeout=600) for _ in procs)
    seconds = time.perf_counter() - began
    for proc in procs:
        proc.join(60)
    return done / seconds


def end_to_end(
    database_url: str, broker_url: str, events: int, workdir: Path, pool: list[str]
) -> dict[str, float]:
    meter = Meter(database_url)
    before = meter.count_results()
    worker = start_worker(database_url, broker_url, workdir / "worker.log", pool)
    try:
        began = time.perf_counter()
        with UsageProducer(broker_url, batch_size=1000, flush_interval_seconds=0.05) as producer:
            for subject in subjects(99, events):
                producer.emit(subject, "calls")
        emitted = time.perf_counter() - began
        deadline = time.monotonic() + 600
        while meter.count_results() < before + events and time.monotonic() < deadline:
            time.sleep(0.05)
        seconds = time.perf_counter() - began
    finally:
        stop_worker(worker)
    with meter.sql_engine.connect() as connection:
        rows = (
            connection.execute(
                select(results.c.decided_at_us - results.c.occurred_at_us)
                .order_by(results.c.decided_at_us.desc())
                .limit(events)
            )
            .scalars()
            .all()
        )
    meter.close()
    latencies = sorted(rows)
    return {
        "rate": events / seconds,
        "emit_rate": events / emitted,
        "p50_ms": latencies[len(latencies) // 2] / 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] / 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=40_000, help="events per measurement")
    args = parser.parse_args()
    rows: list[list[str]] = []
    workdir = Path(tempfile.mkdtemp(prefix="metering-bench-"))
    with durable_postgres() as server, RedisServer(make_base_dir(workdir, "redis-")) as redis:
        redis.start()
        server.create_database("bench")
        url = server.url("bench")
        upgrade_schema(url)
        with Meter(url) as meter:
            meter.set_limit(LIMIT)
        install(url)
        batches = batches_of(args.events)

        peer = aggregate_upsert(url, [[(s, "calls", 1) for s in b] for b in batches])
        rows.append(["(p) peer: unnest + GROUP BY upsert", "1", f"{peer:,.0f}", "", "", "1.00"])
        print(f"  (p) {peer:,.0f} events/s", flush=True)

        rate, per_batch = batch_apply(url, batches)
        rows.append(
            [
                "(a) apply_batch alone, 1,000-event batches",
                "1",
                f"{rate:,.0f}",
                f"{per_batch:.0f} per batch",
                "",
                f"{rate / peer:.2f}",
            ]
        )
        print(f"  (a) {rate:,.0f} events/s", flush=True)

        rate = partitioned_apply(url, batches)
        rows.append(
            [
                "(e) apply_batch, subjects partitioned over 2 processes",
                "2",
                f"{rate:,.0f}",
                "",
                "",
                f"{rate / peer:.2f}",
            ]
        )
        print(f"  (e) {rate:,.0f} events/s", flush=True)

        figures = end_to_end(url, redis.url(), args.events, workdir, ["--concurrency", "2"])
        rows.append(
            [
                "(b) producer → Redis → worker → PostgreSQL",
                "2 worker processes",
                f"{figures['rate']:,.0f}",
                f"{figures['p50_ms']:.0f}",
                f"{figures['p99_ms']:.0f}",
                f"{figures['rate'] / peer:.2f}",
            ]
        )
        print(f"  (b) {figures}", flush=True)

    embedded = workdir / "embedded"
    embedded.mkdir()
    db_url = f"sqlite:///{embedded}/metering.db"
    with Meter(db_url) as meter:
        meter.set_limit(LIMIT)
    figures = end_to_end(
        db_url,
        f"sqla+sqlite:///{embedded}/broker.db",
        args.events // 4,
        embedded,
        ["--pool", "solo"],
    )
    rows.append(
        [
            "(d) embedded default: SQLite broker and database",
            "1 worker",
            f"{figures['rate']:,.0f}",
            f"{figures['p50_ms']:.0f}",
            f"{figures['p99_ms']:.0f}",
            "",
        ]
    )
    print(f"  (d) {figures}", flush=True)
    print_table(
        f"pipeline on PostgreSQL (durable), {args.events:,} events, {SUBJECTS:,} subjects",
        ["path", "processes", "events/s", "p50 ms", "p99 ms", "ratio to (p)"],
        rows,
    )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
