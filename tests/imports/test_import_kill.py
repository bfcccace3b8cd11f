"""A 10k-event import SIGKILLed half way and run again ends exactly once:
the ledger and the counters equal those of one uninterrupted import."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from servers import copy_sqlite
from sqlalchemy import select

from metering import Limit, Meter
from metering.storage.tables import counters, results
from metering.upkeep.audit import run_audit

pytestmark = pytest.mark.slow

EVENTS = 10_000
SUBJECTS = 50
# 200 events a subject against 120 a day: about 40% are denied, so the
# decisions depend on the order and on each event being applied once.
LIMIT = Limit("calls", maximum=120, period="1d", window="calendar")
ROOT = Path(__file__).resolve().parents[2]
DEADLINE_SECONDS = 300


def write_file(path: Path) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    with path.open("w") as out:
        for i in range(EVENTS):
            at = (start + timedelta(milliseconds=i)).isoformat()
            event = {"event_id": f"e{i}", "subject": f"org-{i % SUBJECTS}", "limit": "calls"}
            out.write(json.dumps({**event, "occurred_at": at}) + "\n")


def ledger(meter: Meter) -> tuple[list[Any], list[Any]]:
    with meter.sql_engine.connect() as connection:
        found = connection.execute(
            select(results.c.event_id, results.c.outcome, results.c.charges).order_by(
                results.c.event_id
            )
        ).all()
        counted = connection.execute(
            select(
                counters.c.limit_name,
                counters.c.subject,
                counters.c.window_start_us,
                counters.c.used,
                counters.c.denied_count,
                counters.c.denied_cost,
                counters.c.first_denied_at_us,
            ).order_by(counters.c.subject, counters.c.window_start_us)
        ).all()
    return [tuple(row) for row in found], [tuple(row) for row in counted]


def test_killed_half_way_and_run_again_ends_exactly_once(
    db_url: str, sqlite_template: Path, tmp_path: Path
) -> None:
    path = tmp_path / "history.jsonl"
    write_file(path)
    with Meter(db_url) as meter:
        meter.set_limit(LIMIT)
        command = [sys.executable, "-m", "metering", "--database", db_url, "import", str(path)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        log = tmp_path / "import.log"
        with log.open("w") as errors:
            process = subprocess.Popen(
                [*command, "--no-progress", "--batch-size", "500"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )
        try:
            began = time.monotonic()
            # Wait (not a timing assertion) until a third of the file is in.
            while meter.count_results() < EVENTS // 3:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() - began < DEADLINE_SECONDS
                time.sleep(0.02)
            process.send_signal(signal.SIGKILL)
        finally:
            process.wait()
        assert process.returncode == -signal.SIGKILL
        killed_at = meter.count_results()
        assert EVENTS // 3 <= killed_at < EVENTS
        again = subprocess.run(
            [*command, "--no-progress", "--output", "json"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert again.returncode == 0, again.stderr
        summary = json.loads(again.stdout)
        assert summary["duplicates"] == killed_at
        assert summary["events"] == EVENTS and summary["bad"] == 0
        assert summary["applied"] + summary["denied"] == EVENTS - killed_at
        after_kill = ledger(meter)
        audited = run_audit(meter, full=True)
        assert (audited.violations, audited.windows) == ((), len(after_kill[1]))
    with Meter(copy_sqlite(sqlite_template, tmp_path / "once.db")) as once:
        once.set_limit(LIMIT)
        one = once.import_events(path)
        assert one.denied > EVENTS // 4
        assert ledger(once) == after_kill
