"""`run_audit`: the ledger proves itself (``metering audit``, beat, ``GET /v1/audit``).

One transaction (on PostgreSQL one snapshot) checks each `metering.domain.audit.Invariant`.
Incremental by default: the windows touched since the last run's watermark (results, voids,
give-backs, resets since) added to what that run kept of them (``audit_windows``): the cost
follows the traffic; the watermark stays `SETTLE_SECONDS` behind the clock for late commits.
``full`` (and the first run): every window but those retention pruned; ``since``: those
touched since then, from the whole ledger, keeping nothing; both judge the rollups too
(`metering.upkeep.audit_rollups`). Held reservations and checkouts, stuck deliveries, old
undecided queued events (given a broker) are found too; one ``audit.violation`` tells of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any, Final

from sqlalchemy import Connection

from metering.domain.audit import (
    INVARIANTS,
    Invariant,
    SeatValue,
    Tally,
    Violation,
    WindowKey,
    consumed,
    judge_counter,
    judge_grant,
    judge_hard,
    judge_seats,
    live_values,
    seat_windows,
    spend_violations,
)
from metering.domain.dimension_history import Era, ever_gauge, holds_a_sum
from metering.domain.instants import from_us, to_us
from metering.domain.kinds import sums_usage
from metering.domain.limits import Limit
from metering.meter import Meter
from metering.storage.audit import CHECKED_TO, AuditStore, ResultRow
from metering.storage.limits import LimitStore
from metering.storage.queue_state import oldest_undecided, open_queues
from metering.storage.store import Store
from metering.upkeep.audit_rollups import RollupCheck

SETTLE_SECONDS: Final = 60.0
DEFAULT_SWEEP_SECONDS: Final = 10.0
DEFAULT_STUCK_SECONDS: Final = 600.0
DEFAULT_QUEUE_SECONDS: Final = 900.0
# Violations one webhook message lists (the count is always whole).
ANNOUNCED: Final = 100


@dataclass(frozen=True, slots=True)
class AuditReport:
    """What a run checked (from and to which instants, how many windows) and found."""

    ran_at: datetime
    full: bool
    checked_from: datetime | None
    checked_to: datetime
    windows: int
    violations: tuple[Violation, ...]
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations

    def counts(self) -> dict[str, int]:
        """Violations per invariant, every invariant named (0 when none)."""
        return counted(v.invariant.value for v in self.violations)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ran_at": self.ran_at.isoformat(),
            "full": self.full,
            "checked_from": self.checked_from.isoformat() if self.checked_from else None,
            "checked_to": self.checked_to.isoformat(),
            "windows": self.windows,
            "counts": self.counts(),
            "violations": [v.to_dict() for v in self.violations],
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class AuditOptions:
    """Bounds: the reservation sweep's interval (a reservation may stay held
    that long past its TTL), how long a due delivery may wait, how old a
    queued event without result may be; the broker to look at (None: no queue check)."""

    sweep_seconds: float = DEFAULT_SWEEP_SECONDS
    stuck_seconds: float = DEFAULT_STUCK_SECONDS
    queue_seconds: float = DEFAULT_QUEUE_SECONDS
    broker_url: str | None = None
    queues: Sequence[str] = ("metering",)


@dataclass(slots=True)
class _Run:
    """One run's state while it reads the ledger."""

    now_us: int
    after_us: int | None  # the ledger is read from here (None: all of it)
    cut_us: int  # what is kept reaches this
    touched_after_us: int | None  # the windows judged are those touched after this
    kept: Tally  # up to cut_us
    full: bool = False
    keeps: bool = True  # what it read is kept for the next run (not after a look ``since``)
    violations: list[Violation] = field(default_factory=list)
    touched: set[WindowKey] = field(default_factory=set)
    # Results read that consumed in seat windows: (event id, reset tick, those windows).
    seated: list[tuple[str, int, list[WindowKey]]] = field(default_factory=list)
    # The greatest tick of the resets read, per window.
    reset_ticks: dict[WindowKey, int] = field(default_factory=dict)


def run_audit(
    meter: Meter,
    *,
    full: bool = False,
    since: datetime | None = None,
    options: AuditOptions | None = None,
) -> AuditReport:
    """Check the ledger (see the module); nothing but the audit's own tables is written."""
    options = options or AuditOptions()
    database = meter.database
    since_us = None if since is None else to_us(since, field_name="since")
    notes: list[str] = []
    queued: list[Violation] = []
    if options.broker_url is not None:
        try:
            queued = _queue_violations(meter, options, options.broker_url, database.now_us())
        except Exception as exc:  # a broker away is a note, not a failed audit
            notes.append(f"queues not checked: {exc}")

    def work(connection: Connection) -> AuditReport:
        store = AuditStore(connection)
        store.begin_snapshot()
        return _audit(store, _plan(store, database.now_us(), full, since_us), options, queued)

    return replace(database.run(work), notes=tuple(notes))


def last_report(meter: Meter) -> dict[str, Any] | None:
    """The latest run as `AuditReport.to_dict` gave it (None: never ran)."""
    found = meter.database.run(lambda connection: AuditStore(connection).last_run())
    if found is None:
        return None
    violations = found["violations"]
    start = found["checked_from_us"]
    return {
        "ran_at": from_us(found["ran_at_us"]).isoformat(),
        "full": bool(found["full"]),
        "checked_from": from_us(start).isoformat() if start is not None else None,
        "checked_to": from_us(found["checked_to_us"]).isoformat(),
        "windows": found["windows"],
        "counts": counted(v["invariant"] for v in violations),
        "violations": violations,
    }


def counted(invariants: Iterable[str]) -> dict[str, int]:
    """Violations per invariant, every invariant named (0 when none)."""
    found = dict.fromkeys(INVARIANTS, 0)
    for invariant in invariants:
        found[invariant] = found.get(invariant, 0) + 1
    return found


def _plan(store: AuditStore, now_us: int, full: bool, since_us: int | None) -> _Run:
    """What this run reads, judges and keeps (see the module)."""
    watermark = store.mark(CHECKED_TO)
    if since_us is not None:
        return _Run(now_us, None, now_us, since_us, Tally(), keeps=False)
    if full or watermark is None:
        return _Run(now_us, None, now_us - _us(SETTLE_SECONDS), None, Tally(), full=True)
    cut_us = max(watermark, now_us - _us(SETTLE_SECONDS))
    return _Run(now_us, watermark, cut_us, watermark, Tally())


def _audit(
    store: AuditStore, run: _Run, options: AuditOptions, queued: list[Violation]
) -> AuditReport:
    limits = {limit.name: limit for limit in Store(store.connection).list_limits()}
    currencies = {name: limit.currency for name, limit in limits.items() if limit.currency}
    distinct = {name: limit.distinct for name, limit in limits.items() if limit.distinct}
    history = LimitStore(store.connection).dimension_history()
    rollups = (
        None
        if run.after_us is not None
        else RollupCheck(store, limits, history, run.touched_after_us)
    )
    seen = _read_ledger(store, run, currencies, distinct, rollups)
    keys = _judged_keys(store, run, limits, history)
    used = store.counters_of(keys)
    run.violations.extend(_judge_windows(store, seen, keys, used, limits))
    run.violations.extend(_judge_seats(store, run, keys, used, distinct))
    if rollups is not None:
        run.violations.extend(rollups.violations())
    pairs = None if run.full else {(s, lim) for s, lim, _ in keys}
    for grant in store.grant_balances(pairs):
        found = judge_grant(*grant)
        if found is not None:
            run.violations.append(found)
    run.violations.extend(store.orphans_since(run.after_us))
    run.violations.extend(store.unresolved(run.now_us - _us(options.sweep_seconds)))
    run.violations.extend(store.stuck_deliveries(run.now_us - _us(options.stuck_seconds)))
    run.violations.extend(queued)
    return _keep(store, run, len(keys))


def _keep(store: AuditStore, run: _Run, windows: int) -> AuditReport:
    """Keep what the next run starts from (not after a look ``since``), the
    run itself, and the webhook when it found something."""
    if run.keeps:
        kept = run.kept.windows
        store.save_ledgers(
            kept if run.full else {k: kept[k] for k in run.kept.touched}, replace=run.full
        )
        store.set_mark(CHECKED_TO, run.cut_us)
    violations = tuple(run.violations)
    checked = (run.touched_after_us, run.cut_us)
    store.record_run(run.now_us, checked, full=run.full, windows=windows, violations=violations)
    if violations:
        store.announce(_announcement(violations, run.now_us), run.now_us)
    return AuditReport(
        from_us(run.now_us),
        run.full,
        _moment(run.touched_after_us),
        from_us(run.cut_us),
        windows,
        violations,
    )


def _read_ledger(
    store: AuditStore,
    run: _Run,
    currencies: dict[str, str],
    distinct: dict[str, str],
    rollups: RollupCheck | None = None,
) -> Tally:
    """Fill ``run.kept`` with the ledger up to ``run.cut_us`` (from what earlier
    runs kept of the windows touched), and return the ledger as it is now
    (past the cut too). Spend charges are checked on the way; results in seat
    windows (``distinct``: limit to key) and resets' ticks go to ``run``, every
    result to ``rollups``."""
    resets = store.resets_since(run.after_us)
    taken = [*store.voids_since(run.after_us), *store.give_backs_since(run.after_us)]
    more = [] if run.after_us is None else _charged_more(store.commits_since(run.after_us))
    # Commits of results this run reads: a reset may have cleared the result before them.
    rewritten = [
        (key, extra, settled_us, tick, maximum)
        for charged, held, settled_us, tick in store.commits_of_results_since(run.after_us)
        for key, extra, maximum in _added(charged, held)
    ]
    metadata = rollups is not None and rollups.metadata
    decided: Iterable[ResultRow] = store.results_since(run.after_us, metadata=metadata)
    if run.after_us is not None:  # since the last run: as much as the traffic
        decided = list(decided)
        run.kept = Tally(store.ledgers(_keys_of(decided, [*resets, *taken, *more])))
    later: list[Callable[[Tally], None]] = []

    def at(moment_us: int, keys: Iterable[WindowKey], apply: Callable[[Tally], None]) -> None:
        if run.touched_after_us is None or moment_us > run.touched_after_us:
            run.touched.update(keys)
        if moment_us <= run.cut_us:
            apply(run.kept)
        else:
            later.append(apply)

    for key, tick, reset_us in resets:
        run.reset_ticks[key] = max(tick, run.reset_ticks.get(key, -1))
        at(reset_us, [key], partial(Tally.reset, key=key, tick=tick, at_us=reset_us))
    for event_id, outcome, decided_us, tick, text, occurred_us, meta in decided:
        charges = json.loads(text)
        if rollups is not None:
            rollups.read(event_id, outcome, decided_us, tick, charges, occurred_us, meta)
        run.violations.extend(spend_violations(event_id, outcome, charges, currencies))
        touched = [key for key, _, _ in consumed(outcome, charges)]
        if distinct and (seated := seat_windows(outcome, charges, distinct)):
            run.seated.append((event_id, tick, seated))
        if touched:
            add = partial(Tally.add_result, outcome=outcome, reset_tick=tick, charges=charges)
            at(decided_us, touched, add)
    for key, units, done_us in taken:
        at(done_us, [key], partial(Tally.take_back, key=key, units=units, at_us=done_us))
    for key, units, done_us in more:
        at(done_us, [key], partial(Tally.add_units, key=key, units=units, at_us=done_us))
    for key, units, done_us, tick, maximum in rewritten:
        add = partial(
            Tally.add_units, key=key, units=units, at_us=done_us, result_tick=tick, maximum=maximum
        )
        at(done_us, [key], add)
    seen = run.kept.copy()
    for apply in later:
        apply(seen)
    return seen


def _keys_of(
    decided: Iterable[ResultRow], changed: Iterable[tuple[WindowKey, int, int]]
) -> list[WindowKey]:
    """The windows these rows of the ledger touch."""
    keys = {key for key, _, _ in changed}
    for _, outcome, _, _, text, *_ in decided:
        keys.update(key for key, _, _ in consumed(outcome, json.loads(text)))
    return sorted(keys)


def _charged_more(commits: Iterable[tuple[str, str, int]]) -> list[tuple[WindowKey, int, int]]:
    """Commits that rewrote their result, of results decided before the run:
    per window, the units above the held cost (a commit of more than was
    reserved) or below it (a spend charge's money a commit of fewer priced
    units kept), and when."""
    return [
        (key, extra, settled_us)
        for charged, held, settled_us in commits
        for key, extra, _ in _added(charged, held)
    ]


def _added(charged: str, held: str) -> Iterator[tuple[WindowKey, int, int]]:
    """Per window of a committed result (``charged``, its reservation's
    ``held`` charges, as JSON) whose cost the commit changed: the units it
    added (fewer: taken off) and the charge's maximum."""
    reserved = {(str(s), str(lim)): int(cost) for s, lim, cost, *_ in json.loads(held)}
    for key, cost, maximum in consumed("allowed", json.loads(charged)):
        extra = cost - reserved.get((key[0], key[1]), cost)
        if extra:
            yield key, extra, maximum


def _judged_keys(
    store: AuditStore, run: _Run, limits: dict[str, Limit], history: Mapping[str, Sequence[Era]]
) -> list[WindowKey]:
    """The windows to judge: the touched ones, and in a full run every
    counter, less gauges' (and a limit's that was one in some era of its
    ``history``, up to the window it became a sum in: those hold a level)
    and, in a full run, those retention pruned."""
    keys = set(run.touched)
    if run.full:
        keys.update(store.counters_of(None))
        whole_us = store.whole_from_us()
        if whole_us is not None:
            keys = {k for k in keys if k[2] >= whole_us}
    gauged = {name: eras for name, eras in history.items() if ever_gauge(eras)}
    ends = store.window_ends([k for k in keys if k[1] in gauged])
    return sorted(
        k
        for k in keys
        if (k[1] not in gauged or (k in ends and holds_a_sum(gauged[k[1]], ends[k])))
        and ((limit := limits.get(k[1])) is None or sums_usage(limit))
    )


def _judge_windows(
    store: AuditStore,
    seen: Tally,
    keys: list[WindowKey],
    used: dict[WindowKey, int],
    limits: dict[str, Limit],
) -> list[Violation]:
    """The judged windows' counters (``used``) against their ledgers and maximums."""
    hard = [
        k for k in keys if (limit := limits.get(k[1])) is not None and limit.enforcement == "hard"
    ]
    drawn, overdrawn = store.drawn(hard), store.overdrawn(hard)
    found = []
    for key in keys:
        limit = limits.get(key[1])
        ledger = seen.windows.get(key)
        counter = used.get(key, 0)
        spend = limit is not None and limit.currency is not None
        verdict = judge_counter(key, ledger.used if ledger else 0, counter, spend=spend)
        if verdict is not None:
            found.append(verdict)
        if limit is not None and limit.enforcement == "hard":
            maximum = ledger.maximum if ledger else 0
            over = judge_hard(key, counter, maximum, drawn.get(key, 0), overdrawn.get(key, 0))
            if over is not None:
                found.append(over)
    return found


def _judge_seats(
    store: AuditStore,
    run: _Run,
    keys: list[WindowKey],
    used: dict[WindowKey, int],
    distinct: dict[str, str],
) -> list[Violation]:
    """The judged seat windows: their counters (``used``) against the values holding a
    seat, and the values of the live events read (unvoided, not cleared by a
    reset since) that hold none."""
    judged = {key for key in keys if key[1] in distinct}
    if not judged:
        return []
    unvoided = store.unvoided_metadata(
        event_id for event_id, _, windows in run.seated if judged.intersection(windows)
    )
    live: dict[SeatValue, str] = {}
    for event_id, tick, windows in run.seated:
        if event_id not in unvoided:
            continue
        text = unvoided[event_id]
        metadata = json.loads(text) if text else None
        mine = [key for key in windows if key in judged]
        for seat, holder in live_values(event_id, mine, metadata, distinct, run.reset_ticks, tick):
            live.setdefault(seat, holder)
    ordered = sorted(judged)
    held = store.seats_held(ordered)
    unheld: dict[WindowKey, dict[str, str]] = {}
    for seat, holder in live.items():
        if seat[3] not in held.get(seat[:3], ()):
            unheld.setdefault(seat[:3], {})[seat[3]] = holder
    found = []
    for key in ordered:
        seats = len(held.get(key, ()))
        found.extend(judge_seats(key, used.get(key, 0), seats, unheld.get(key, {})))
    return found


def _queue_violations(
    meter: Meter, options: AuditOptions, broker_url: str, now_us: int
) -> list[Violation]:
    broker = open_queues(broker_url)
    try:
        oldest = oldest_undecided(broker, list(options.queues), meter.decided).message
    finally:
        broker.close()
    if oldest is None or oldest.sent_at_us is None:
        return []
    age_us = now_us - oldest.sent_at_us
    if age_us <= _us(options.queue_seconds):
        return []
    return [
        Violation(
            Invariant.QUEUE_UNDECIDED,
            expected=f"decided within {options.queue_seconds:g}s",
            found=f"queued {age_us / 1e6:.0f}s ago, no result",
            item=",".join(oldest.event_ids[:5]),
        )
    ]


def _announcement(violations: Sequence[Violation], now_us: int) -> dict[str, Any]:
    counts = {name: n for name, n in counted(v.invariant.value for v in violations).items() if n}
    return {
        "type": "audit.violation",
        "timestamp": from_us(now_us).isoformat().replace("+00:00", "Z"),
        "data": {
            "violations": len(violations),
            "counts": counts,
            "listed": [v.to_dict() for v in violations[:ANNOUNCED]],
        },
    }


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _moment(us: int | None) -> datetime | None:
    return from_us(us) if us is not None else None
