"""The queued pipeline on PostgreSQL, against one upsert per event.

    .venv/bin/python bench/bench_pipeline.py [--events 40000]

Starts a durable PostgreSQL (fsync on) and a Redis (append-only), then:

(a) the batch-apply function alone (`metering.pipeline.apply_batch`),
    1,000-event batches over 10,000 subjects, one process;
(b) end to end: producer -> Redis -> `celery -A workers worker` (prefork,
    2 processes) -> PostgreSQL -> results; events/s from the first emit to
    the last result, and event-to-result latency p50/p99 read from the
    ledger (``decided_at - occurred_at``);
(c) the baseline: one ``INSERT ... ON CONFLICT DO UPDATE`` per event in its
    own transaction, 1 and 4 processes;
(d) the embedded default end to end (SQLite broker and database, one worker).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_consume import BASELINE_DDL, baseline_job
from common import ROOT, durable_postgres, make_base_dir, print_table, run_parallel
from servers import RedisServer
from sqlalchemy import create_engine, select, text

from metering import Limit, Meter, make_event
from metering.pipeline import apply_batch, encode_batch, encode_event
from metering.producer import UsageProducer
from metering.storage.engine import upgrade_schema
from metering.storage.tables import results

SUBJECTS = 10_000
LIMIT = Limit("calls", maximum=10**12, period="1d", window="calendar")


def subjects(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [f"subject-{rng.randrange(SUBJECTS)}" for _ in range(n)]


def batch_apply(url: str, events: int) -> tuple[float, float]:
    """(events/s, ms per 1,000-event batch) of apply_batch alone."""
    meter = Meter(url)
    payloads = []
    for seed in range(events // 1000):
        now = meter.clock()
        batch = [encode_event(make_event([(s, "calls", 1)], now)) for s in subjects(seed, 1000)]
        payloads.append(encode_batch(batch))
    apply_batch(meter, payloads[0])  # warm the statement caches
    began = time.perf_counter()
    for payload in payloads[1:]:
        apply_batch(meter, payload)
    seconds = time.perf_counter() - began
    meter.close()
    done = 1000 * (len(payloads) - 1)
    return done / seconds, 1000 * seconds / (len(payloads) - 1)


def start_worker(
    database_url: str, broker_url: str, log: Path, pool: list[str]
) -> subprocess.Popen[bytes]:
    env = dict(os.environ, METERING_DATABASE_URL=database_url, METERING_BROKER_URL=broker_url)
    command = [sys.executable, "-m", "celery", "-A", "workers", "worker", "--loglevel", "WARNING"]
    command += ["--without-heartbeat", "--without-gossip", "--without-mingle", *pool]
    with log.open("wb") as out:
        worker = subprocess.Popen(
            command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
            start_new_session=True,
        )
    time.sleep(3)
    return worker


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)


def end_to_end(
    database_url: str, broker_url: str, events: int, workdir: Path, pool: list[str]
) -> dict[str, float]:
    meter = Meter(database_url)
    before = meter.count_results()
    worker = start_worker(database_url, broker_url, workdir / "worker.log", pool)
    try:
        began = time.perf_counter()
        with UsageProducer(broker_url, batch_size=1000, flush_interval=0.05) as producer:
            for subject in subjects(99, events):
                producer.emit(subject, "calls")
        emitted = time.perf_counter() - began
        deadline = time.monotonic() + 600
        while meter.count_results() < before + events and time.monotonic() < deadline:
            time.sleep(0.05)
        seconds = time.perf_counter() - began
    finally:
        stop_worker(worker)
    with meter.engine.connect() as connection:
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
        engine = create_engine(url)
        with engine.begin() as connection:
            connection.execute(text(BASELINE_DDL))
        engine.dispose()

        rate, per_batch = batch_apply(url, args.events)
        rows.append(
            [
                "(a) apply_batch alone, 1,000-event batches",
                "1",
                f"{rate:,.0f}",
                f"{per_batch:.0f} per batch",
                "",
            ]
        )
        print(f"  (a) {rate:,.0f} events/s", flush=True)

        figures = end_to_end(url, redis.url(), args.events, workdir, ["--concurrency", "2"])
        rows.append(
            [
                "(b) producer → Redis → worker → PostgreSQL",
                "2 worker processes",
                f"{figures['rate']:,.0f}",
                f"{figures['p50_ms']:.0f}",
                f"{figures['p99_ms']:.0f}",
            ]
        )
        print(f"  (b) {figures}", flush=True)

        for processes in (1, 4):
            base = run_parallel("baseline", baseline_job(url, SUBJECTS), processes, 2000)  # type: ignore[arg-type]
            rows.append(
                [
                    "(c) baseline: one upsert per transaction",
                    str(processes),
                    f"{base.rate:,.0f}",
                    f"{base.percentile_ms(0.5):.2f}",
                    f"{base.percentile_ms(0.99):.2f}",
                ]
            )
            print(f"  (c) x{processes}: {base.rate:,.0f} events/s", flush=True)

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
        ]
    )
    print(f"  (d) {figures}", flush=True)
    print_table(
        f"pipeline on PostgreSQL (durable), {args.events:,} events, {SUBJECTS:,} subjects",
        ["path", "processes", "events/s", "p50 ms", "p99 ms"],
        rows,
    )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
