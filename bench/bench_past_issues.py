"""What a recurring grant's past issues cost the hot path: 1 issue against 12 and 36 per pair.

    .venv/bin/python bench/bench_past_issues.py [--subjects 500] [--issues 1 12 36]
                                                [--batches 10] [--calls 600] [--sqlite-only]

One database per issue count on one durable PostgreSQL (``pg_stat_statements``),
and one SQLite file each: a monthly calendar limit of 1 and a recurring grant
(``every="1mo"``) on every subject, paying every event. Its past issues are
made as they would be: a frozen clock moved month by month, two events of
every subject a month (one drawn on that month's issue), so each database
holds that many issues per pair, all but the last expired. Then, in one
process, the databases in turn (the order turning every pass): `Meter.apply`
of 1,000-event batches and slices of ten `Meter.consume` calls. Prints per
database the client's thread CPU and wall (sums), their ratio to 1 issue (the
median of the per-pass ratios), and on PostgreSQL the server time of the
statements that read the grants (per batch).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import make_base_dir

from metering import FrozenClock, Limit, Meter, make_event
from metering.storage.connections import upgrade_schema

BIG = 10**12
NOW = datetime(2027, 6, 15, 12, tzinfo=UTC)
SLICE = 10


def month_before(at: datetime, months: int) -> datetime:
    index = at.year * 12 + at.month - 1 - months
    return at.replace(year=index // 12, month=index % 12 + 1)


def prepare(url: str, subjects: list[str], issues: int) -> None:
    """The limit, the recurring grant and ``issues`` issues per subject, the last in force now."""
    clock = FrozenClock(month_before(NOW, issues - 1))
    with Meter(url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=1, period="1mo", window="calendar"))
        for subject in subjects:
            meter.grant(subject, "calls", BIG, grant_id=f"monthly-{subject}", every="1mo")
        for month in range(issues):
            clock.set(month_before(NOW, issues - 1 - month))
            events = [make_event([(s, "calls", 1)], clock()) for s in subjects for _ in (0, 1)]
            for decided in meter.apply(events):
                assert getattr(decided, "allowed", False), decided
        assert len(meter.grants(subjects[0])) == issues


def measure(urls: dict[int, str], subjects: list[str], batches: int, calls: int) -> dict[str, Any]:
    """Apply and consume on every database in turn; thread CPU and wall per pass."""
    clock = FrozenClock(NOW)
    meters = {n: Meter(url, clock=clock) for n, url in urls.items()}
    rng = random.Random(7)
    for meter in meters.values():  # warm: caches, connections, the pages read
        meter.apply([make_event([(rng.choice(subjects), "calls", 1)], NOW) for _ in range(100)])
        for _ in range(5):
            meter.consume(rng.choice(subjects), "calls")
    order = list(urls)
    found: dict[str, dict[int, list[tuple[int, int]]]] = {
        "apply": {n: [] for n in urls},
        "consume": {n: [] for n in urls},
    }
    for number in range(batches):
        picks = [rng.choice(subjects) for _ in range(1000)]
        turn = number % len(order)
        for n in order[turn:] + order[:turn]:
            events = [make_event([(s, "calls", 1)], NOW) for s in picks]
            cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
            assert all(getattr(d, "allowed", False) for d in meters[n].apply(events))
            found["apply"][n].append((time.thread_time_ns() - cpu, time.perf_counter_ns() - wall))
    for number in range(calls // SLICE):
        picks = [rng.choice(subjects) for _ in range(SLICE)]
        turn = number % len(order)
        for n in order[turn:] + order[:turn]:
            cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
            for s in picks:
                meters[n].consume(s, "calls")
            found["consume"][n].append((time.thread_time_ns() - cpu, time.perf_counter_ns() - wall))
    for meter in meters.values():
        meter.close()
    return found


def report(
    title: str, found: dict[str, dict[int, list[tuple[int, int]]]], per: dict[str, int]
) -> None:
    for op, by in found.items():
        base = by[min(by)]
        print(f"{title} {op} (per {per[op]}):")
        for n, rows in by.items():
            cpu = sum(r[0] for r in rows) / len(rows) / 1e6
            wall = sum(r[1] for r in rows) / len(rows) / 1e6
            r_cpu = statistics.median(a[0] / b[0] for a, b in zip(rows, base, strict=True))
            r_wall = statistics.median(a[1] / b[1] for a, b in zip(rows, base, strict=True))
            print(
                f"  {n:>3} issues: cpu {cpu:8.2f} ms, wall {wall:8.2f} ms;"
                f" to {min(by)}: cpu {r_cpu:.3f}, wall {r_wall:.3f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subjects", type=int, default=500)
    parser.add_argument("--issues", type=int, nargs="+", default=[1, 12, 36])
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--sqlite-only", action="store_true")
    args = parser.parse_args()
    subjects = [f"org-{n}" for n in range(args.subjects)]
    per = {"apply": 1000, "consume": SLICE}
    base = make_base_dir(Path(tempfile.gettempdir()), prefix="metering-past-")
    sqlite = {n: f"sqlite:///{base}/past-{n}.db" for n in args.issues}
    for n, url in sqlite.items():
        prepare(url, subjects, n)
    report("SQLite", measure(sqlite, subjects, args.batches, args.calls), per)
    if args.sqlite_only:
        return
    import psycopg
    from servers import PostgresServer

    settings = {"shared_preload_libraries": "pg_stat_statements"}
    server = PostgresServer(
        make_base_dir(Path(tempfile.gettempdir()), prefix="metering-past-pg-"),
        durable=True,
        settings=settings,
    )
    server.start()
    try:
        urls = {}
        for n in args.issues:
            server.create_database(f"past_{n}")
            urls[n] = server.url(f"past_{n}")
            upgrade_schema(urls[n])
            prepare(urls[n], subjects, n)
        admin = psycopg.connect(server.url().replace("+psycopg", ""), autocommit=True)
        admin.execute("CREATE EXTENSION pg_stat_statements")
        admin.execute("VACUUM ANALYZE")
        for n in args.issues:
            with psycopg.connect(urls[n].replace("+psycopg", ""), autocommit=True) as c:
                c.execute("VACUUM ANALYZE")
        admin.execute("SELECT pg_stat_statements_reset()")
        report("PostgreSQL", measure(urls, subjects, args.batches, args.calls), per)
        rows = admin.execute(
            "SELECT d.datname, s.query, s.calls, s.total_exec_time"
            " FROM pg_stat_statements AS s JOIN pg_database AS d ON d.oid = s.dbid"
            " WHERE s.toplevel"
        ).fetchall()
        admin.close()
        print("PostgreSQL server time (ms, all statements; those reading grants):")
        for n in args.issues:
            mine = [r for r in rows if r[0] == f"past_{n}"]
            total = sum(r[3] for r in mine)
            grants = [r for r in mine if "FROM grants" in r[1] or "metering_consume" in r[1]]
            print(f"  {n:>3} issues: all {total:9.1f}")
            for _, query, count, ms in sorted(grants, key=lambda r: -r[3])[:4]:
                head = " ".join(query.split())[:70]
                print(f"      {ms:9.1f} ms {count:6} calls {ms / count:7.3f}/call  {head}")
    finally:
        server.destroy()


if __name__ == "__main__":
    main()
