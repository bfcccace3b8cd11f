"""Applying usage events: the one function both `consume` and the worker call.

`apply_events` takes a batch in order and, inside the caller's transaction,

1. answers ids already decided with their stored result (or a conflict),
   before judging an event's time or limits;
2. resolves each charge's counter: its limit, and the window at the event's
   ``occurred_at`` (first-use windows are serialised on their
   ``current_windows`` row);
3. locks every counter the batch touches with one sorted upsert;
4. decides event after event with the pure domain, so a batch gives the same
   results as applying its events one by one;
5. writes counters, results and the usage rollups of limits with
   dimensions in the same transaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache

from metering.domain.decisions import (
    ROW_FIELDS,
    ChargeDecision,
    ChargeInput,
    Decision,
    decide_event,
    make_decision,
)
from metering.domain.distinct import value_of
from metering.domain.events import UsageEvent, check_event_time, refuse_free
from metering.domain.grants import History, Pot, maximum_at
from metering.domain.imports import ImportPolicy
from metering.domain.instants import from_us, to_us
from metering.domain.licenses import consumed_concurrent
from metering.domain.limits import Limit
from metering.domain.notifications import Transition, notices_of, payload_of
from metering.domain.rollups import merged, rollup_deltas, spend_deltas
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.domain.windows import Window, calendar_window, first_use_window
from metering.domain.zones import ZoneHistory, follows_zone
from metering.engine.answers import CONFLICT, DUPLICATE, Answer, InvalidPolicy
from metering.engine.breakers import Breakers
from metering.engine.forecasts import leads_of, with_forecasts
from metering.engine.money import Money, refuse_spend_charge
from metering.engine.seats import Seats, seat_keys
from metering.errors import EventConflict, MeteringError, UnknownLimit
from metering.storage.alerts import AlertRecord, AlertStore
from metering.storage.allowances import AllowanceStore, draws_of
from metering.storage.connections import RetryTransaction
from metering.storage.counters import Pair
from metering.storage.recurring import issue_due
from metering.storage.results import ResultRecord
from metering.storage.rollups import record_rollups
from metering.storage.store import Store
from metering.storage.webhooks import WebhookStore

# What applying one event gives: its decision, or the conflict of a reused id.
Decided = Decision | EventConflict


@dataclass
class WindowResolver:
    """Finds each charge's counter key; remembers windows opened in this batch
    and the subjects' changes of time zone it read (a calendar window's)."""

    store: Store
    current: dict[Pair, Window | None]
    opened: dict[Pair, list[Window]] = field(default_factory=lambda: defaultdict(list))
    changed: dict[Pair, Window] = field(default_factory=dict)
    zones: dict[str, ZoneHistory] = field(default_factory=dict)

    def key(self, limit: Limit, subject: str, at_us: int) -> CounterKey:
        if limit.algorithm == "token_bucket":
            return CounterKey(limit.name, subject, NO_WINDOW, NO_WINDOW)
        if limit.window == "calendar":
            period = limit.parsed_period
            zones = self.zones_of(subject) if follows_zone(period) else ()
            start, end = calendar_window(period, at_us, zones)
        else:
            start, end = self._first_use(limit, (limit.name, subject), at_us)
        return CounterKey(limit.name, subject, start, end)

    def zones_of(self, subject: str) -> ZoneHistory:
        found = self.zones.get(subject)
        if found is None:
            read = AllowanceStore(self.store.connection).time_zones([subject])
            found = self.zones[subject] = read.get(subject, ())
        return found

    def _first_use(self, limit: Limit, pair: Pair, at_us: int) -> Window:
        current = self.current.get(pair)
        if current is None or at_us >= current[0]:
            window = first_use_window(limit.parsed_period, at_us, current, None)
            if window != current:
                self.current[pair] = window
                self.changed[pair] = window
                self.opened[pair].append(window)
            return window
        # A late event, before the current window: look among older windows.
        latest, following = self.store.windows_around(pair, at_us)
        before = [w for w in [latest, *self.opened[pair]] if w is not None and w[0] <= at_us]
        after = [
            w for w in [following, current, *self.opened[pair]] if w is not None and w[0] > at_us
        ]
        window = first_use_window(
            limit.parsed_period, at_us, max(before, default=None), min(after, default=None)
        )
        if window not in before and window not in after:
            self.opened[pair].append(window)
        return window


def first_use_pairs(events: Iterable[UsageEvent], limits: Mapping[str, Limit]) -> set[Pair]:
    return {
        (c.limit, c.subject)
        for event in events
        for c in event.charges
        if limits[c.limit].algorithm == "fixed_window" and limits[c.limit].window == "first_use"
    }


def validate_against_limits(
    event: UsageEvent, limits: Mapping[str, Limit], now_us: int, money: Money | None = None
) -> MeteringError | None:
    """The error that makes an event unacceptable, if any (unknown limit, bad
    time, a charge that would cost too much at ``money``'s prices)."""
    for charge in event.charges:
        limit = limits.get(charge.limit)
        if limit is None:
            return UnknownLimit(charge.limit)
        if limit.algorithm == "concurrent":
            return consumed_concurrent(limit.name)
        refused = refuse_spend_charge(limit) or refuse_free(limit, charge.cost)
        if refused is not None:
            return refused
        try:
            check_event_time(event.occurred_at, now_us, limit.lateness_seconds)
            if limit.distinct is not None:
                value_of(limit.distinct, limit.name, event.metadata, charge.cost)
        except MeteringError as exc:
            return exc
    return money.refusal(event) if money is not None else None


def apply_events(
    store: Store,
    events: Sequence[UsageEvent],
    now_us: int,
    *,
    invalid: InvalidPolicy = "raise",
    precheck: bool = True,
    policy: ImportPolicy | None = None,
) -> list[Decided]:
    """Apply ``events`` in order inside the caller's transaction.

    ``invalid="raise"`` raises the first event's error (the synchronous API);
    ``"reject"`` records the event as rejected with its reason (the worker).
    Without ``precheck`` ids are not looked up first: a repeated id is then
    caught by the results insert, which raises `RetryTransaction`.
    ``policy``: an import's flags (`ImportPolicy`), as the fast path applies them.
    """
    stored = store.fetch_results(e.event_id for e in events) if precheck else {}
    outputs: dict[int, Decided] = {}
    first_index: dict[str, int] = {}
    repeats: list[tuple[int, int]] = []
    pending: list[tuple[int, UsageEvent]] = []
    for index, event in enumerate(events):
        if event.event_id in stored:
            outputs[index] = _from_stored(event, stored[event.event_id])
        elif event.event_id in first_index:
            repeats.append((index, first_index[event.event_id]))
        else:
            first_index[event.event_id] = index
            pending.append((index, event))

    limits = store.load_limits(c.limit for _, e in pending for c in e.charges)
    if policy is not None:
        limits = {name: policy.limit(limit) for name, limit in limits.items()}
    rows: list[ResultRecord] = []
    valid: list[tuple[int, UsageEvent]] = []
    money = Money.read(store, [e for _, e in pending], limits) if pending else None
    if money is not None and policy is not None:  # the spend limits it adds, as the import says
        changed = {name: policy.limit(limit) for name, limit in money.limits.items()}
        money = replace(money, limits=changed)
    for index, event in pending:
        error = validate_against_limits(event, limits, now_us, money)
        if error is None:
            valid.append((index, event))
            continue
        # A decided id answers first (duplicate or conflict), whatever its time or limit.
        found = stored if precheck else store.fetch_results([event.event_id])
        if event.event_id in found:
            outputs[index] = _from_stored(event, found[event.event_id])
        elif invalid == "raise":
            raise error
        else:
            rejected = _rejected(event, str(error), now_us)
            outputs[index] = rejected
            rows.append(record_of(event, rejected))

    decided = _decide(store, [e for _, e in valid], limits, now_us, policy, money)
    for (index, event), decision in zip(valid, decided, strict=True):
        if policy is not None and policy.marker is not None:
            decision = replace(decision, reason=policy.marker)
        outputs[index] = decision
        rows.append(record_of(event, decision))

    inserted = store.insert_results(rows)
    if len(inserted) != len(rows):
        raise RetryTransaction("an event id was decided concurrently")
    # A spend limit with dimensions rolls its charges up too (`Money.limits`).
    decided_with = money.limits if money is not None else limits
    dimensioned = {
        name: limit.dimensions for name, limit in decided_with.items() if limit.dimensions
    }
    deltas = rollup_deltas(rows, dimensioned)
    if any(len(c) > ROW_FIELDS + 1 for row in rows for c in row.charges):
        deltas = merged(deltas, spend_deltas(rows))
    record_rollups(store.connection, deltas)
    for index, original in repeats:
        outputs[index] = _repeat(events[index], events[original], outputs[original])
    return [outputs[i] for i in range(len(events))]


def _decide(
    store: Store,
    events: Sequence[UsageEvent],
    limits: Mapping[str, Limit],
    now_us: int,
    policy: ImportPolicy | None = None,
    money: Money | None = None,
) -> list[Decision]:
    if not events:
        return []
    if money is not None:
        events = [money.expand(event) for event in events]
        limits = money.limits
    # A recurring grant's due issues first (of a spend limit too: priced events
    # charge it): the lock order is schedules, then windows.
    issue_due(store.connection, {(c.limit, c.subject) for e in events for c in e.charges}, now_us)
    pairs = first_use_pairs(events, limits)
    resolver = WindowResolver(store, store.lock_current_windows(pairs) if pairs else {})
    keys = [
        [resolver.key(limits[c.limit], c.subject, e.occurred_at_us) for c in e.charges]
        for e in events
    ]
    states = store.lock_counters({k for ks in keys for k in ks}, now_us)
    allowances = Allowed.read(store, events, keys, lock=True, money=money, limits=limits)
    if policy is not None:
        allowances = replace(allowances, policy=policy)
    seats = Seats.read(store, events, keys, limits)  # after the counters: their lock order
    breakers = allowances.breakers
    changed: dict[CounterKey, CounterState] = {}
    decisions = []
    transitions = []
    for event, event_keys in zip(events, keys, strict=True):
        before = [states.get(key, CounterState()) for key in event_keys]  # frozen: a copy
        event_seats = seat_keys(event, event_keys, limits)
        costs = seats.costs(event_seats) if any(event_seats) else None
        decision = decide_with_states(
            event, event_keys, limits, states, now_us, allowances, costs=costs
        )
        if costs is not None:
            seats.count(event_seats, decision)
        if breakers is not None:
            rows = [c.to_row() for c in decision.charges]
            breakers.charged(decision.outcome, rows, event.event_id, now_us)
        for key in event_keys:
            changed[key] = states[key]
        decisions.append(decision)
        after = [states[key] for key in event_keys]
        transitions.append(Transition(event.event_id, event_keys, before, after, decision.charges))
    store.write_counters(changed, now_us)
    store.write_current_windows(resolver.changed)
    seats.write(store)
    if allowances.pots:
        AllowanceStore(store.connection).write_draws(
            draws_of(c.to_row() for d in decisions if d.allowed for c in d.charges),
            now_us=now_us,
        )
    # Notifications are written in this transaction: a rollback takes them too.
    # Most events cause no candidate at all, and then no statement runs.
    enforce = policy is None or policy.enforce
    if breakers is not None:
        breakers.write(store.connection, now_us, announce=enforce)
    notices = notices_of(limits, transitions, allowances.own_thresholds(limits)) if enforce else []
    # Forecasts read the rates just written (`metering.engine.forecasts`).
    leads = leads_of(limits[c.limit] for e in events for c in e.charges) if enforce else {}
    if notices or leads:
        charged = ((d.event_id, [c.to_row() for c in d.charges]) for d in decisions)
        notices = with_forecasts(store.connection, leads, charged, notices, now_us)
    if notices:
        WebhookStore(store.connection).record_notices(
            [(notice, payload_of(notice, now_us)) for notice in notices], now_us
        )
    return decisions


@dataclass(frozen=True, slots=True)
class Allowed:
    """The subjects' own maximums and grants, for the charges of a batch."""

    histories: Mapping[Pair, History] = field(default_factory=dict)
    pots: Mapping[Pair, Pot] = field(default_factory=dict)
    alerts: Mapping[Pair, AlertRecord] = field(default_factory=dict)
    money: Money | None = None
    # The breakers of the charged pairs (`metering.engine.breakers`), stepped while deciding.
    breakers: Breakers | None = None
    # An import's flags, which hold a quarantine as they hold any maximum.
    policy: ImportPolicy | None = None

    @classmethod
    def read(
        cls,
        store: Store,
        events: Sequence[UsageEvent],
        keys: Sequence[Sequence[CounterKey]],
        *,
        lock: bool,
        money: Money | None = None,
        limits: Mapping[str, Limit] | None = None,
    ) -> Allowed:
        """Read them after the counters are locked (grants locked too, with ``lock``)."""
        allowances = AllowanceStore(store.connection)
        pairs = {(c.limit, c.subject) for event in events for c in event.charges}
        windows = [
            (k.limit, k.subject, k.window_start_us)
            for ks in keys
            for k in ks
            if k.window_end_us != NO_WINDOW
        ]
        pots = allowances.lock_pots({(n, s) for n, s, _ in windows}, windows, lock=lock)
        found = (limits or {}).values()
        breakers = Breakers.read(store.connection, found, pairs, lock=lock) if found else None
        alerts = AlertStore(store.connection).of(pairs)
        return cls(allowances.histories(pairs), pots, alerts, money, breakers)

    def own_thresholds(self, limits: Mapping[str, Limit]) -> dict[Pair, Limit]:
        """The limits of subjects with thresholds of their own, with those thresholds."""
        return {
            (name, subject): replace(
                limits[name], thresholds=record.thresholds, thresholds_units=record.thresholds_units
            )
            for (name, subject), record in self.alerts.items()
            if name in limits
        }

    def limit_for(self, limit: Limit, subject: str, at_us: int) -> Limit:
        history = self.histories.get((limit.name, subject))
        if history:
            limit = limit.with_maximum(maximum_at(history, limit.maximum, at_us))
        if self.is_quarantined(limit.name, subject):  # as an import holds it (``policy``)
            held = limit.quarantined()
            return held if self.policy is None else self.policy.limit(held)
        return limit

    def is_quarantined(self, limit: str, subject: str) -> bool:
        """Whether ``subject`` is held to ``limit``'s quarantine."""
        return self.breakers is not None and self.breakers.is_quarantined(limit, subject)


def decide_with_states(
    event: UsageEvent,
    keys: Sequence[CounterKey],
    limits: Mapping[str, Limit],
    states: dict[CounterKey, CounterState],
    now_us: int,
    allowed: Allowed | None = None,
    *,
    record: bool = True,
    costs: Sequence[int | None] | None = None,
) -> Decision:
    """Decide one event against ``states`` and update them in place (grants too).

    ``costs``: per charge, the cost to decide instead of the event's (a
    distinct limit's 1 or 0, `metering.engine.seats`), None where the event's.
    """
    allowed = allowed or Allowed()
    at_us = event.occurred_at_us
    money = allowed.money
    priced: dict[int, tuple[str, int]] = {}
    chosen = costs or [None] * len(event.charges)
    if money is not None:
        if money.counted(event):  # tiers: priced with the counters as they are now
            used = [states.get(key, CounterState()).used for key in keys]
            priced, spent = money.repriced(event, used)
            chosen = [
                mine if theirs is None else theirs
                for mine, theirs in zip(chosen, spent, strict=True)
            ]
        else:
            priced = money.priced(event)
    inputs = [
        ChargeInput(
            allowed.limit_for(limits[c.limit], c.subject, at_us),
            key,
            states.get(key, CounterState()),
            c.cost if cost is None else cost,
            allowed.pots.get((c.limit, c.subject))
            if key.window_end_us != NO_WINDOW and not allowed.is_quarantined(c.limit, c.subject)
            else None,
            priced.get(index),
        )
        for index, (c, key, cost) in enumerate(zip(event.charges, keys, chosen, strict=True))
    ]
    verdict = decide_event(inputs, event.occurred_at_us)
    for key, state in zip(keys, verdict.new_states, strict=True):
        states[key] = state
    return Decision(
        event_id=event.event_id if record else None,
        outcome=verdict.outcome,
        charges=verdict.charges,
        occurred_at=event.occurred_at,
        decided_at=from_us(now_us),
        denied_by=verdict.denied_by,
        metadata=event.metadata,
    )


def _from_stored(event: UsageEvent, stored: ResultRecord) -> Decided:
    if stored.fingerprint != event.fingerprint():
        return EventConflict(event.event_id)
    return decision_of(stored, duplicate=True)


def decision_of(record: ResultRecord, *, duplicate: bool) -> Decision:
    """The `Decision` a stored result describes."""
    rows = record.charges
    if len(rows) == 1:
        charges: tuple[ChargeDecision, ...] = (ChargeDecision.from_row(rows[0]),)
    else:
        charges = tuple(ChargeDecision.from_row(row) for row in rows)
    return make_decision(  # `Decision`'s fields in order
        record.event_id,
        record.outcome,
        charges,
        _instant(record.occurred_at_us),
        _instant(record.decided_at_us),
        record.denied_by,
        duplicate,
        record.reason,
        record.metadata,
    )


def decisions_of(event_ids: Sequence[str], answers: Sequence[Answer]) -> list[Decided]:
    """Each answer as `Meter.apply` returns it, in order: `decision_of` its
    record (a conflict is an `EventConflict`), in one loop for a batch, with
    no call per event but the constructors'."""
    made: list[Decided] = []
    append, charge, instant = made.append, ChargeDecision.from_row, _instant
    for event_id, answer in zip(event_ids, answers, strict=True):
        kind, record = answer.kind, answer.record
        if kind == CONFLICT or record is None:
            append(EventConflict(event_id))
            continue
        found, outcome, _, occurred_us, decided_us, denied_by, reason, rows, metadata = record
        if len(rows) == 1:
            charges: tuple[ChargeDecision, ...] = (charge(rows[0]),)
        else:
            charges = tuple([charge(row) for row in rows])
        append(
            make_decision(  # `Decision`'s fields in order
                found,
                outcome,
                charges,
                instant(occurred_us),
                instant(decided_us),
                denied_by,
                kind == DUPLICATE,
                reason,
                metadata,
            )
        )
    return made


@lru_cache(maxsize=1024)
def _instant(us: int) -> datetime:
    """`from_us`, remembered: a batch's results share their decision time
    (and often their events' time); a datetime is immutable."""
    return from_us(us)


def _repeat(event: UsageEvent, original: UsageEvent, first: Decided) -> Decided:
    if isinstance(first, EventConflict) or event.fingerprint() != original.fingerprint():
        return EventConflict(event.event_id)
    return replace(first, duplicate=True)


def _rejected(event: UsageEvent, reason: str, now_us: int) -> Decision:
    return Decision(
        event_id=event.event_id,
        outcome="rejected",
        charges=(),
        occurred_at=event.occurred_at,
        decided_at=from_us(now_us),
        reason=reason,
        metadata=event.metadata,
    )


def record_of(event: UsageEvent, decision: Decision) -> ResultRecord:
    """The ledger's row of a decision. Its time and metadata are the decision's:
    a duplicate's are the stored ones, not those of the retry that asked."""
    return ResultRecord(
        event_id=event.event_id,
        outcome=decision.outcome,
        fingerprint=event.fingerprint(),
        occurred_at_us=to_us(decision.occurred_at),
        decided_at_us=to_us(decision.decided_at),
        denied_by=decision.denied_by,
        reason=decision.reason,
        charges=[charge.to_row() for charge in decision.charges],
        metadata=decision.metadata,
    )
