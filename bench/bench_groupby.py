"""Usage by dimension on PostgreSQL: the rollups against a scan of the results.

    .venv/bin/python bench/bench_groupby.py [--results 10000000] [--subjects 1000] [--runs 40]

Starts a durable throw-away PostgreSQL and fills, in SQL (``generate_series``;
deciding ten million events through ``consume`` would take far longer than
what is measured):

* ``results``: ``--results`` events of one month, each the ledger's own row
  shape (one charge of ``api`` for one of ``--subjects`` subjects, cost 1 to
  3, metadata ``{"route": "/v1/rN"}`` of 5 routes); one in ten denied;
* ``usage_rollups``: what those events roll up to (``api`` records
  ``route``), aggregated from the same generator: one row per subject, hour
  and route that had usage.

Then it times, for a subject over the month, as p50/p99 over ``--runs``
runs (subjects drawn at random):

(r) `metering.reports.usage_by_dimension` (the rollups, an index range of the
    primary key), read to the end;
(q) the report's statement alone (`usage_by_statement`), on one connection:
    what of (r) is the database's;
(p) the peer: the same figures from ``results`` alone, the charges and
    metadata JSON unpacked and grouped by ``metadata->>'route'`` (there is no
    index on a subject inside the charges JSON, so it reads the table);
    ``--peer-runs`` runs, as it is slow.

Both must give the same rows. Last, the write side, on a second database:
`Meter.apply_records` with 1,000-event batches (10,000 subjects, metadata
with a route on every event), without and with ``dimensions=("route",)`` on
the limit, alternated over ``--write-rounds`` rounds; and `Meter.consume`
one event at a time, the same two ways. Prints events/s and the ratio.

``--covering-key`` then times (q) again with the primary key rebuilt with
``INCLUDE (used, events)`` (as before migration 0037; and a VACUUM): the
statement then reads the key alone (an index-only scan), where the plain key
visits a heap page per row.

``--write-only --plain-only`` runs just the write side without dimensions,
on any version of metering (it passes no ``dimensions``): run it with
``PYTHONPATH`` on a checkout from before the rollups to see what limits
without dimensions paid for them.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from common import durable_postgres, print_table
from sqlalchemy import Engine, create_engine, text

from metering import Limit, Meter, make_event
from metering.domain.instants import to_us
from metering.storage.connections import upgrade_schema
from metering.storage.rollups import DimensionQuery, usage_by_statement

MONTH = datetime(2026, 11, 1, tzinfo=UTC)
MONTH_US = 30 * 86_400 * 1_000_000
HOUR_US = 3_600_000_000
ROUTES = 5
CHUNK = 1_000_000

# Event n: subject n % S, route (n / S) % 5, cost 1 + n % 3, evenly over the
# month; n % 10 = 9 is denied (its charge consumed nothing).
EVENT = """
SELECT n, 'org-' || (n % :subjects) AS subject, '/v1/r' || ((n / :subjects) % 5) AS route,
       1 + n % 3 AS cost, :start + n * :step AS at_us, n % 10 = 9 AS denied
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS n
"""
FILL_RESULTS = f"""
INSERT INTO results (event_id, outcome, fingerprint, occurred_at_us, decided_at_us,
                     denied_by, reason, charges, metadata)
SELECT 'evt-' || e.n, CASE WHEN e.denied THEN 'denied' ELSE 'allowed' END, md5(e.n::text),
       e.at_us, e.at_us, CASE WHEN e.denied THEN 'api' END, NULL,
       '[["' || e.subject || '","api",' || e.cost || ',' || (NOT e.denied)::text || ',"'
           || CASE WHEN e.denied THEN 'denied' ELSE 'allowed' END
           || '",10,999990,1000000,0,' || :start || ',' || (:start + {MONTH_US}) || ',null]]',
       '{{"route": "' || e.route || '"}}'
FROM ({EVENT}) AS e
"""
FILL_ROLLUPS = f"""
INSERT INTO usage_rollups (subject, limit_name, dimension, hour_start_us, value, used, events)
SELECT e.subject, 'api', 'route', e.at_us - e.at_us % {HOUR_US}, e.route, sum(e.cost), count(*)
FROM ({EVENT}) AS e
WHERE NOT e.denied
GROUP BY 1, 2, 3, 4, 5
ON CONFLICT (subject, limit_name, dimension, hour_start_us, value)
DO UPDATE SET used = usage_rollups.used + excluded.used,
              events = usage_rollups.events + excluded.events
"""
# The primary key without the figures it carries (migration 0009 has them).
COVERING_KEY = """
ALTER TABLE usage_rollups DROP CONSTRAINT usage_rollups_pkey,
    ADD CONSTRAINT usage_rollups_pkey
    PRIMARY KEY (subject, limit_name, dimension, hour_start_us, value) INCLUDE (used, events)
"""
PEER = """
SELECT c->>1 AS limit_name, r.metadata::jsonb->>'route' AS value,
       sum((c->>2)::bigint) AS used, count(*) AS events
FROM results AS r CROSS JOIN LATERAL jsonb_array_elements(r.charges::jsonb) AS c
WHERE r.outcome IN ('allowed', 'overage')
  AND r.occurred_at_us >= :since AND r.occurred_at_us < :until
  AND c->>0 = :subject AND c->>1 = 'api'
GROUP BY 1, 2
ORDER BY used DESC, events DESC, limit_name, value
"""


def fill(engine: Engine, statement: str, results: int, subjects: int) -> float:
    start = to_us(MONTH)
    began = time.perf_counter()
    with engine.begin() as connection:
        for first in range(0, results, CHUNK):
            params = {
                "subjects": subjects,
                "start": start,
                "step": MONTH_US // results,
                "first": first,
                "last": min(results, first + CHUNK) - 1,
            }
            connection.execute(text(statement), params)
    return time.perf_counter() - began


def analyse(engine: Engine) -> None:
    with engine.connect() as connection:
        autocommit = connection.execution_options(isolation_level="AUTOCOMMIT")
        autocommit.execute(text("VACUUM ANALYZE results"))
        autocommit.execute(text("VACUUM ANALYZE usage_rollups"))


def timed_ms(work: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    value = work()
    return 1000 * (time.perf_counter() - began), value


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def read_side(url: str, args: argparse.Namespace) -> list[list[str]]:
    from metering.reports import usage_by_dimension  # not in versions before it (--plain-only)

    engine = create_engine(url)
    seconds = fill(engine, FILL_RESULTS, args.results, args.subjects)
    print(f"filled {args.results:,} results in {seconds:.0f} s", flush=True)
    seconds = fill(engine, FILL_ROLLUPS, args.results, args.subjects)
    analyse(engine)
    with engine.connect() as connection:
        rollups = connection.execute(text("SELECT count(*) FROM usage_rollups")).scalar_one()
        sizes = connection.execute(
            text(
                "SELECT pg_size_pretty(pg_total_relation_size('results')), "
                "pg_size_pretty(pg_total_relation_size('usage_rollups'))"
            )
        ).one()
    print(f"filled {rollups:,} rollup rows in {seconds:.0f} s; sizes {tuple(sizes)}", flush=True)

    rng = random.Random(7)
    meter = Meter(url)
    since, until = MONTH, MONTH + timedelta(days=30)

    def ours(subject: str) -> list[tuple[Any, ...]]:
        report = usage_by_dimension(
            meter, subject=subject, key="route", limit="api", since=since, until=until
        )
        return [(r.limit, r.value, r.used, r.events) for r in report.rows()]

    def peer(subject: str) -> list[tuple[Any, ...]]:
        params = {"subject": subject, "since": to_us(since), "until": to_us(until)}
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(PEER), params)]

    def statement_alone(subject: str) -> list[tuple[Any, ...]]:
        query = DimensionQuery(subject, "route", ["api"], to_us(since), to_us(until))
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(usage_by_statement(query))]

    ours(f"org-{rng.randrange(args.subjects)}")  # warm the limit cache and the pool
    statement_alone("org-0")
    ours_ms: list[float] = []
    alone_ms: list[float] = []
    for _ in range(args.runs):
        subject = f"org-{rng.randrange(args.subjects)}"
        ms, _ = timed_ms(lambda s=subject: ours(s))
        ours_ms.append(ms)
        subject = f"org-{rng.randrange(args.subjects)}"
        ms, _ = timed_ms(lambda s=subject: statement_alone(s))
        alone_ms.append(ms)
    if args.explain:
        explain(engine, f"org-{rng.randrange(args.subjects)}", since, until)
    covering_ms: list[float] = []
    if args.covering_key:
        with engine.begin() as connection:
            connection.execute(text(COVERING_KEY))
        analyse(engine)
        statement_alone("org-0")
        for _ in range(args.runs):
            subject = f"org-{rng.randrange(args.subjects)}"
            ms, _ = timed_ms(lambda s=subject: statement_alone(s))
            covering_ms.append(ms)
        if args.explain:
            explain(engine, f"org-{rng.randrange(args.subjects)}", since, until)
    peer_ms: list[float] = []
    for _ in range(args.peer_runs):
        subject = f"org-{rng.randrange(args.subjects)}"
        ms, expected = timed_ms(lambda s=subject: peer(s))
        peer_ms.append(ms)
        got = ours(subject)
        assert got == expected and len(got) == ROUTES, (subject, got, expected)
        print(f"  peer {ms:,.0f} ms ({subject}: same {len(got)} rows)", flush=True)
    meter.close()
    engine.dispose()
    p50, peer_p50 = statistics.median(ours_ms), statistics.median(peer_ms)
    title = f"{args.results:,} results, {rollups:,} rollup rows"
    alone = statistics.median(alone_ms)
    covering_rows = []
    if covering_ms:
        median = statistics.median(covering_ms)
        covering_rows = [
            [
                "(q') its statement, the key covering used, events",
                str(args.runs),
                f"{median:.2f}",
                f"{percentile(covering_ms, 0.99):.2f}",
                f"{peer_p50 / median:,.0f}x faster",
            ]
        ]
    return [
        [
            f"(r) usage_by_dimension, rollups ({title})",
            str(args.runs),
            f"{p50:.2f}",
            f"{percentile(ours_ms, 0.99):.2f}",
            f"{peer_p50 / p50:,.0f}x faster",
        ],
        [
            "(q) its statement alone",
            str(args.runs),
            f"{alone:.2f}",
            f"{percentile(alone_ms, 0.99):.2f}",
            f"{peer_p50 / alone:,.0f}x faster",
        ],
        *covering_rows,
        [
            "(p) peer: results scanned, JSON grouped by route",
            str(args.peer_runs),
            f"{peer_p50:,.0f}",
            f"{percentile(peer_ms, 0.99):,.0f}",
            "1",
        ],
    ]


def explain(engine: Engine, subject: str, since: datetime, until: datetime) -> None:
    """Print the plan of the report's statement for ``subject``, with timings and buffers."""
    query = DimensionQuery(subject, "route", ["api"], to_us(since), to_us(until))
    compiled = usage_by_statement(query).compile(
        dialect=engine.dialect, compile_kwargs={"literal_binds": True}
    )
    with engine.connect() as connection:
        plan = connection.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {compiled}").scalars()
        print("\n".join(plan), flush=True)


# -- the write side ---------------------------------------------------------------

WRITE_SUBJECTS = 10_000


def write_batches(rounds: int, seed: int) -> list[list[Any]]:
    rng = random.Random(seed)
    now = datetime.now(UTC)
    return [
        [
            make_event(
                [(f"subject-{rng.randrange(WRITE_SUBJECTS)}", "calls", 1)],
                now,
                metadata={"route": f"/v1/r{rng.randrange(ROUTES)}"},
            ).record()
            for _ in range(1000)
        ]
        for _ in range(rounds)
    ]


def batch_rounds(
    meter: Meter,
    args: argparse.Namespace,
    seconds: dict[tuple[str, bool], float],
    events: dict[tuple[str, bool], int],
) -> None:
    """Batches and single consumes, without and with dimensions, alternated."""
    for round_ in range(args.write_rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        for dimensioned in (False,) if args.plain_only else order:
            set_dimensions(meter, ("route",) if dimensioned else ())
            batches = write_batches(5, seed=round_ * 2 + dimensioned)
            meter.apply_records(batches[0])  # the limit cache, refreshed
            began = time.perf_counter()
            for batch in batches[1:]:
                meter.apply_records(batch)
            key = ("batch", dimensioned)
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - began
            events[key] = events.get(key, 0) + 4000
            singles = write_batches(1, seed=1000 + round_ * 2 + dimensioned)[0][:300]
            began = time.perf_counter()
            for record in singles:
                meter.consume(record.charges[0][0], "calls", metadata=dict(record.metadata or {}))
            key = ("consume", dimensioned)
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - began
            events[key] = events.get(key, 0) + len(singles)


def set_dimensions(meter: Meter, dimensions: tuple[str, ...]) -> None:
    extra: dict[str, Any] = {"dimensions": dimensions} if dimensions else {}
    meter.set_limit(Limit("calls", maximum=10**12, period="1d", window="calendar", **extra))


def write_side(url: str, args: argparse.Namespace) -> list[list[str]]:
    """(events/s without, with dimensions) for batches and for single consumes."""
    seconds: dict[tuple[str, bool], float] = {}
    events: dict[tuple[str, bool], int] = {}
    with Meter(url) as meter:
        batch_rounds(meter, args, seconds, events)
    rows = []
    for kind, label in (("batch", "apply_records, 1,000-event batches"), ("consume", "consume")):
        plain = events[(kind, False)] / seconds[(kind, False)]
        rows.append([f"{label}, no dimensions", f"{plain:,.0f}", "1.00"])
        if not args.plain_only:
            rolled = events[(kind, True)] / seconds[(kind, True)]
            ratio = f"{rolled / plain:.2f}"
            rows.append([f"{label}, dimensions=('route',)", f"{rolled:,.0f}", ratio])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=10_000_000)
    parser.add_argument("--subjects", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=40, help="runs of the rollups report")
    parser.add_argument("--peer-runs", type=int, default=3, help="runs of the results scan")
    parser.add_argument("--write-rounds", type=int, default=6)
    parser.add_argument("--write-only", action="store_true", help="skip the report")
    parser.add_argument("--explain", action="store_true", help="print the report's plan")
    parser.add_argument("--covering-key", action="store_true", help="also try a covering key")
    parser.add_argument("--plain-only", action="store_true", help="writes without dimensions only")
    args = parser.parse_args()
    with durable_postgres() as server:
        read: list[list[str]] = []
        if not args.write_only:
            server.create_database("bench_read")
            upgrade_schema(server.url("bench_read"))
            with Meter(server.url("bench_read")) as meter:
                dimensions = ("route",)
                limit = Limit("api", 10**6, "1mo", window="calendar", dimensions=dimensions)
                meter.set_limit(limit)
            read = read_side(server.url("bench_read"), args)
        server.create_database("bench_write")
        upgrade_schema(server.url("bench_write"))
        write = write_side(server.url("bench_write"), args)
    if read:
        print_table(
            "One subject's month by route, durable PostgreSQL (ms)",
            ["method", "runs", "p50 ms", "p99 ms", "ratio"],
            read,
        )
    print_table(
        "The write side: events/s without and with a dimension, same run",
        ["path", "events/s", "ratio"],
        write,
    )


if __name__ == "__main__":
    main()
