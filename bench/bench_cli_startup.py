"""How long the `metering` command takes to start: ``--version``, ``--help``
and ``limits list`` on a SQLite file, each run ``--runs`` times in a fresh
process; the best wall time and CPU time (user + system) of each. CPU time
is the steadier figure on a busy machine.

    .venv/bin/python bench/bench_cli_startup.py --runs 10
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one run of ``metering ARGS``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "metering", *args],
        env=env,
        check=True,
        capture_output=True,
        cwd=tempfile.gettempdir(),
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "METERING_DATABASE_URL": f"sqlite:///{folder}/startup.db",
        }
        subprocess.run(
            [sys.executable, "-m", "metering", "limits", "list"],
            env=env,
            check=True,
            capture_output=True,
        )
        for name, args in {
            "--version": ["--version"],
            "--help": ["--help"],
            "limits list": ["limits", "list"],
        }.items():
            runs = [timed(args, env) for _ in range(options.runs)]
            wall = min(run[0] for run in runs)
            cpu = min(run[1] for run in runs)
            print(f"metering {name:12} best wall {wall:.3f} s, best cpu {cpu:.3f} s")


if __name__ == "__main__":
    main()
