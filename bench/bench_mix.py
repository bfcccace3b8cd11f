"""Every configuration we sell, each as a ratio to a plain limit in the same run.

    .venv/bin/python bench/bench_mix.py [--subjects 500] [--consume 600] [--sqlite-consume 1000]
                                        [--batches 12] [--rounds 3] [--processes 1 4]
                                        [--worker-events 2500] [--worker-rounds 8]
                                        [--new-seats] [--cases NAME ...]
                                        [--sqlite-only] [--worker-only] [--quick]
                                        [--no-speculation] [--collector-in-batches]

One database per configuration, on one durable PostgreSQL (fsync on) and on
SQLite files (WAL, ``synchronous=NORMAL``), each with the same subjects and
monthly calendar windows high enough that nothing is denied:

* plain: one hard limit;
* stacked: the same limit and a daily one, both charged by every event;
* stacked3: the same and a weekly one too: three counters, as the mix writes;
* priced: the limit priced at 0.01 USD a unit and a spend limit in USD, so
  every event also charges the subject's spend (ratio to stacked too);
* tiered: the same with a graduated price (two tiers) and a flat fee, each
  charge priced by its window's total;
* seats: a ``distinct="user"`` limit, 20 user values per subject, every
  one holding its seat before the first round: the row measures events of
  users who hold a seat (the value's row updated), as most of a month's
  are; ``--new-seats`` adds "new seats", where every event brings a user
  never seen (a new value's row each): what taking a seat costs;
* grant: a grant on every subject, whose own allowance (1) is used up, so
  the grant pays every event;
* recurring: the same with a monthly recurring grant;
* entitlement: a maximum of its own for every subject;
* own thresholds: every subject's own alert thresholds (``set_alert``);
* dimensions: ``dimensions=("route",)``, 5 routes in the metadata;
* gauge: ``aggregation="max"``, each event a level from 0 to 999;
* paced: ``pacing=True`` (the maximum spread over the month, a 5 % burst);
* breaker: ``breaker="10x"`` (every subject's now rate and baseline read,
  stepped and written with its charges; none trips);
* time zone: a time zone on every subject (Kolkata, Berlin, Santiago,
  Kathmandu), set in 2000: its months start at its local midnight;
* mix: a priced limit with a spend cap, an entitlement and a recurring
  grant on every subject, and a seat limit charged beside it (its seats
  held, as in seats).

Every subject's counters, and its seats, exist before the first round.
Rounds interleave the configurations (their order turns each round):
`Meter.consume` in 1 process and in 4 sharing the round's calls (on SQLite
the 4 queue on each file's one write lock), each case's calls paired with
as many of plain in the same process (`paired_job`: a meter on each
database, both warmed, the same subjects in the same order, slices of ten
calls of each in turn; plain is paired with itself), and `Meter.apply` of
1,000-event batches in one process, beside the ledger peer
(`peers.ledger_postgres`, `peers.ledger_sqlite`: the results rows and the
counter upsert, one transaction per batch, no decision, over the plain
batches' own events and ids), one batch of every case and of the peer in
turn (`apply_rounds`), the garbage collector run before each, out of its
time, over what was made before the first frozen
(``--collector-in-batches``: collections land where they fall). Each row
prints the median of the rounds (a `consume` row's rate, p50 and p99 from
the case's own calls) and its ratio to plain, the median of the per-round
ratios of the rates; a case that writes more than one counter also to the
plain limit stacked on as many (priced and tiered to stacked, the mix to
stacked3), and each batch row to the peer and, last, the paired ratio (to
plain, and in brackets to stacked): for `consume` the median of the
rounds' ratios of plain's summed time to the case's in the same processes
(to stacked: the case's calls paired with as many of stacked's, in a job
of their own), for `apply` the median of the ratios of the batches applied
in the same pass. The paired column is the one to read
(docs/performance.md: how far each moves between runs of one commit). A
round's consuming meters are new: on PostgreSQL their cached rows are
cold, so they rarely speculate (`metering.storage.hot.speculative`;
``--no-speculation`` turns it off; ``bench_speculation.py`` measures warm
meters, A against B). Then the worker end to end (producer, broker, a
Celery worker per case, all started first and kept warm, each on a broker
of its own: for PostgreSQL a Redis database and 2 processes, for SQLite
an embedded broker's file and one process, the default a new user runs):
a round to
warm up, then ``--worker-rounds`` rounds of ``--worker-events`` events a
case, the order turning each round; each row the median of the per-round
ratios to plain, and its median rate against the ledger peer's `apply`
rate (``--worker-only``: these rows alone, no peer); no paired ratio
(paired with plain, slice by slice, the rows moved more between runs:
docs/performance-history.md). ``--cases`` runs only the cases named (with
plain and the stacked case each is compared with)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import (
    Figures,
    durable_postgres,
    make_base_dir,
    median,
    print_table,
    run_prepared_each,
    start_worker,
    stop_worker,
)
from peers import install_ledger, ledger_postgres, ledger_sqlite
from servers import RedisServer

from metering import FrozenClock, Limit, Meter, UsageEvent, make_event, spend_limit
from metering.engine.paths import Direct
from metering.pipeline.producer import UsageProducer
from metering.pipeline.transport import is_embedded_broker
from metering.storage.connections import upgrade_schema

BIG = 10**12
ZONES = ("Asia/Kolkata", "Europe/Berlin", "America/Santiago", "Asia/Kathmandu")
VALUES = {"user": 20, "route": 5}  # metadata values per key (users per subject)
DAILY = Limit("calls_daily", maximum=BIG, period="1d", window="calendar")
WEEKLY = Limit("calls_weekly", maximum=BIG, period="1w", window="calendar")
SPEND = spend_limit("spend", "10000000000", "USD", "1mo", window="calendar")
SEATS = Limit("seats", maximum=10**9, period="1mo", window="calendar", distinct="user")
GAUGE = Limit("storage", maximum=BIG, period="1mo", window="calendar", aggregation="max")

Call = tuple[list[tuple[str, str, int]], dict[str, str] | None]
Setup = Callable[[Meter, list[str]], None]


def calls(maximum: int = BIG, **options: Any) -> Limit:
    return Limit("calls", maximum=maximum, period="1mo", window="calendar", **options)


def priced(meter: Meter, _subjects: list[str]) -> None:
    meter.set_price("calls", "0.01", "USD")


def tiered(meter: Meter, _subjects: list[str]) -> None:
    meter.set_price(
        "calls", None, "USD", model="graduated", tiers=["1000:0.01", "inf:0.005"], flat_fee="1"
    )


def granted(meter: Meter, subjects: list[str]) -> None:
    for subject in subjects:
        meter.grant(subject, "calls", BIG, grant_id=f"credit-{subject}")


def recurring(meter: Meter, subjects: list[str]) -> None:
    for subject in subjects:
        meter.grant(subject, "calls", BIG, grant_id=f"monthly-{subject}", every="1mo")


def entitled(meter: Meter, subjects: list[str]) -> None:
    for n, subject in enumerate(subjects):
        meter.set_entitlement(subject, "calls", BIG // 10 + n)


def alerted(meter: Meter, subjects: list[str]) -> None:
    for subject in subjects:
        meter.set_alert(subject, "calls", ["80%"])


def zoned(meter: Meter, subjects: list[str]) -> None:
    # Set in 2000 (a change waits for the current month to end): in force now.
    with Meter(meter.url, clock=FrozenClock(datetime(2000, 1, 1, tzinfo=UTC))) as past:
        for n, subject in enumerate(subjects):
            past.set_time_zone(subject, ZONES[n % len(ZONES)])


def mixed(meter: Meter, subjects: list[str]) -> None:
    priced(meter, subjects)
    entitled(meter, subjects)
    for subject in subjects:
        meter.grant(subject, "calls", 10**6, grant_id=f"monthly-{subject}", every="1mo")


@dataclass(frozen=True)
class Case:
    name: str
    label: str
    limits: tuple[Limit, ...]
    charged: tuple[str, ...] = ("calls",)
    keys: tuple[str, ...] = ()  # the metadata keys every event carries
    setup: Setup | None = None
    levels: bool = False  # a gauge's report: a level from 0 to 999, not 1
    stacked: str = ""  # the plain case that writes as many counters
    fresh: bool = False  # a user value never seen before in every event (a new seat)

    def call(self, subject: str, rng: random.Random) -> Call:
        metadata = {key: f"{key}-{rng.randrange(VALUES[key])}" for key in self.keys}
        if self.fresh:
            metadata["user"] = f"new-{rng.getrandbits(64):016x}"
        cost = rng.randrange(1000) if self.levels else 1
        return [(subject, limit, cost) for limit in self.charged], metadata or None


CASES = [
    Case("plain", "plain hard limit", (calls(),)),
    Case("stacked", "stacked on two limits", (calls(), DAILY), ("calls", "calls_daily")),
    Case(
        "stacked3",
        "stacked on three limits",
        (calls(), DAILY, WEEKLY),
        ("calls", "calls_daily", "calls_weekly"),
    ),
    Case("priced", "priced, with a spend cap", (calls(), SPEND), setup=priced, stacked="stacked"),
    Case(
        "tiered",
        "tiered price (graduated, flat fee), spend cap",
        (calls(), SPEND),
        setup=tiered,
        stacked="stacked",
    ),
    Case("seats", 'seats (distinct="user")', (SEATS,), ("seats",), ("user",)),
    Case("grant", "a grant on every subject (paying)", (calls(1),), setup=granted),
    Case("recurring", "a recurring grant on every subject (paying)", (calls(1),), setup=recurring),
    Case("entitlement", "an entitlement on every subject", (calls(),), setup=entitled),
    Case("alerts", "own thresholds on every subject", (calls(),), setup=alerted),
    Case("dimensions", 'dimensions=("route",)', (calls(dimensions=("route",)),), keys=("route",)),
    Case("gauge", 'a gauge (aggregation="max")', (GAUGE,), ("storage",), levels=True),
    Case("paced", "paced (pacing=True, burst 5%)", (calls(pacing=True),)),
    Case("breaker", 'a runaway breaker (breaker="10x")', (calls(breaker="10x"),)),
    Case("time zone", "a time zone on every subject", (calls(),), setup=zoned),
    Case(
        "mix",
        "mix: entitlement, recurring grant, price + cap, seats",
        (calls(), SPEND, SEATS),
        ("calls", "seats"),
        ("user",),
        mixed,
        stacked="stacked3",
    ),
]
# Not run unless asked (``--new-seats``): what taking a seat costs.
NEW_SEATS = Case(
    "new seats",
    "seats, a new user every event (--new-seats)",
    (SEATS,),
    ("seats",),
    ("user",),
    fresh=True,
)
STACKED = {case.name: case.stacked for case in [*CASES, NEW_SEATS]}
PEER = "ledger peer"
WARM_UP = 100  # events applied before a round's batches are timed
WARM_CALLS = 5  # consume calls of each meter of a pair before its calls are timed
SLICE = 10  # consume calls of one side of a pair before the other's


def events_of(case: Case, subjects: list[str], seed: int, count: int, meter: Meter) -> list[Any]:
    rng = random.Random(seed)
    now = meter.clock()
    return [
        make_event(charges, now, metadata=metadata)
        for charges, metadata in (case.call(rng.choice(subjects), rng) for _ in range(count))
    ]


def apply_all(meter: Meter, events: list[UsageEvent]) -> None:
    """Apply ``events`` in 1,000-event batches; every one must be allowed."""
    for start in range(0, len(events), 1000):
        for decided in meter.apply(events[start : start + 1000]):
            if not getattr(decided, "allowed", False):
                raise SystemExit(f"bench_mix: not allowed in the set-up: {decided}")


def prepare(case: Case, url: str, subjects: list[str]) -> None:
    """The case's limits and set-up, then one event of every subject (its counters
    exist) or, for a seat limit, one of each of its 20 users (its seats are held)."""
    with Meter(url) as meter:
        meter.set_limits(case.limits)
        if case.setup is not None:
            case.setup(meter, subjects)
        rng = random.Random(0)
        now = meter.clock()
        calls = []
        for subject in subjects:
            for user in range(VALUES["user"] if "user" in case.keys else 1):
                charges, metadata = case.call(subject, rng)
                if metadata is not None and "user" in metadata:
                    metadata["user"] = f"user-{user}"
                calls.append((charges, metadata))
        apply_all(meter, [make_event(charges, now, metadata=meta) for charges, meta in calls])


def paired_job(
    urls: tuple[str, str], cases: tuple[Case, Case], subjects: list[str], seed: int, speculate: bool
) -> Callable[[int, int], Callable[[], tuple[list[int], list[int]]]]:
    """A `run_prepared_each` job: a meter on each of two databases (the case's,
    then plain's), each warmed on `WARM_CALLS` calls, then ``events`` calls of
    each timed in alternating slices of `SLICE` (the first side turning every
    slice), both on the same subjects in the same order; each side's latencies.
    With ``speculate`` false, no fast path speculates on cached rows
    (`metering.storage.hot.speculative`)."""

    def prepare(index: int, events: int) -> Callable[[], tuple[list[int], list[int]]]:
        rng = random.Random(seed * 100 + index)
        drawn = [rng.choice(subjects) for _ in range(WARM_CALLS + events)]
        sides = []
        for url, case in zip(urls, cases, strict=True):
            metadata_rng = random.Random(seed * 100 + index)
            work = [case.call(subject, metadata_rng) for subject in drawn]
            meter = Meter(url)
            if not speculate:
                for path in meter._engine.paths:
                    if isinstance(path, Direct):
                        path.rows = None
            for charges, metadata in work[:WARM_CALLS]:
                meter.consume(charges=charges, metadata=metadata)
            sides.append((meter, work[WARM_CALLS:]))

        def timed() -> tuple[list[int], list[int]]:
            latencies: tuple[list[int], list[int]] = ([], [])
            for number, at in enumerate(range(0, events, SLICE)):
                for side in (0, 1) if number % 2 == 0 else (1, 0):
                    meter, work = sides[side]
                    for charges, metadata in work[at : at + SLICE]:
                        began = time.perf_counter_ns()
                        meter.consume(charges=charges, metadata=metadata)
                        latencies[side].append(time.perf_counter_ns() - began)
            return latencies  # the child ends here, its connections with it

        return timed

    return prepare


def consume_round(
    urls: dict[str, str],
    case: Case,
    subjects: list[str],
    processes: int,
    calls: int,
    seed: int,
    speculate: bool,
) -> tuple[Figures, float, float | None]:
    """``calls`` calls, half of ``case`` and half of plain, paired (split between
    the processes): the case's figures (its rate: its calls over their own
    time, per process) and the ratio of plain's summed time to its; for a
    case with a yardstick (`Case.stacked`), as many calls again paired with
    the yardstick's, and the ratio of the yardstick's summed time to its."""
    figures, to_plain = _paired_round(
        urls, (case, CASES[0]), subjects, processes, calls, seed, speculate
    )
    if not case.stacked:
        return figures, to_plain, None
    yardstick = next(other for other in CASES if other.name == case.stacked)
    _, to_stacked = _paired_round(
        urls, (case, yardstick), subjects, processes, calls, seed, speculate
    )
    return figures, to_plain, to_stacked


def _paired_round(
    urls: dict[str, str],
    cases: tuple[Case, Case],
    subjects: list[str],
    processes: int,
    calls: int,
    seed: int,
    speculate: bool,
) -> tuple[Figures, float]:
    """`paired_job` of ``cases`` in ``processes``: the first's figures, and the
    ratio of the second's summed time to the first's."""
    case, other = cases
    job = paired_job((urls[case.name], urls[other.name]), cases, subjects, seed, speculate)
    found = run_prepared_each(job, processes, calls // 2 // processes)
    mine = [ns for ours, _ in found for ns in ours]
    theirs = sum(ns for _, others in found for ns in others)
    figures = Figures(case.name, processes, len(mine), sum(mine) / processes / 1e9, mine)
    return figures, theirs / sum(mine)


def apply_rounds(
    urls: dict[str, str],
    peer: str,
    cases: list[Case],
    subjects: list[str],
    seed: int,
    batches: int,
    collector_between: bool = True,
) -> list[Figures]:
    """`Meter.apply` of ``batches`` 1,000-event batches per case, after 100
    events to warm up, and the ledger peer's over the plain case's events,
    interleaved: each pass applies one batch of every case in turn (the
    order reversed every other pass) and one of the peer, so a change of
    the machine's load meets every case alike. A case's time is the sum of
    its batches'. With ``collector_between``, what was made before the
    first batch is frozen (as a worker's start does) and the garbage
    collector runs before each batch, out of its time: each batch then pays
    the first collection after it (of what it left alive) and no older
    generation's, which would otherwise land on one case for a whole run."""
    meters = {case.name: Meter(urls[case.name]) for case in cases}
    work = {}
    for case in cases:
        meter = meters[case.name]
        events = events_of(case, subjects, seed, 1000 * batches + WARM_UP, meter)
        apply_all(meter, events[:WARM_UP])
        work[case.name] = [events[at : at + 1000] for at in range(WARM_UP, len(events), 1000)]
    # The plain batches' own rows: their ids (random, as `make_event` makes
    # them) fall all over the key's index, as ours do.
    rows = [
        [(e.event_id, *e.charges[0], e.occurred_at_us) for e in batch] for batch in work["plain"]
    ]
    ledger = ledger_postgres if peer.startswith("postgresql") else ledger_sqlite
    latencies: dict[str, list[int]] = {name: [] for name in [*meters, PEER]}
    if collector_between:
        gc.collect()
        gc.freeze()
    for number in range(batches):
        for case in cases if number % 2 == 0 else cases[::-1]:
            if collector_between:
                gc.collect()
            began = time.perf_counter_ns()
            # Read as a caller would: `Meter.apply` makes a decision when it is read.
            sum(getattr(d, "allowed", 0) for d in meters[case.name].apply(work[case.name][number]))
            latencies[case.name].append(time.perf_counter_ns() - began)
        if collector_between:
            gc.collect()
        latencies[PEER] += ledger(peer, [rows[number]])[1]
    if collector_between:
        gc.unfreeze()
    for meter in meters.values():
        meter.close()
    return [
        Figures(name, 1, 1000 * batches, sum(found) / 1e9, found)
        for name, found in latencies.items()
    ]


class Results:
    """Every round's figures per (path, case), and the ratios taken within each round."""

    def __init__(self) -> None:
        self.figures: dict[tuple[str, str], list[Figures]] = {}
        self.pairs: dict[tuple[str, str], list[float]] = {}  # a paired `consume` round's ratio
        self.to_stacked: dict[tuple[str, str], list[float]] = {}  # ... to its yardstick

    def add(
        self,
        path: str,
        figures: Figures,
        paired: float | None = None,
        to_stacked: float | None = None,
    ) -> None:
        self.figures.setdefault((path, figures.name), []).append(figures)
        tail = ""
        if paired is not None:
            self.pairs.setdefault((path, figures.name), []).append(paired)
            tail = f" (paired with plain: {paired:.2f}"
            if to_stacked is not None:
                self.to_stacked.setdefault((path, figures.name), []).append(to_stacked)
                tail += f"; with {STACKED[figures.name]}: {to_stacked:.2f}"
            tail += ")"
        print(f"  {path}, {figures.name}: {figures.rate:,.0f}/s{tail}", flush=True)

    def ratio(self, path: str, name: str, to: str) -> str:
        """The median of the per-round ratios of the rates."""
        ours, theirs = self.figures[(path, name)], self.figures.get((path, to), [])
        if not theirs:
            return ""
        return f"{median([a.rate / b.rate for a, b in zip(ours, theirs, strict=True)]):.2f}"

    def paired(self, path: str, name: str, to: str) -> str:
        """`consume`: the median of the rounds' ratios of the summed times of
        ``to``'s calls and the case's in the same processes (plain, or the
        case's yardstick, each paired with it). `apply`: the median of the
        ratios of the batches applied in the same pass (the k-th batch of one
        case against the k-th of the other, every round)."""
        if (path, name) in self.pairs:
            if to == "plain":
                return f"{median(self.pairs[(path, name)]):.2f}"
            if to != STACKED.get(name) or (path, name) not in self.to_stacked:
                return ""
            return f"{median(self.to_stacked[(path, name)]):.2f}"
        ours, theirs = self.figures[(path, name)], self.figures.get((path, to), [])
        if not theirs:
            return ""
        pairs = [
            b / a
            for mine, other in zip(ours, theirs, strict=True)
            for a, b in zip(mine.latencies_ns, other.latencies_ns, strict=True)
        ]
        return f"{median(pairs):.2f}"

    def rows(
        self, path: str, cases: list[Case], unit: str, peer_rate: float = 0.0
    ) -> list[list[str]]:
        """A row per case (and the peer's, for `apply`); ``peer_rate``: the
        ledger peer's `apply` rate, for the worker's rows."""
        found = []
        names = [case.name for case in cases] + ([PEER] if path.startswith("apply") else [])
        labels = {case.name: case.label for case in [*CASES, NEW_SEATS]} | {PEER: PEER}
        for name in names:
            rounds = self.figures[(path, name)]
            rate = median([f.rate for f in rounds])
            latencies = [ns for figures in rounds for ns in figures.latencies_ns]
            pooled = Figures(name, rounds[0].processes, 1, 1.0, latencies)
            stacked = STACKED.get(name, "")
            row = [path, labels[name], f"{rate:,.0f}"]
            if path == WORKER:
                row += ["", "", self.ratio(path, name, "plain")]
                row += [self.ratio(path, name, stacked) if stacked else ""]
                row += [f"{rate / peer_rate:.2f}" if peer_rate else "", ""]
            else:
                row += [f"{pooled.percentile_ms(0.5):.2f} {unit}"]
                row += [f"{pooled.percentile_ms(0.99):.2f} {unit}"]
                row += [self.ratio(path, name, "plain")]
                row += [self.ratio(path, name, stacked) if stacked else ""]
                batches = path.startswith("apply")
                row += [self.ratio(path, name, PEER) if batches else ""]
                paired = self.paired(path, name, "plain")
                if paired and stacked:
                    paired += f" ({self.paired(path, name, stacked)})"
                row += [paired]
            found.append(row)
        return found


def measure(
    urls: dict[str, str],
    peer: str,
    subjects: list[str],
    process_counts: list[int],
    consume: int,
    args: Any,
) -> list[list[str]]:
    """Interleaved rounds over the cases of one database, ``consume`` calls a
    round of each; the table's rows."""
    results = Results()
    cases: list[Case] = args.cases
    for round_ in range(args.rounds):
        order = cases[round_ % len(cases) :] + cases[: round_ % len(cases)]
        for processes in process_counts:
            path = f"consume, {processes} process{'es' if processes > 1 else ''}"
            for case in order:
                figures, paired, to_stacked = consume_round(
                    urls, case, subjects, processes, consume, 1000 + round_, not args.no_speculation
                )
                results.add(path, figures, paired, to_stacked)
        path = "apply, 1,000-event batches"
        for figures in apply_rounds(
            urls, peer, order, subjects, round_, args.batches, not args.collector_in_batches
        ):
            results.add(path, figures)
    rows = []
    for processes in process_counts:
        path = f"consume, {processes} process{'es' if processes > 1 else ''}"
        rows.extend(results.rows(path, cases, "ms"))
    rows.extend(results.rows("apply, 1,000-event batches", cases, "ms/batch"))
    return rows


WORKER = "worker end to end"


def worker_round(
    meter: Meter, producer: UsageProducer, case: Case, subjects: list[str], seed: int, events: int
) -> Figures:
    """``events`` events through the producer, Redis and the case's warm worker
    to its database: events/s from the first emit to the last result."""
    rng = random.Random(seed)
    work = [case.call(rng.choice(subjects), rng) for _ in range(events)]
    before = meter.count_results()
    began = time.perf_counter()
    for charges, metadata in work:
        producer.emit(charges=charges, metadata=metadata)
    producer.flush()
    wait_for(meter, before + len(work))
    seconds = time.perf_counter() - began
    return Figures(case.name, 2, len(work), seconds, [int(seconds * 1e9)])


def wait_for(meter: Meter, results: int) -> None:
    deadline = time.monotonic() + 600
    while meter.count_results() < results:
        if time.monotonic() > deadline:
            raise SystemExit("bench_mix: the worker did not decide every event in 10 minutes")
        time.sleep(0.02)


@contextlib.contextmanager
def redis_brokers(count: int) -> Iterator[list[str]]:
    """``count`` Redis databases, on as many servers as they need (16 each)."""
    base = Path(tempfile.gettempdir())
    with contextlib.ExitStack() as stack:
        brokers = []
        for first in range(0, count, 16):
            redis = stack.enter_context(RedisServer(make_base_dir(base, "metering-bench-redis-")))
            redis.start()
            brokers += [redis.url(db) for db in range(min(16, count - first))]
        yield brokers


@contextlib.contextmanager
def embedded_brokers(count: int) -> Iterator[list[str]]:
    """``count`` embedded brokers (kombu's SQL transport), a SQLite file each."""
    directory = Path(tempfile.mkdtemp(prefix="metering-bench-mix-broker-"))
    yield [f"sqla+sqlite:///{directory}/broker-{number}.db" for number in range(count)]


def worker_rows(
    urls: dict[str, str],
    peer_rate: float,
    subjects: list[str],
    args: Any,
    brokers: Callable[[int], contextlib.AbstractContextManager[list[str]]],
) -> list[list[str]]:
    """A Celery worker per case (prefork, 2; on the embedded broker one
    process, as `metering worker` runs it there), all started first and kept
    warm, each on a broker of its own (``brokers``: Redis databases, or
    embedded brokers' files); then ``args.worker_rounds`` rounds of
    ``args.worker_events`` events a case, the cases' order turning each round,
    after one round to warm up (every worker process connected, its caches
    filled). Each row: the median of the rounds, its ratios the medians of the
    per-round ratios; to the peer, the median against the ledger peer's
    `apply` rate of the same run."""
    cases: list[Case] = args.cases
    results = Results()
    with contextlib.ExitStack() as stack:
        own = stack.enter_context(brokers(len(cases)))
        # The embedded broker's worker runs one process (`metering worker`'s own choice).
        pool = ["--pool", "solo"] if is_embedded_broker(own[0]) else ["--concurrency", "2"]
        workers = []
        try:
            for case, broker in zip(cases, own, strict=True):
                log = Path(tempfile.mkdtemp(prefix="metering-bench-mix-worker-")) / "worker.log"
                workers.append(start_worker(urls[case.name], broker, log, pool, settle=0))
            meters = {case.name: stack.enter_context(Meter(urls[case.name])) for case in cases}
            producers = {
                case.name: stack.enter_context(
                    UsageProducer(broker, batch_size=1000, flush_interval_seconds=0.05)
                )
                for case, broker in zip(cases, own, strict=True)
            }
            for round_ in range(args.worker_rounds + 1):
                order = cases[round_ % len(cases) :] + cases[: round_ % len(cases)]
                for case in order:
                    name = case.name
                    figures = worker_round(
                        meters[name], producers[name], case, subjects, round_, args.worker_events
                    )
                    if round_:  # the first round warms the workers up
                        results.add(WORKER, figures)
        finally:
            for worker in workers:
                stop_worker(worker)
    return results.rows(WORKER, cases, "", peer_rate)


def worker_rows_after(
    rows: list[list[str]],
    urls: dict[str, str],
    subjects: list[str],
    args: Any,
    brokers: Callable[[int], contextlib.AbstractContextManager[list[str]]],
) -> list[list[str]]:
    """The worker's rows, when asked for, after ``rows`` (whose last is the
    ledger peer's `apply` row, none with ``--worker-only``)."""
    if not (args.worker_events and args.worker_rounds):
        return []
    peer = float(rows[-1][2].replace(",", "")) if rows else 0.0
    began = time.perf_counter()
    found = worker_rows(urls, peer, subjects, args, brokers)
    print(f"  the worker's rounds took {time.perf_counter() - began:.0f} s", flush=True)
    return found


def postgres_rows(subjects: list[str], args: Any) -> list[list[str]]:
    with durable_postgres() as server:
        server.create_database("mix_template")
        upgrade_schema(server.url("mix_template"))
        urls = {}
        for case in args.cases:
            server.create_database(case.name, template="mix_template")
            urls[case.name] = server.url(case.name)
            prepare(case, urls[case.name], subjects)
            print(f"  PostgreSQL {case.name} set up", flush=True)
        server.create_database("ledger")
        install_ledger(server.url("ledger"))
        rows = []
        if not args.worker_only:
            rows = measure(urls, server.url("ledger"), subjects, args.processes, args.consume, args)
        return rows + worker_rows_after(rows, urls, subjects, args, redis_brokers)


def sqlite_rows(subjects: list[str], args: Any) -> list[list[str]]:
    directory = Path(tempfile.mkdtemp(prefix="metering-bench-mix-"))
    urls = {case.name: f"sqlite:///{directory}/{case.name}.db" for case in args.cases}
    for case in args.cases:
        prepare(case, urls[case.name], subjects)
    peer = str(directory / "ledger.db")
    install_ledger(peer)
    rows = []
    if not args.worker_only:
        rows = measure(urls, peer, subjects, args.processes, args.sqlite_consume, args)
    return rows + worker_rows_after(rows, urls, subjects, args, embedded_brokers)


def selected(names: list[str] | None, new_seats: bool) -> list[Case]:
    """The cases to run: ``names`` (every case if none), with plain and the
    stacked case each is compared with; ``new_seats`` adds `NEW_SEATS`."""
    every = [c for case in CASES for c in [case, NEW_SEATS][: 2 if case.name == "seats" else 1]]
    if not new_seats:
        every.remove(NEW_SEATS)
    if not names:
        return every
    unknown = set(names) - {case.name for case in every}
    if unknown:
        raise SystemExit(f"bench_mix: no such case: {', '.join(sorted(unknown))}")
    wanted = {"plain", NEW_SEATS.name, *names, *(STACKED[name] for name in names)}
    return [case for case in every if case.name in wanted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", type=int, default=500)
    parser.add_argument(
        "--consume", type=int, default=600, help="consume calls a round and case (half plain's)"
    )
    # A SQLite call takes a quarter of a PostgreSQL one: as many calls as
    # long a round, or one stall (a checkpoint, a neighbour) decides a row.
    parser.add_argument("--sqlite-consume", type=int, default=1000, help="the same on SQLite")
    # A stall (a checkpoint) takes three to four times a batch: with four
    # batches a round, one decided a case's round (p99 170 to 210 ms against
    # a p50 of 50 in cases whose code was the same as the run before).
    parser.add_argument("--batches", type=int, default=12, help="1,000-event batches a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4], help="consume")
    parser.add_argument("--sqlite-only", action="store_true", help="no PostgreSQL")
    parser.add_argument("--worker-only", action="store_true", help="only the worker rows (no peer)")
    parser.add_argument(
        "--no-speculation", action="store_true", help="consume: no speculative round trip"
    )
    parser.add_argument("--worker-events", type=int, default=2500, help="per case and worker round")
    parser.add_argument("--worker-rounds", type=int, default=8, help="0: no worker rows")
    parser.add_argument("--new-seats", action="store_true", help=NEW_SEATS.label.split(" (")[0])
    parser.add_argument(
        "--collector-in-batches",
        action="store_true",
        help="apply: no collection between batches, nothing frozen (the runs before 2026-12-01)",
    )
    parser.add_argument("--cases", nargs="+", help="only these (and plain, stacked)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.subjects, args.consume, args.batches, args.rounds = 20, 20, 1, 1
        args.sqlite_consume = 20
        args.worker_events = min(args.worker_events, 200)
        args.worker_rounds = min(args.worker_rounds, 1)
    args.cases = selected(args.cases, args.new_seats)
    subjects = [f"subject-{n}" for n in range(args.subjects)]
    header = ["database", "path", "configuration", "events/s", "p50", "p99", "ratio to plain"]
    header += ["ratio to stacked (as many counters)", "ratio to ledger peer"]
    header += ["paired: ratio to plain (to stacked)"]
    rows = [] if args.sqlite_only else [["PostgreSQL", *r] for r in postgres_rows(subjects, args)]
    rows += [["SQLite", *r] for r in sqlite_rows(subjects, args)]
    worker = f", {args.worker_rounds} worker rounds of {args.worker_events} events"
    print_table(
        f"every configuration against plain ({args.subjects:,} subjects, {args.rounds} rounds, "
        f"{args.consume} consume calls ({args.sqlite_consume} on SQLite) and {args.batches} "
        f"batches a round{worker})",
        header,
        rows,
    )


if __name__ == "__main__":
    main()
