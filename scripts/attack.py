"""Pairs of operations on one subject under traffic, then the invariants.

    .venv/bin/python scripts/attack.py sqlite|postgresql [--seconds 20] [--restart] [--operators 2]

Threads charge four subjects (a usage limit paid by grants once its own
allowance is spent, a seat limit, a price with a spend cap, a runaway
breaker; single `consume` calls and `apply` batches) while ``--operators``
threads (so any two at once) run every operation an operator or a client
runs on those same subjects, at random: resets (of a subject, of one
limit), voids, grants (recurring too), a seat limit's maximum lowered and
raised, entitlements down and up and removed, a price changed (tiered
with a fee too), the spend cap lowered and raised, a limit deleted and
defined again, a priced limit's dimensions changed, reservations
committed (in full, in part, beyond) and cancelled, sweeps, checkouts
retried and checked in, leases taken and settled, time zones, imports
(with lines imported before), compaction and prune. A gauge (a window's
peak) takes reports beside them, voided and reset too. ``--restart``
(PostgreSQL) stops the server a third of the way in and starts it again:
calls meanwhile fail to their caller.
Then: every id decided at most once and every id whose call returned is
decided; a seat limit's counter equals its held values and its maximum is
never passed; no hard limit's counter is past its maximum (but where the
maximum was lowered under it); a gauge's level is the peak of the reports
its ledger keeps; `metering audit --full` finds nothing.
Exits 1 naming what broke. Not part of the suite: it runs for as long as
it is told to, on a throw-away server of the suite's own (`tests/servers`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter as Tally
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metering import Limit, Meter, spend_limit
from metering.domain.corrections import gauge_reports
from metering.domain.events import make_event
from metering.domain.instants import to_us
from metering.domain.limits import parse_period
from metering.domain.state import CounterKey
from metering.domain.windows import calendar_window
from metering.settings import RetentionPolicy
from metering.storage.connections import upgrade_schema
from metering.storage.results import ResultStore
from metering.upkeep.audit import run_audit
from metering.upkeep.retention import compact, prune
from tests.servers import PostgresServer, make_base_dir

SUBJECTS = [f"org-{n}" for n in range(4)]
USERS = [f"user-{n}" for n in range(12)]
SEATS = 8
DISK = 900  # a gauge's maximum: reports above it are denied
OPERATIONS = [
    "reset",
    "reset_limit",
    "void",
    "void_peak",
    "grant",
    "lower",
    "raise",
    "dimensions",
    "commit",
    "commit_part",
    "commit_more",
    "reset_then_more",
    "cancel",
    "sweep",
    "checkout",
    "settle",
    "compact",
    "prune",
    "downgrade",
    "upgrade",
    "default",
    "reprice",
    "cap",
    "delete",
    "lease",
    "recurring",
    "zone",
    "import",
]


MONTHLY: dict = {"period": "1mo", "window": "calendar"}


def define(meter: Meter) -> None:
    monthly = MONTHLY
    # By user: the usage and spend reports' rollups, which the audit checks too.
    meter.set_limit(Limit("calls", maximum=300, dimensions=["user"], **monthly))
    meter.set_limit(Limit("seats", maximum=SEATS, distinct="user", **monthly))
    meter.set_limit(Limit("tokens", maximum=10**9, dimensions=["user"], **monthly))
    meter.set_limit(spend_limit("spend", "400.00", "USD", "1mo", window="calendar"))
    meter.set_price("tokens", "0.02", "USD")
    meter.set_limit(Limit("bursty", maximum=10**9, breaker="10x", **monthly))
    meter.set_limit(Limit("floating", maximum=3, algorithm="concurrent"))
    meter.set_limit(Limit("disk", maximum=DISK, aggregation="max", **monthly))
    for subject in SUBJECTS:
        meter.grant(subject, "calls", 500)
        meter.set_alert(subject, "calls", ["50%", "90%"])


class Attack:
    def __init__(self, meter: Meter, seconds: float) -> None:
        self.meter = meter
        self.deadline = time.monotonic() + seconds
        self.lock = threading.Lock()
        self.returned: list[str] = []  # ids whose call returned a decision
        self.failed: Tally[str] = Tally()  # errors by kind (each to its caller)
        self.ops: Tally[str] = Tally()
        self.allowed: list[str] = []
        self.beyond: list[str] = []  # committed at 6 of 4 units reserved
        self.imported: list[str] = []  # the import lines so far

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    def charges(self, rng: random.Random) -> tuple[str, list[tuple[str, str, int]], dict]:
        subject = rng.choice(SUBJECTS)
        kind = rng.randrange(5)
        if kind == 0:
            return subject, [(subject, "calls", 1)], {}
        if kind == 1:
            user = rng.choice(USERS)
            return subject, [(subject, "calls", 1), (subject, "seats", 1)], {"user": user}
        if kind == 2:
            return subject, [(subject, "tokens", rng.randint(1, 40))], {}
        if kind == 3:
            return subject, [(subject, "bursty", rng.randint(1, 5))], {}
        return subject, [(subject, "disk", rng.randint(0, DISK + 100))], {}

    def import_lines(self, rng: random.Random, subject: str, tag: str) -> list[str]:
        """Twenty new events of ``subject`` (calls or tokens), and ten
        lines of an earlier import again (duplicates: nothing changes)."""
        at = self.meter.clock().isoformat()
        lines = [
            json.dumps(
                {
                    "event_id": f"i{tag}-{k}",
                    "subject": subject,
                    "limit": rng.choice(["calls", "tokens"]),
                    "cost": rng.randint(1, 5),
                    "occurred_at": at,
                }
            )
            for k in range(20)
        ]
        return lines + rng.sample(self.imported, min(10, len(self.imported)))

    def note(self, event_id: str, decision: object) -> None:
        with self.lock:
            self.returned.append(event_id)
            if getattr(decision, "allowed", False):
                self.allowed.append(event_id)

    def failure(self, exc: Exception) -> None:
        with self.lock:
            self.failed[type(exc).__name__] += 1

    def single(self, worker: int) -> None:
        rng = random.Random(worker)
        n = 0
        while self.running():
            _, charges, metadata = self.charges(rng)
            event_id = f"c{worker}-{n}"
            n += 1
            try:
                self.note(
                    event_id,
                    self.meter.consume(charges=charges, event_id=event_id, metadata=metadata),
                )
            except Exception as exc:  # an outage: the caller sees it
                self.failure(exc)
                time.sleep(0.05)

    def batches(self, worker: int) -> None:
        rng = random.Random(1000 + worker)
        n = 0
        while self.running():
            events = []
            # Some batches above `SEND_EVERY`: PostgreSQL sends their results while deciding.
            size = rng.randint(20, 120) if rng.random() < 0.75 else rng.randint(260, 700)
            for _ in range(size):
                _, charges, metadata = self.charges(rng)
                events.append(make_event(charges, self.meter.clock(), f"b{worker}-{n}", metadata))
                n += 1
            try:
                decisions = self.meter.apply(events)
                for event, decision in zip(events, decisions, strict=True):
                    self.note(event.event_id, decision)
            except Exception as exc:
                self.failure(exc)
                time.sleep(0.05)

    def operations(self, worker: int) -> None:
        rng = random.Random(7 + worker)
        meter = self.meter
        n = 0
        while self.running():
            subject = rng.choice(SUBJECTS)
            op = rng.choice(OPERATIONS)
            n += 1
            tag = f"{worker}.{n}"
            try:
                if op == "reset":
                    meter.reset(subject)
                elif op == "reset_limit":
                    meter.reset(subject, rng.choice(["calls", "seats", "tokens", "bursty", "disk"]))
                elif op == "void":
                    with self.lock:
                        victim = rng.choice(self.allowed) if self.allowed else None
                    if victim is not None:
                        meter.void(victim, "attack", correction_id=f"v{tag}")
                elif op == "void_peak":  # the gauge's level comes from the ledger again
                    reports = _reports(meter, subject)
                    if reports:
                        meter.void(
                            max(reports, key=lambda r: r[3])[2], "attack", correction_id=f"v{tag}"
                        )
                elif op == "grant":
                    meter.grant(subject, "calls", rng.randint(1, 50))
                elif op == "lower":
                    meter.set_limit(
                        Limit(
                            "seats",
                            maximum=SEATS - 3,
                            distinct="user",
                            period="1mo",
                            window="calendar",
                        )
                    )
                elif op == "raise":
                    meter.set_limit(
                        Limit(
                            "seats", maximum=SEATS, distinct="user", period="1mo", window="calendar"
                        )
                    )
                elif op == "dimensions":  # the rollups' keys change under traffic
                    keys = rng.choice([["user"], ["user", "model"], []])
                    meter.set_limit(
                        Limit(
                            "tokens",
                            maximum=10**9,
                            dimensions=keys,
                            period="1mo",
                            window="calendar",
                        )
                    )
                elif op in ("commit", "commit_part", "commit_more", "cancel"):
                    # (More than reserved of priced usage is refused: "calls" alone.)
                    limit = "calls" if op == "commit_more" else rng.choice(["calls", "tokens"])
                    held = meter.reserve(subject, limit, 4, event_id=f"r{tag}")
                    if op == "cancel":
                        held.cancel()
                    elif op == "commit":
                        held.commit()
                    elif op == "commit_more":
                        held.commit(actual=6)
                        self.beyond.append(f"r{tag}")
                    else:
                        held.commit(actual=2)
                    self.note(f"r{tag}", held)
                elif op == "reset_then_more":  # the reset drops the hold; the commit bills it
                    held = meter.reserve(subject, "calls", 4, event_id=f"r{tag}")
                    meter.reset(subject, "calls")
                    held.commit(actual=6)
                    self.note(f"r{tag}", held)
                    self.beyond.append(f"r{tag}")
                elif op == "sweep":
                    meter.sweep_reservations()
                elif op == "checkout":
                    for _ in range(2):  # a client retrying with its id
                        meter.checkout(subject, "floating", checkout_id=f"k{tag}")
                    meter.checkin(f"k{tag}")
                elif op == "settle":
                    meter.settle_leases(everything=True)
                elif op == "compact":
                    compact(meter)
                elif op == "downgrade":  # below what the window used: hard charges denied
                    meter.set_entitlement(subject, "calls", rng.choice([20, 100]))
                elif op == "upgrade":
                    meter.set_entitlement(subject, "calls", 2000)
                elif op == "default":
                    meter.delete_entitlement(subject, "calls")
                elif op == "reprice":  # priced from now on, by occurred_at
                    if rng.random() < 0.5:
                        meter.set_price("tokens", rng.choice(["0.01", "0.02", "0.05"]), "USD")
                    else:
                        meter.set_price(
                            "tokens",
                            None,
                            "USD",
                            model="graduated",
                            tiers=["200:0.03", "inf:0.01"],
                            flat_fee="5",
                        )
                elif op == "cap":  # a hard spend cap lowered under traffic, and raised
                    cap = rng.choice(["150.00", "400.00"])
                    meter.set_limit(spend_limit("spend", cap, "USD", "1mo", window="calendar"))
                elif op == "delete":  # gone, then back: its counters stay
                    meter.delete_limit("bursty")
                    meter.set_limit(Limit("bursty", maximum=10**9, breaker="10x", **MONTHLY))
                elif op == "lease":
                    meter.lease(subject, "calls", rng.randint(1, 3))
                elif op == "recurring":
                    meter.grant(subject, "calls", 30, every="1d", grant_id=f"g{tag}")
                elif op == "import":  # a file of events, half of one imported before again
                    lines = self.import_lines(rng, subject, tag)
                    summary = meter.import_events(lines)
                    if summary.bad or summary.conflicts:
                        self.failed[
                            f"import: {summary.bad} bad, {summary.conflicts} conflicts"
                        ] += 1
                    self.imported.extend(lines)
                    with self.lock:
                        self.returned.extend(json.loads(line)["event_id"] for line in lines)
                elif op == "zone":  # from the end of each current window on
                    meter.set_time_zone(subject, rng.choice(["UTC", "America/New_York"]))
                else:
                    prune(meter, RetentionPolicy(), visibility_timeout_seconds=30)
                self.ops[op] += 1
            except Exception as exc:
                self.ops[f"{op} failed: {type(exc).__name__}"] += 1
                time.sleep(0.05)


def check(meter: Meter, attack: Attack) -> list[str]:
    broken = []
    returned = set(attack.returned)
    decided = meter.decided(returned)
    if decided != returned:
        broken.append(f"{len(returned - decided)} ids returned a decision but are not decided")
    if meter.count_results() < len(decided):
        broken.append("fewer results than decided ids")
    for subject in SUBJECTS:
        held = meter.seats(subject, "seats")
        current = meter.counters(subject, "seats")[-1:]
        used = current[0].used if current else 0
        if used != len(held):
            broken.append(f"{subject}: seat counter {used}, held values {len(held)}")
        if len(held) > SEATS:
            broken.append(f"{subject}: {len(held)} seats held, maximum {SEATS}")
        broken.extend(_gauge(meter, subject))
    for event_id in attack.beyond:  # the real cost billed, whatever reset came between
        result = meter.result(event_id)
        costs = [c.cost for c in result.charges] if result is not None else []
        if result is not None and result.allowed and costs != [6]:
            broken.append(f"{event_id}: committed at 6, its result says {costs}")
    report = run_audit(meter, full=True)
    broken.extend(f"audit: {violation}" for violation in report.violations)
    return broken


def _window(meter: Meter, subject: str) -> CounterKey:
    """The gauge's counter this month (a calendar window in UTC)."""
    start, end = calendar_window(parse_period("1mo"), to_us(meter.clock()))
    return CounterKey("disk", subject, start, end)


def _reports(meter: Meter, subject: str) -> list[tuple[int, int, str, int]]:
    """The gauge's reports its ledger keeps in this month's window: allowed,
    neither voided nor cleared by a reset (occurred, decided, id, value)."""
    key = _window(meter, subject)
    return gauge_reports(key, meter.database.read(lambda c: ResultStore(c).window_results(key, "")))


def _gauge(meter: Meter, subject: str) -> list[str]:
    """The gauge's level against its ledger: the peak of its reports."""
    peak = max((report[3] for report in _reports(meter, subject)), default=0)
    start_us = _window(meter, subject).window_start_us
    current = [c for c in meter.counters(subject, "disk") if to_us(c.window_start) == start_us]
    level = current[0].used if current else 0
    broken = []
    if level != peak:
        broken.append(f"{subject}: gauge at {level}, its ledger's peak {peak}")
    if level > DISK:
        broken.append(f"{subject}: gauge at {level}, past its maximum {DISK}")
    return broken


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("database", choices=["sqlite", "postgresql"])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--restart", action="store_true")
    parser.add_argument("--operators", type=int, default=2)  # each pair of them, concurrently
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        server = None
        if args.database == "postgresql":
            server = PostgresServer(make_base_dir(Path(scratch)), durable=True)
            server.start()
            server.create_database("attack")
            url = server.url("attack")
            upgrade_schema(url)
        else:
            url = f"sqlite:///{scratch}/attack.db"
        try:
            with Meter(url) as meter:
                define(meter)
                attack = Attack(meter, args.seconds)
                threads = [threading.Thread(target=attack.single, args=(w,)) for w in range(3)]
                threads += [threading.Thread(target=attack.batches, args=(w,)) for w in range(2)]
                threads += [
                    threading.Thread(target=attack.operations, args=(w,))
                    for w in range(args.operators)
                ]
                for thread in threads:
                    thread.start()
                if args.restart and server is not None:
                    time.sleep(args.seconds / 3)
                    server.stop()
                    time.sleep(2)
                    server.start()
                for thread in threads:
                    thread.join()
                broken = check(meter, attack)
                failed = sum(attack.failed.values())
                print(f"{args.database}: {len(attack.returned)} decided, {failed} calls failed")
                print("failures:", dict(attack.failed))
                print("operations:", dict(sorted(attack.ops.items())))
        finally:
            if server is not None:
                server.destroy()
    for line in broken:
        print("BROKEN:", line)
    print("all invariants hold" if not broken else f"{len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
