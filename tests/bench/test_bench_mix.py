"""`bench/bench_mix.py` runs at tiny sizes: every configuration is set up through
the public API, every event of its set-up is allowed, and the table has a row of
each configuration and of the ledger peer (no timing is checked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATIONS = [
    "plain hard limit",
    "stacked on two limits",
    "stacked on three limits",
    "priced, with a spend cap",
    "tiered price (graduated, flat fee), spend cap",
    'seats (distinct="user")',
    "a grant on every subject (paying)",
    "a recurring grant on every subject (paying)",
    "an entitlement on every subject",
    "own thresholds on every subject",
    'dimensions=("route",)',
    'a gauge (aggregation="max")',
    "paced (pacing=True, burst 5%)",
    'a runaway breaker (breaker="10x")',
    "a time zone on every subject",
    "mix: entitlement, recurring grant, price + cap, seats",
]


@pytest.mark.slow
def test_every_configuration_runs_on_sqlite(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_mix.py"), "--quick", "--sqlite-only"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in done.stdout.splitlines()
        if line.startswith("| SQLite")
    ]
    for path in ("consume, 1 process", "apply, 1,000-event batches"):
        found = [row[2] for row in rows if row[1] == path]
        expected = CONFIGURATIONS + (["ledger peer"] if path.startswith("apply") else [])
        assert found == expected
    stacked = {row[2]: row[7] for row in rows if row[7]}  # ratio to as many counters stacked
    assert set(stacked) == {CONFIGURATIONS[3], CONFIGURATIONS[4], CONFIGURATIONS[-1]}
    assert all(row[8] for row in rows if row[1].startswith("apply"))  # ratio to the peer
