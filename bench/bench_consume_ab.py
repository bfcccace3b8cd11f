"""`Meter.consume` on PostgreSQL, this tree against another, in lockstep, with the server's time.

    .venv/bin/python bench/bench_consume_ab.py OTHER_TREE [--calls 1500]
        [--cases seats mix plain stacked3] [--track top|all] [--subjects 500]

One durable PostgreSQL with ``pg_stat_statements``; each tree (OTHER_TREE as A, this one
as B) in a process of its own, with its own venv and code, makes and fills its own
database of each `bench_mix` case (its migrations, `bench_mix.prepare`), then consumes
the case's calls on a meter warmed on 50 of them: slices of ten calls, A and B in turn
(who goes first alternating), the cases' order turning. Prints per call the client's
thread CPU and wall, the function's server time (``metering_consume_one`` at the top
level), B over A (sums, median slice), and with ``--track all`` the statements inside the
function. ``mix-tokens`` and ``priced-tokens`` are theirs with a cost from 1 to 999 a call.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SLICE, WARM = 10, 50


def child() -> None:
    """One tree's side: JSON commands on stdin, a JSON answer a line on stdout."""
    sys.path.insert(0, str(Path.cwd() / "bench"))
    import bench_mix

    from metering import Meter
    from metering.storage.connections import upgrade_schema

    class Tokens(bench_mix.Case):
        """A cost from 1 to 999 every call (tokens, bytes), but a seat's."""

        def call(self, subject: str, rng: random.Random) -> bench_mix.Call:
            charges, metadata = super().call(subject, rng)
            cost = rng.randrange(1, 1000)
            return [
                (subject, limit, 1 if limit == "seats" else cost) for subject, limit, _ in charges
            ], metadata

    cases = {case.name: case for case in bench_mix.CASES}
    # The mix's and a price's, their costs changing every call.
    for name in ("mix", "priced"):
        cases[f"{name}-tokens"] = Tokens(**{**vars(cases[name]), "name": f"{name}-tokens"})
    subjects = [f"subject-{n}" for n in range(int(os.environ["AB_SUBJECTS"]))]
    meters: dict[str, Meter] = {}
    work: dict[str, list[Any]] = {}
    for line in sys.stdin:
        command = json.loads(line)
        op, name = command["op"], command.get("case", "")
        answer: dict[str, int] = {}
        if op == "prepare":
            upgrade_schema(command["url"])
            bench_mix.prepare(cases[name], command["url"], subjects)
        elif op == "open":
            rng, metadata_rng = random.Random(command["seed"]), random.Random(command["seed"] + 1)
            drawn = [rng.choice(subjects) for _ in range(WARM + command["calls"])]
            calls = [cases[name].call(subject, metadata_rng) for subject in drawn]
            meter = meters[name] = Meter(command["url"])
            for charges, metadata in calls[:WARM]:
                meter.consume(charges=charges, metadata=metadata)
            work[name] = calls[WARM:]
        elif op == "run":
            cpu = wall = 0
            for charges, metadata in work[name][:SLICE]:
                began, began_cpu = time.perf_counter_ns(), time.thread_time_ns()
                meters[name].consume(charges=charges, metadata=metadata)
                cpu += time.thread_time_ns() - began_cpu
                wall += time.perf_counter_ns() - began
            work[name] = work[name][SLICE:]
            answer = {"cpu": cpu, "wall": wall}
        print(json.dumps(answer), flush=True)
    for meter in meters.values():
        meter.close()


class Side:
    def __init__(self, tree: Path, subjects: int) -> None:
        environment = {**os.environ, "AB_SUBJECTS": str(subjects)}
        self.process = subprocess.Popen(
            [str(tree / ".venv/bin/python"), str(Path(__file__).absolute()), "--child"],
            cwd=tree,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, **command: Any) -> dict[str, int]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return dict(json.loads(self.process.stdout.readline()))

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("other", type=Path)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--cases", nargs="+", default=["seats", "mix", "plain", "stacked3"])
    parser.add_argument("--track", choices=["top", "all"], default="top")
    parser.add_argument("--subjects", type=int, default=500)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
    import psycopg
    from servers import PostgresServer

    settings = {
        "shared_preload_libraries": "pg_stat_statements",
        "pg_stat_statements.track": args.track,
    }
    base = Path(tempfile.mkdtemp(prefix="metering-ab-"))
    server = PostgresServer(base, durable=True, settings=settings)
    server.start()
    cases, calls = args.cases, args.calls
    sides = {"A": Side(args.other.absolute(), args.subjects)}
    sides["B"] = Side(Path(__file__).absolute().parents[1], args.subjects)

    def url(side: str, case: str) -> str:
        return server.url(f"{side}_{case}")

    try:
        for case in cases:
            for name, side in sides.items():
                server.create_database(f"{name}_{case}")
                side.ask(op="prepare", case=case, url=url(name, case))
        admin = psycopg.connect(server.url().replace("+psycopg", ""), autocommit=True)
        admin.execute("CREATE EXTENSION pg_stat_statements")
        for seed, case in enumerate(cases):
            for name, side in sides.items():
                side.ask(op="open", case=case, url=url(name, case), seed=seed, calls=calls)
        admin.execute("SELECT pg_stat_statements_reset()")
        sums = {(name, case): [0, 0] for name in sides for case in cases}
        ratios: dict[str, list[float]] = {case: [] for case in cases}
        cpu_ratios: dict[str, list[float]] = {case: [] for case in cases}
        for number in range(calls // SLICE):
            turn = number % len(cases)
            for case in cases[turn:] + cases[:turn]:
                walls, cpus = {}, {}
                for name in ("A", "B") if number % 2 == 0 else ("B", "A"):
                    found = sides[name].ask(op="run", case=case)
                    sums[(name, case)][0] += found["cpu"]
                    sums[(name, case)][1] += found["wall"]
                    walls[name], cpus[name] = found["wall"], found["cpu"]
                ratios[case].append(walls["B"] / walls["A"])
                cpu_ratios[case].append(cpus["B"] / cpus["A"])
        rows = admin.execute(
            "SELECT d.datname, s.toplevel, s.query, s.calls, s.total_exec_time"
            " FROM pg_stat_statements AS s JOIN pg_database AS d ON d.oid = s.dbid"
        ).fetchall()
        admin.close()
    finally:
        for side in sides.values():
            side.close()
        server.destroy()
    print(f"{calls} calls a case a side, {args.subjects} subjects, track {args.track}")
    print(
        "case | side | client CPU µs | wall µs | function µs"
        " | B/A wall (sums, median slice) | B/A client CPU (sums, median slice)"
    )
    for case in cases:
        function = {}
        for name in sides:
            top = [r for r in rows if r[0] == f"{name}_{case}" and r[1]]
            mine = [r for r in top if "metering_consume_one(" in r[2]]
            count = sum(r[3] for r in mine) or 1
            function[name] = sum(r[4] for r in mine) * 1000 / count
            cpu, wall = sums[(name, case)]
            line = f"{case} | {name} | {cpu / calls / 1e3:.0f} | {wall / calls / 1e3:.0f}"
            print(f"{line} | {function[name]:.0f}", end="")
            if name == "B":
                wall_ratio = sums[("B", case)][1] / sums[("A", case)][1]
                print(f" | {wall_ratio:.3f}, {statistics.median(ratios[case]):.3f}", end="")
                print(f" (function B/A {function['B'] / function['A']:.3f})", end="")
                cpu_ratio = sums[("B", case)][0] / sums[("A", case)][0]
                print(f" | {cpu_ratio:.3f}, {statistics.median(cpu_ratios[case]):.3f}", end="")
            print()
            if args.track == "all":
                inner = [r for r in rows if r[0] == f"{name}_{case}" and not r[1]]
                for r in sorted(inner, key=lambda r: -r[4]):
                    if r[4] * 1000 / count >= 3:
                        query = " ".join(r[2].split())[:60]
                        print(f"    {r[4] * 1000 / count:7.1f} µs  {r[3]:6d}  {query}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        child()
    else:
        main()
