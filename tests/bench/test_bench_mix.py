"""`bench/bench_mix.py` runs at tiny sizes: every configuration is set up through
the public API, every event of its set-up is allowed, every subject's users hold
their seats before the first round, and the table has a row of each configuration
and of the ledger peer (no timing is checked)."""

from __future__ import annotations

import importlib
import itertools
import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from metering import Meter

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


def run_quick(tmp_path: Path, *options: str, database: str = "SQLite") -> list[list[str]]:
    """The ``database``'s rows of a ``--quick`` run's table (every database's
    for ""; ``--sqlite-only`` unless other options are given)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    script = str(ROOT / "bench" / "bench_mix.py")
    done = subprocess.run(
        [sys.executable, script, "--quick", *(options or ["--sqlite-only"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    databases = [database] if database else ["PostgreSQL", "SQLite"]
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in done.stdout.splitlines()
        if line.startswith(tuple(f"| {name} " for name in databases))
    ]


@pytest.fixture
def bench_mix(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module("bench_mix")


def test_every_subjects_users_hold_their_seats_before_the_first_round(
    bench_mix: ModuleType, tmp_path: Path
) -> None:
    subjects = ["subject-0", "subject-1"]
    for case in bench_mix.CASES:
        if "seats" not in case.charged:
            continue
        url = f"sqlite:///{tmp_path}/{case.name}.db"
        bench_mix.prepare(case, url, subjects)
        with Meter(url) as meter:
            held = [sorted(meter.seats(subject, "seats")) for subject in subjects]
        assert held == [sorted(f"user-{n}" for n in range(20))] * 2, case.name


def test_new_seats_bring_a_new_user_with_every_event(bench_mix: ModuleType) -> None:
    rng = random.Random(0)
    users = {bench_mix.NEW_SEATS.call("subject-0", rng)[1]["user"] for _ in range(1000)}
    assert len(users) == 1000
    assert not users & {f"user-{n}" for n in range(20)}


def test_a_pair_times_both_meters_in_turn_on_the_same_subjects(
    bench_mix: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[tuple[str, str]] = []

    class Recording(Meter):
        def consume(self, *args: Any, **kwargs: Any) -> Any:
            called.append((self.url, kwargs["charges"][0][0]))
            return super().consume(*args, **kwargs)

    subjects = [f"subject-{n}" for n in range(5)]
    cases = ({c.name: c for c in bench_mix.CASES}["mix"], bench_mix.CASES[0])
    urls = (f"sqlite:///{tmp_path}/mix.db", f"sqlite:///{tmp_path}/plain.db")
    for case, url in zip(cases, urls, strict=True):
        bench_mix.prepare(case, url, subjects)
    monkeypatch.setattr(bench_mix, "Meter", Recording)
    mine, plains = bench_mix.paired_job(urls, cases, subjects, 7, True)(0, 25)()
    assert len(mine) == len(plains) == 25
    warm, timed = bench_mix.WARM_CALLS, called[2 * bench_mix.WARM_CALLS :]
    assert [url for url, _ in called[: 2 * warm]] == [urls[0]] * warm + [urls[1]] * warm
    # Slices of ten (the last of five), the first side turning every slice:
    runs = [(url, len(list(group))) for url, group in itertools.groupby(u for u, _ in timed)]
    assert runs == [(urls[0], 10), (urls[1], 20), (urls[0], 15), (urls[1], 5)]
    assert [s for u, s in called if u == urls[0]] == [s for u, s in called if u == urls[1]]


def test_a_bracket_is_the_case_paired_with_its_yardstick(bench_mix: ModuleType) -> None:
    # Not the quotient of two pairings with plain (0.9 / 0.6 = 1.5 here): the
    # case's own calls paired with the yardstick's.
    results = bench_mix.Results()
    path = "consume, 1 process"
    for name, to_plain, to_stacked in [("stacked3", 0.6, None), ("mix", 0.9, 0.84)]:
        figures = bench_mix.Figures(name, 1, 1, 1.0, [1])
        results.add(path, figures, to_plain, to_stacked)
    assert results.paired(path, "mix", "plain") == "0.90"
    assert results.paired(path, "mix", "stacked3") == "0.84"
    assert results.paired(path, "mix", "stacked") == ""
    assert results.paired(path, "stacked3", "stacked") == ""


@pytest.mark.slow
def test_worker_only_runs_the_worker_rows_alone_on_both_databases(tmp_path: Path) -> None:
    # PostgreSQL's workers on Redis, SQLite's on the embedded broker.
    rows = run_quick(tmp_path, "--worker-only", "--cases", "priced", database="")
    names = ["plain hard limit", "stacked on two limits", "priced, with a spend cap"]
    assert [(row[0], row[2]) for row in rows] == [
        (database, name) for database in ("PostgreSQL", "SQLite") for name in names
    ]
    assert all(row[1] == "worker end to end" and row[3] and row[6] for row in rows)
    assert rows[2][7] and rows[5][7]  # priced's ratio to stacked
    assert not any(row[8] for row in rows)  # no peer without its `apply` rows


@pytest.mark.slow
def test_new_seats_run_beside_the_cases_named(tmp_path: Path) -> None:
    rows = run_quick(
        tmp_path, "--sqlite-only", "--new-seats", "--worker-rounds", "0", "--cases", "seats", "mix"
    )
    expected = [
        "plain hard limit",
        "stacked on three limits",
        'seats (distinct="user")',
        "seats, a new user every event (--new-seats)",
        "mix: entitlement, recurring grant, price + cap, seats",
    ]
    assert [row[2] for row in rows if row[1] == "consume, 1 process"] == expected
    for path in ("consume, 1 process", "apply, 1,000-event batches"):
        paired = {row[2]: row[9] for row in rows if row[1] == path}
        assert list(paired) == expected + (["ledger peer"] if path.startswith("apply") else [])
        assert all(paired.values())  # the paired median ratio to plain
        assert "(" in paired[expected[-1]]  # and to stacked on three


@pytest.mark.slow
def test_every_configuration_runs_on_sqlite(tmp_path: Path) -> None:
    rows = run_quick(tmp_path, "--sqlite-only", "--worker-rounds", "0")
    paths = ["consume, 1 process", "consume, 4 processes", "apply, 1,000-event batches"]
    for path in paths:
        found = [row[2] for row in rows if row[1] == path]
        expected = CONFIGURATIONS + (["ledger peer"] if path.startswith("apply") else [])
        assert found == expected
    for path in ("consume, 1 process", "apply, 1,000-event batches"):
        stacked = {row[2] for row in rows if row[1] == path and row[7]}  # to as many stacked
        assert stacked == {CONFIGURATIONS[3], CONFIGURATIONS[4], CONFIGURATIONS[-1]}
    assert all(row[8] for row in rows if row[1].startswith("apply"))  # to the peer
    assert all(row[9] for row in rows if row[1] in paths)  # the paired ratio
