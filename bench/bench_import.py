"""`metering import` against the batch path it uses, on the same events.

    .venv/bin/python bench/bench_import.py [--events 1000000] [--database sqlite|postgresql|both]

Writes a JSON Lines file of ``--events`` events (10,000 subjects, one
calendar-window limit that never denies, times within the last hour), then
on a fresh database each:

(b) the batch path alone: the same events, already decoded as the worker
    has them (`EventRecord`), applied 1,000 at a time by `Meter.apply_records`
    (what `metering.pipeline.batches.apply_batch` calls);
(i) the import: `Meter.import_events(path)`, reading, parsing and
    validating the file and applying it through that same path.

Prints events/s of each and the ratio i/b (issue 23 asks for at least 0.5).
PostgreSQL is a throw-away durable server (fsync on); SQLite a file.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from common import durable_postgres, print_table

from metering import Limit, Meter
from metering.domain.imports import BadLine, parse_lines
from metering.storage.connections import upgrade_schema

SUBJECTS = 10_000
BATCH = 1000
LIMIT = Limit("calls", maximum=10**12, period="1d", window="calendar")


def write_file(path: Path, events: int) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=50)
    step_us = max(1, 50 * 60 * 1_000_000 // events)
    with path.open("w") as out:
        for i in range(events):
            at = (start + timedelta(microseconds=i * step_us)).isoformat()
            event = {"event_id": f"e{i}", "subject": f"subject-{i * 7919 % SUBJECTS}"}
            out.write(json.dumps({**event, "limit": "calls", "occurred_at": at}) + "\n")


def batch_path(url: str, path: Path) -> float:
    with path.open() as lines:
        records = [r for _, r in parse_lines(lines, "jsonl") if not isinstance(r, BadLine)]
    with Meter(url) as meter:
        meter.set_limit(LIMIT)
        gc.collect()
        began = time.perf_counter()
        for start in range(0, len(records), BATCH):
            meter.apply_records(records[start : start + BATCH], invalid="reject")
        return time.perf_counter() - began


def import_path(url: str, path: Path) -> float:
    with Meter(url) as meter:
        meter.set_limit(LIMIT)
        gc.collect()
        began = time.perf_counter()
        summary = meter.import_events(path, batch_size=BATCH)
        seconds = time.perf_counter() - began
        assert summary.bad == 0 and summary.applied == summary.events, summary
        return seconds


def measure(name: str, urls: tuple[str, str], path: Path, events: int) -> list[str]:
    batch = batch_path(urls[0], path)
    imported = import_path(urls[1], path)
    return [
        name,
        f"{events / batch:,.0f}",
        f"{events / imported:,.0f}",
        f"{batch / imported:.2f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="metering-bench-import-") as directory:
        path = Path(directory) / "events.jsonl"
        write_file(path, args.events)
        if args.database in ("sqlite", "both"):
            urls = (f"sqlite:///{directory}/batch.db", f"sqlite:///{directory}/import.db")
            rows.append(measure("SQLite file", urls, path, args.events))
        if args.database in ("postgresql", "both"):
            with durable_postgres() as server:
                for name in ("batch", "import"):
                    server.create_database(name)
                    upgrade_schema(server.url(name))
                urls = (server.url("batch"), server.url("import"))
                rows.append(measure("PostgreSQL (durable)", urls, path, args.events))
    title = f"{args.events:,} events, {BATCH}-event batches, {SUBJECTS:,} subjects"
    print_table(
        title, ["database", "batch path events/s", "import events/s", "import / batch"], rows
    )


if __name__ == "__main__":
    main()
