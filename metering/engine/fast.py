"""Applying events on the hot path: what `Meter.consume` and the worker run.

One transaction; two calls of a `HotStore` (`read` under lock, then
`write`), and between them the lean rules of `metering.domain.rules`, event
after event, so a batch gives exactly the results of applying its events one
by one. On PostgreSQL that is two round trips, the COMMIT riding with the
second.

The general engine (`metering.engine.reference.apply_events`) keeps what is rare: an
event older than its subject's current first-use window sends the whole
batch there (`UseGeneralPath`); reservations use it too, and `check` when
`check_record` leaves it there. The differential property tests
(``tests/engine/test_differential.py``, every path and `check`) hold both to
the same results, counters, notifications and checks.

Subjects' own allowances are decided here too: entitlements and own
thresholds (`metering.alerts`) as rules of their own (`LimitCache.rule_for`),
grants read with the counters, a recurring grant's issue due locked in the
same read and made in the same transaction, and ``grant.low`` announced
when the batch's draws leave a grant at or below its threshold
(`metering.domain.rules.grants_low`).

Limits are cached per process (`LimitCache`) with the version they were read
at. `HotStore.read` returns the current version in the same round trip; when
it moved, the cache is reloaded and the transaction runs again, so a changed
limit applies to the very next decision in every process.

Money is decided here as the reference engine decides it
(`metering.engine.money`; ``tests/engine/test_differential.py``): before
its counters' keys are worked out, a priced event gets its charges of its
subjects' spend limits after its own, of the amounts of the prices in force
at its ``occurred_at`` (`PriceBook.charges`, cached with the limits), so
the lean rules stack them (all or nothing); its consumed priced charges
carry their (currency, amount), rolled up as spend. A reservation, or an
import with flags (`ImportPolicy`), of a priced event is left to the
general engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Final, Literal

from sqlalchemy import Connection

from metering.domain.decisions import CHARGE_KEYS, ROW_FIELDS, ChargeDecision
from metering.domain.distinct import SeatKey, value_of
from metering.domain.events import (
    FUTURE_TOLERANCE_US,
    EventRecord,
    Rejected,
    UsageEvent,
    check_event_time,
)
from metering.domain.grants import Balance, History, Pot, maximum_at
from metering.domain.imports import ImportPolicy
from metering.domain.instants import from_us
from metering.domain.licenses import consumed_concurrent
from metering.domain.notifications import Notice, payload_of
from metering.domain.recurring import Issue, issue_id, low_threshold
from metering.domain.reservations import held_charge
from metering.domain.rollups import WOULD_DENY, merged, rollup_deltas, spend_deltas
from metering.domain.rules import (
    BUCKET_WINDOW,
    EventOutcome,
    Key,
    Rule,
    State,
    decide,
    fresh_state,
    grants_low,
)
from metering.domain.windows import Window, calendar_window, first_use_window
from metering.engine.money import PriceBook, refuse_spend_charge
from metering.engine.seats import Seats
from metering.errors import EventConflict, InvalidInput, MeteringError, UnknownLimit
from metering.messages import encode_event, raw_text
from metering.storage.alerts import AlertStore
from metering.storage.allowances import AllowanceStore, draws_of
from metering.storage.counters import Pair
from metering.storage.engine import RetryTransaction
from metering.storage.hot import (
    Changes,
    HotStore,
    NeedsConnection,
    Snapshot,
    WantedKey,
    WantedSeat,
)
from metering.storage.hot.pick import hot_store
from metering.storage.prices import PriceStore
from metering.storage.recurring import ScheduleRecord, ScheduleStore, issues_of
from metering.storage.reservations import HoldRow, hold_row
from metering.storage.results import ResultRecord
from metering.storage.store import Store
from metering.storage.webhooks import WebhookStore

InvalidPolicy = Literal["raise", "reject"]

NEW: Final = "new"
DUPLICATE: Final = "duplicate"
CONFLICT: Final = "conflict"
# (NEW, the result just written) | (DUPLICATE, the stored result) | (CONFLICT, None)
Answer = tuple[str, ResultRecord | None]
_REPEAT: Final = "repeat"


class UseGeneralPath(Exception):
    """The batch holds an event the hot path leaves to the general engine."""


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep a held reservation's row with the event when it is allowed
    (`metering.reservations.transactions`): for ``ttl_us`` from the decision, or until
    ``until_us`` (a lease's block, at least 1 µs from now). A block that
    does not fit (``block``) is no event: `NotHeld` is raised before
    anything is written, and the transaction rolls back."""

    ttl_us: int = 0
    until_us: int | None = None
    block: bool = False

    def expires_at_us(self, now_us: int) -> int:
        if self.until_us is not None:
            return max(self.until_us, now_us + 1)
        return now_us + self.ttl_us


class NotHeld(Exception):
    """A lease's block was denied: nothing is recorded (see `Hold`)."""


class Unacceptable(Exception):
    """With ``invalid="raise"``: the event at ``index`` cannot be applied, for ``error``."""

    def __init__(self, index: int, error: MeteringError) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


# A subject's own thresholds for a limit: (percentages, amounts) (`metering.alerts`).
Own = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Allowances:
    """Per-subject policy the hot path needs without a lookup per event:
    every subject's changes of maximum (entitlements), which subjects have
    grants (only theirs are read, under lock, with their counters), when
    their recurring grants' next issues are due (only those are locked, in
    the same read) and their thresholds of their own."""

    histories: dict[Pair, History] = field(default_factory=dict)
    grant_pairs: frozenset[Pair] = frozenset()
    due: dict[Pair, int] = field(default_factory=dict)
    alerts: dict[Pair, Own] = field(default_factory=dict)

    def due_pairs(self, pairs: Iterable[Pair], now_us: int) -> list[Pair]:
        """Those of ``pairs`` with a recurring grant's issue due at ``now_us``, sorted."""
        due = self.due
        if not due:
            return []
        return sorted({pair for pair in pairs if due.get(pair, now_us + 1) <= now_us})


class LimitCache:
    """Every limit as a `Rule`, with the version it was read at, and the
    subjects' `Allowances` of that version.

    ``current`` is replaced as a whole, so a reader never pairs one
    version's rules with another's number. Entitlement and grant changes
    bump the same version, and so do prices: ``prices`` holds them with the
    version they were read at, set before ``current`` (a reader that finds
    another version there runs again).
    """

    def __init__(self) -> None:
        self.current: tuple[int, dict[str, Rule], Allowances] = (-1, {}, Allowances())
        self.prices = PriceBook()
        self._entitled: dict[tuple[str, int, Own | None], Rule] = {}

    def refresh(self, connection: Connection) -> None:
        store = Store(connection)
        version, limits = store.limits_version(), store.list_limits()
        allowances = AllowanceStore(connection)
        found = Allowances(
            allowances.histories(),
            frozenset(allowances.grant_pairs()),
            ScheduleStore(connection).due_times(),
            {
                (alert.limit, alert.subject): (alert.thresholds, alert.thresholds_units)
                for alert in AlertStore(connection).listed()
            },
        )
        book = PriceBook.read(PriceStore(connection), version)
        priced = set(book.prices)
        self.prices = book
        self._entitled = {}
        self.current = (
            version,
            {limit.name: Rule.of(limit, priced=limit.name in priced) for limit in limits},
            found,
        )

    def rule_for(
        self, rule: Rule, history: History | None, at_us: int, own: Own | None = None
    ) -> Rule:
        """``rule`` with the subject's maximum at ``at_us`` and its ``own``
        thresholds (rules are shared per maximum and thresholds)."""
        maximum = maximum_at(history, rule.limit.maximum, at_us)
        if maximum == rule.maximum and own is None:
            return rule
        key = (rule.name, maximum, own)
        found = self._entitled.get(key)
        if found is None:
            found = rule.with_maximum(maximum)
            if own is not None:
                found = found.with_thresholds(*own)
            self._entitled[key] = found
        return found


# An event's counters: (key, window) per charge, in the order of its charges.
_Fixed = list[tuple[Key, Window]]
_event_id: Final = itemgetter(0)  # of a `ResultRecord`
_CHARGE_OUTCOME: Final = CHARGE_KEYS.index("outcome")  # in a charge's row


class _Windows:
    """Calendar windows, remembering the last one per limit (a batch is mostly one)."""

    def __init__(self) -> None:
        self.last: dict[str, Window] = {}

    def calendar(self, rule: Rule, at_us: int) -> Window:
        window = self.last.get(rule.name)
        if window is None or not window[0] <= at_us < window[1]:
            window = self.last[rule.name] = calendar_window(rule.period, at_us)
        return window


def _rules_for(
    event: EventRecord,
    rules: dict[str, Rule],
    now_us: int,
    policy: ImportPolicy | None = None,
    *,
    seats: bool = True,
) -> tuple[list[Rule], MeteringError | None]:
    """The event's rules, or the error that makes it unacceptable (as
    `validate_against_limits`); times checked as ``policy`` says (an import's).
    Without ``seats`` a seat limit raises `UseGeneralPath` (a reservation,
    the one-trip function)."""
    found: list[Rule] = []
    at_us = event.occurred_at_us
    if not seats and any(name in rules and rules[name].distinct for _, name, _ in event.charges):
        # Before any other charge is judged, as the reference engine refuses them.
        raise UseGeneralPath("seats: taken by consuming, never held")
    for _, name, cost in event.charges:
        rule = rules.get(name)
        if rule is None:
            return found, UnknownLimit(name)
        if rule.concurrent:
            return found, consumed_concurrent(rule.name)
        if rule.money:
            refused = refuse_spend_charge(rule.limit)
            if refused is not None:
                return found, refused
        timed = rule if policy is None else policy.rule(rule)
        if at_us > now_us + FUTURE_TOLERANCE_US or at_us < now_us - timed.lateness_us:
            try:
                check_event_time(from_us(at_us), now_us, timed.limit.lateness_seconds)
            except MeteringError as exc:
                return found, exc
        if rule.distinct:
            try:
                _seat_value(rule, event, cost)
            except MeteringError as exc:
                return found, exc
        found.append(rule)
    return found, None


def _seat_value(rule: Rule, event: EventRecord, cost: int) -> str:
    """The value a charge on seat limit ``rule`` counts (`value_of`)."""
    assert rule.limit.distinct is not None
    return value_of(rule.limit.distinct, rule.name, event.metadata, cost)


def _seat_keys(
    event: EventRecord, rules: Sequence[Rule], windows: Sequence[Window]
) -> list[SeatKey | None]:
    """Per charge, the value it counts in its window (None: not a seat limit)."""
    return [
        (name, subject, window[0], _seat_value(rule, event, cost)) if rule.distinct else None
        for (subject, name, cost), rule, window in zip(event.charges, rules, windows, strict=True)
    ]


def _seat_charges(event: EventRecord, costs: Sequence[int | None]) -> list[tuple[str, str, int]]:
    """The event's charges, a seat limit's at its cost (`Seats.costs`)."""
    return [
        charge if cost is None else (charge[0], charge[1], cost)
        for charge, cost in zip(event.charges, costs, strict=True)
    ]


def _seat_order(seat: WantedSeat) -> tuple[str, str, int, str]:
    """Seat values sorted by key, a first-use window's (no start yet) first."""
    name, subject, start, value = seat
    return name, subject, -1 if start is None else start, value


class _Spend:
    """A batch's money (`metering.engine.money`): each priced event with its
    spend charges after its own, and its priced charges' amounts, to be
    written on its consumed charges' rows (`ChargeDecision.to_row`)."""

    def __init__(self, book: PriceBook, rules: dict[str, Rule]) -> None:
        self.book = book
        self.rules = rules
        # By the event's position in the batch: its priced charges' (currency,
        # amount), by their position in the event.
        self.amounts: dict[int, dict[int, tuple[str, int]]] = {}

    @classmethod
    def of(
        cls, cache: LimitCache, version: int, rules: dict[str, Rule], *, general: bool
    ) -> _Spend:
        """The batch's money, priced at ``version``; ``general``: the batch is a
        reservation or an import with flags, left to the general engine."""
        if general:
            raise UseGeneralPath("a reservation or a flagged import of a priced event")
        book = cache.prices
        if book.version != version:
            raise RetryTransaction("prices read at another version than the limits")
        return cls(book, rules)

    def expand(
        self, index: int, event: EventRecord, event_rules: list[Rule]
    ) -> tuple[EventRecord, list[Rule], MeteringError | None]:
        """``event`` and its rules with its spend charges after its own
        (`Money.expand`), or the error of a charge that costs too much."""
        try:
            priced, extra = self.book.charges(event.charges, event.occurred_at_us)
        except InvalidInput as exc:
            return event, event_rules, exc
        if priced:
            self.amounts[index] = {c.index: (c.currency, c.amount) for c in priced}
        if not extra:
            return event, event_rules, None
        added: list[Rule] = []
        for charge in extra:
            rule = self.rules.get(charge.limit)
            if rule is None:  # created between the reads of a refresh: not for the cache
                raise UseGeneralPath("a spend limit missing from the cached limits")
            added.append(rule)
        expanded = event._replace(charges=(*event.charges, *extra))
        return expanded, [*event_rules, *added], None

    def annotate(self, index: int, verdict: EventOutcome) -> None:
        """The (currency, amount) of each consumed priced charge of event ``index``."""
        amounts = self.amounts.get(index)
        if amounts is None or verdict.outcome == "denied":
            return
        for position, (currency, amount) in amounts.items():
            row = verdict.rows[position]
            if row[4] == WOULD_DENY:  # a shadow limit's: nothing consumed
                continue
            if len(row) == ROW_FIELDS:
                row.append([])  # no grant paid
            row.append([currency, amount])


def _first_use(
    rule: Rule,
    pair: Pair,
    at_us: int,
    windows: dict[Pair, Window | None],
    moved: dict[Pair, Window],
) -> Window:
    current = windows.get(pair)
    if current is not None and at_us < current[0]:
        raise UseGeneralPath("an event before its subject's current first-use window")
    window = first_use_window(rule.period, at_us, current, None)
    if window != current:
        windows[pair] = moved[pair] = window
    return window


def apply_records(
    connection: Connection | None,
    cache: LimitCache,
    events: Sequence[EventRecord],
    now_us: int,
    *,
    invalid: InvalidPolicy,
    precheck: bool,
    rejected: Sequence[Rejected] = (),
    store: HotStore | None = None,
    hold: Hold | None = None,
    policy: ImportPolicy | None = None,
) -> list[Answer]:
    """Apply ``events`` in order inside the caller's transaction; one answer per event.

    The transaction is ``connection``'s (its `hot_store`), or ``store``'s own
    when ``connection`` is None (the direct SQLite path): then what needs a
    SQLAlchemy connection raises `NeedsConnection` before anything is written.

    ``invalid="raise"`` raises `Unacceptable` for the first unacceptable event;
    ``"reject"`` stores it as a rejected result. Without ``precheck`` ids are
    not looked up first: an id decided before fails the results insert,
    and `run_transaction` runs the work again, with ``precheck``. A batch
    with an unacceptable event is always looked up: a decided id answers
    first (its duplicate or conflict), whatever the event's time or limit.
    ``rejected`` input, and with ``"reject"`` ids reused with other
    charges, are kept in ``rejected_messages`` in the same transaction.
    ``policy`` (an import's flags, `ImportPolicy`) changes the rules after
    each subject's own maximum is applied, writes no notification when it
    does not enforce, and marks the results it writes.
    """
    if store is None:
        assert connection is not None
        store = hot_store(connection)
    if cache.current[0] < 0:
        cache.refresh(_general(connection, "limits"))
    version, rules, allowances = cache.current
    # Priced limits at all (a refresh under way may pair versions: `_Spend.of` checks).
    priced = bool(cache.prices.prices) or cache.prices.version != version
    spend: _Spend | None = None
    calendar = _Windows()
    first: dict[str, int] = {}
    answers: list[tuple[str, ResultRecord | int | None]] = [(_REPEAT, None)] * len(events)
    # Each event to decide, with its counters' keys and windows when none is
    # a first-use window (those are known only once the current one is read).
    todo: list[tuple[int, EventRecord, list[Rule], MeteringError | None, _Fixed | None]] = []
    pairs: set[Pair] = set()
    keys: dict[Key, int] = {}
    # The batch's limits that roll usage up by dimension (usually none).
    dimensioned: dict[str, tuple[str, ...]] = {}
    # The seat values the batch charges (`metering.domain.distinct`; usually none).
    wanted_seats: set[WantedSeat] = set()
    for index, event in enumerate(events):
        if event.event_id in first:
            answers[index] = (_REPEAT, first[event.event_id])
            continue
        first[event.event_id] = index
        # A reservation of a seat limit is refused by the reference path (`_refuse_seats`).
        event_rules, error = _rules_for(event, rules, now_us, policy, seats=hold is None)
        if priced and error is None and any(rule.money for rule in event_rules):
            if spend is None:
                general = hold is not None or policy is not None
                spend = _Spend.of(cache, version, rules, general=general)
            event, event_rules, error = spend.expand(index, event, event_rules)
        if error is not None:
            todo.append((index, event, event_rules, error, None))
            continue
        fixed: _Fixed | None = []
        for (subject, name, cost), rule in zip(event.charges, event_rules, strict=True):
            if rule.dimensions:
                dimensioned[name] = rule.dimensions
            if rule.bucket:
                key = (name, subject, BUCKET_WINDOW[0])
                keys[key] = BUCKET_WINDOW[1]
                if fixed is not None:
                    fixed.append((key, BUCKET_WINDOW))
            elif rule.calendar:
                window = calendar.calendar(rule, event.occurred_at_us)
                key = (name, subject, window[0])
                keys[key] = window[1]
                if fixed is not None:
                    fixed.append((key, window))
                if rule.distinct:
                    wanted_seats.add((name, subject, window[0], _seat_value(rule, event, cost)))
            else:
                pairs.add((name, subject))
                fixed = None
                if rule.distinct:  # in the pair's current window, or in a new one (none)
                    wanted_seats.add((name, subject, None, _seat_value(rule, event, cost)))
        todo.append((index, event, event_rules, None, fixed))
    due_pairs = allowances.due_pairs(chain(pairs, (key[:2] for key in keys)), now_us)
    wanted = sorted((*key, end) for key, end in keys.items())
    granted: list[Pair] = []
    if allowances.grant_pairs:
        granted = sorted(_granted(pairs, keys) & allowances.grant_pairs)
    # An unacceptable event's id is looked up all the same: a decided id is
    # answered (duplicate or conflict) before the event is judged.
    looked_up = precheck or any(item[3] is not None for item in todo)
    ids = list(first) if looked_up else None
    seat_values = sorted(wanted_seats, key=_seat_order)
    snapshot = store.read(ids, sorted(pairs), wanted, now_us, granted, seat_values, due_pairs)
    if snapshot.version != version:
        cache.refresh(_general(connection, "limits"))
        raise RetryTransaction("limits changed since they were cached")
    pots = snapshot.pots
    issues = _issues(snapshot, todo, now_us) if snapshot.schedules else []
    histories, alerts = allowances.histories, allowances.alerts
    seats = Seats(snapshot.seen)

    states = snapshot.states
    windows = snapshot.windows
    had_row = set(windows)
    moved: dict[Pair, Window] = {}
    created: dict[Key, int] = {}
    before: dict[Key, tuple[object, ...]] = {}
    notices: list[Notice] = []
    wanted_notices: list[Notice] | None = notices
    marker: str | None = None
    if policy is not None:
        marker = policy.marker
        wanted_notices = notices if policy.enforce else None
    records: list[ResultRecord] = []
    refused: list[Rejected] = []  # the rejected events, kept whole (`refused_event`)
    found = snapshot.stored
    for index, event, event_rules, error, fixed in todo:
        stored = found.get(event.event_id) if found else None
        if stored is not None:
            same = stored.fingerprint == event.fingerprint
            answers[index] = (DUPLICATE, stored) if same else (CONFLICT, None)
            continue
        if error is not None:
            if invalid == "raise":
                raise Unacceptable(index, error)
            refused.append(refused_event(event, str(error)))
            record = ResultRecord(
                event.event_id,
                "rejected",
                event.fingerprint,
                event.occurred_at_us,
                now_us,
                (),
                str(error),
                [],
                event.metadata,
            )
        else:
            at_us = event.occurred_at_us
            event_windows: list[Window] = []
            event_states: list[State] = []
            event_pots: list[Pot | None] | None = None
            if histories or pots or alerts:
                event_rules, event_pots = _entitled(
                    cache, event, event_rules, (histories, alerts), pots
                )
            if policy is not None:  # after `_entitled`: its shared rules stay as they are
                event_rules = [policy.rule(rule) for rule in event_rules]
            if fixed is None:
                fixed = []
                for (subject, name, _), rule in zip(event.charges, event_rules, strict=True):
                    if rule.bucket:
                        window = BUCKET_WINDOW
                    elif rule.calendar:
                        window = calendar.calendar(rule, at_us)
                    else:
                        window = _first_use(rule, (name, subject), at_us, windows, moved)
                    fixed.append(((name, subject, window[0]), window))
            for key, window in fixed:
                state = states.get(key)
                if state is None:
                    state = states[key] = fresh_state()
                    created[key] = window[1]
                elif key not in before and key not in created:
                    before[key] = tuple(state)
                event_windows.append(window)
                event_states.append(state)
            charges: Sequence[tuple[str, str, int]] = event.charges
            event_seats: list[SeatKey | None] | None = None
            if wanted_seats and any(rule.distinct for rule in event_rules):
                event_seats = _seat_keys(event, event_rules, event_windows)
                charges = _seat_charges(event, seats.costs(event_seats))
            verdict = decide(
                event_rules,
                charges,
                event_windows,
                event_states,
                at_us,
                event.event_id,
                wanted_notices,
                event_pots,
            )
            if event_seats is not None:
                outcomes = [row[_CHARGE_OUTCOME] for row in verdict.rows]
                seats.count_outcomes(event_seats, verdict.outcome, outcomes)
            if spend is not None:
                spend.annotate(index, verdict)
            record = ResultRecord(
                event.event_id,
                verdict.outcome,
                event.fingerprint,
                at_us,
                now_us,
                verdict.denied_by,
                marker,
                verdict.rows,
                event.metadata,
            )
        records.append(record)
        answers[index] = (NEW, record)

    final = _resolve(answers, events, snapshot.stored)
    # Queued input keeps its conflicts in the dead-letter record; a caller
    # who is answered `EventConflict` (``invalid="raise"``) has been told.
    conflicts = [
        Rejected(event.event_id, str(EventConflict(event.event_id)), event.fingerprint)
        for event, (kind, _) in zip(events, final, strict=True)
        if kind == CONFLICT and invalid == "reject"
    ]
    moved_windows = sorted(moved.items())
    rollups = rollup_deltas(records, dimensioned)
    if spend is not None and spend.amounts:
        rollups = merged(rollups, spend_deltas(records))
    changes = Changes(
        updated=[(key, states[key]) for key, old in before.items() if tuple(states[key]) != old],
        created=[(key, end, states[key]) for key, end in sorted(created.items())],
        new_windows=[item for item in moved_windows if item[0] not in had_row],
        moved_windows=[item for item in moved_windows if item[0] in had_row],
        results=sorted(records, key=_event_id),
        rollups=rollups,
    )
    low: list[str] = []
    if pots:
        changes.draws = draws_of(row for record in records for row in record.charges)
        changes.issues = issues
        watched = snapshot.watched
        if watched and changes.draws:
            drawn = {key[3] for key, amount in changes.draws.items() if amount > 0}
            changes.expected = {g: watched[g][1] for g in sorted(drawn) if g in watched}
            thresholds = {g: watched[g][0] for g in changes.expected}
            low = grants_low(pots, thresholds, changes.expected)
    if seats.added:
        changes.seats = dict(seats.added)
    if hold is not None:
        changes.holds = _holds(records, hold, now_us, looked_up)
    dead = [*rejected, *conflicts, *refused]
    if dead and store.takes_rejected:
        changes.rejected, dead = dead, []  # in the write's round trip
    more = bool(notices or dead or low)
    extras = _general(connection, "notices or dead letters") if more else None
    store.write(changes, now_us, commit=not more)
    if extras is not None:
        _record_extras(extras, notices, dead, now_us, low)
    return final


def _issues(
    snapshot: Snapshot,
    todo: Iterable[tuple[int, EventRecord, list[Rule], MeteringError | None, _Fixed | None]],
    now_us: int,
) -> list[tuple[ScheduleRecord, list[Issue]]]:
    """The recurring grants' issues due for the charges of the events to
    decide (as the general engine makes them: not for a repeated id nor an
    unacceptable event), added to the snapshot's grants: they are made in
    this transaction (`Changes.issues`)."""
    stored = snapshot.stored
    charged = {
        (name, subject)
        for _, event, _, error, _ in todo
        if error is None and event.event_id not in stored
        for subject, name, _ in event.charges
    }
    made: list[tuple[ScheduleRecord, list[Issue]]] = []
    for schedule, last in snapshot.schedules:
        pair = (schedule.limit, schedule.subject)
        due = issues_of(schedule, last, now_us) if pair in charged else []
        if not due:
            continue
        made.append((schedule, due))
        for issue in due:
            grant_id = issue_id(schedule.schedule_id, issue.number)
            balance = Balance(
                grant_id, issue.amount, 0, issue.start_us, issue.end_us, schedule.priority
            )
            pot = snapshot.pots.get(pair)
            if pot is None:
                snapshot.pots[pair] = Pot([balance])
            else:
                pot.balances.append(balance)
                pot.balances.sort(key=Balance.order)
            low_at = low_threshold(issue.amount, schedule.low_units, schedule.low_percent)
            if low_at is not None:
                snapshot.watched[grant_id] = (low_at, 0)
    return made


def refused_event(event: EventRecord | UsageEvent, reason: str) -> Rejected:
    """The dead letter of an event rejected with ``reason``: the event as a
    queued message holds it, so it is listed, and applied by
    `metering.dead_letters.replay` once it is acceptable."""
    return Rejected(event.event_id, reason, raw_text(encode_event(event)))


def _holds(
    records: Sequence[ResultRecord], hold: Hold, now_us: int, looked_up: bool
) -> list[HoldRow]:
    """The reservation rows of the allowed ``records``, each holding its
    charges' counters (as `metering.reservations.transactions` keeps them); `NotHeld` for a
    denied block. A denied block whose id was not looked up first runs again
    with the lookup (as the results insert would have found a repeat): a
    lease's id is new, so that is one more statement where it is denied."""
    rows: list[HoldRow] = []
    for record in records:
        if record.outcome not in ("allowed", "overage"):
            if hold.block and not looked_up:
                raise RetryTransaction("a denied block: look its id up first")
            if hold.block:
                raise NotHeld(record.event_id)
            continue
        charges = [held_charge(ChargeDecision.from_row(row)) for row in record.charges]
        rows.append(hold_row(record.event_id, charges, now_us, hold.expires_at_us(now_us)))
    return rows


def _general(connection: Connection | None, what: str) -> Connection:
    """The SQLAlchemy connection, for what the direct SQLite path leaves to it."""
    if connection is None:
        raise NeedsConnection(what)
    return connection


def _granted(pairs: Iterable[Pair], keys: Iterable[Key]) -> set[Pair]:
    """The batch's (limit, subject) pairs of fixed windows (buckets have no grants)."""
    return {(name, subject) for name, subject, start in keys if start != 0} | set(pairs)


def _entitled(
    cache: LimitCache,
    event: EventRecord,
    event_rules: list[Rule],
    own: tuple[dict[Pair, History], dict[Pair, Own]],
    pots: dict[Pair, Pot],
) -> tuple[list[Rule], list[Pot | None] | None]:
    """The event's rules with its subjects' own maximums and thresholds
    (``own``), and their grants."""
    histories, alerts = own
    if not any(
        (name, subject) in histories or (name, subject) in pots or (name, subject) in alerts
        for subject, name, _ in event.charges
    ):
        return event_rules, None  # most events: nothing of their subjects' own
    rules: list[Rule] = []
    found: list[Pot | None] = []
    for (subject, name, _), rule in zip(event.charges, event_rules, strict=True):
        history = histories.get((name, subject))
        thresholds = alerts.get((name, subject))
        if history or thresholds:
            rule = cache.rule_for(rule, history, event.occurred_at_us, thresholds)
        rules.append(rule)
        found.append(None if rule.bucket else pots.get((name, subject)))
    return rules, found if any(pot is not None for pot in found) else None


def _resolve(
    answers: Sequence[tuple[str, ResultRecord | int | None]],
    events: Sequence[EventRecord],
    stored: dict[str, ResultRecord],
) -> list[Answer]:
    """Answer repeats within the batch: against the stored result when there
    is one (as the general engine does), else like their first occurrence."""
    final: list[Answer] = []
    for event, (kind, value) in zip(events, answers, strict=True):
        if kind != _REPEAT:
            assert not isinstance(value, int)
            final.append((kind, value))
            continue
        assert isinstance(value, int)
        record = stored.get(event.event_id)
        if record is not None:
            same = record.fingerprint == event.fingerprint
            final.append((DUPLICATE, record) if same else (CONFLICT, None))
            continue
        first_kind, first = final[value]
        if first_kind == CONFLICT or events[value].fingerprint != event.fingerprint:
            final.append((CONFLICT, None))
        else:
            final.append((DUPLICATE, first))
    return final


def _record_extras(
    connection: Connection,
    notices: Iterable[Notice],
    rejected: Sequence[Rejected],
    now_us: int,
    low: list[str],
) -> None:
    if low:  # first, as the general engine writes them with the draws
        AllowanceStore(connection).announce_low(low, now_us)
    found = [(notice, payload_of(notice, now_us)) for notice in notices]
    if found:
        WebhookStore(connection).record_notices(found, now_us)
    if rejected:
        Store(connection).record_rejected_messages(rejected, now_us)


# `check_record`'s answer when the cached limits are older than the database's.
STALE: Final = "stale"


# Reads, without a lock, what `HotStore.read` would lock: the limits'
# version, the first-use windows of the pairs, the counters of the keys and
# of those windows, the grants of the grant pairs and their draws, the live
# events of the seat values (`metering.storage.hot.postgres.read_unlocked`).
ReadUnlocked = Callable[
    [Sequence[Pair], Sequence[WantedKey], Sequence[WantedSeat], Sequence[Pair]], Snapshot
]


def check_record(
    read_unlocked: ReadUnlocked, cache: LimitCache, event: EventRecord, now_us: int
) -> EventOutcome | Literal["stale"] | None:
    """What applying ``event`` would decide now, by the hot path's rules,
    reading the state in one statement (``read_unlocked``) and writing
    nothing (`Meter.check`; PostgreSQL only).

    None: the general engine must answer (an unknown limit, an
    out-of-range time or a charge that costs too much, which it raises
    with its own messages; an event before its subject's current first-use
    window). `STALE`: the limits changed since ``cache`` was read (refresh
    it and ask again).
    """
    version, rules, allowances = cache.current
    spend: _Spend | None = None
    try:
        event_rules, error = _rules_for(event, rules, now_us)
        if error is None and version >= 0 and any(rule.money for rule in event_rules):
            if cache.prices.version != version:
                return STALE
            spend = _Spend(cache.prices, rules)
            event, event_rules, error = spend.expand(0, event, event_rules)
    except UseGeneralPath:
        return None  # a spend limit not cached yet: the reference engine reads it
    if error is not None or version < 0:
        return None
    charged = [(name, subject) for subject, name, _ in event.charges]
    if allowances.due_pairs(charged, now_us):
        return None  # a recurring grant's issue due: the general engine makes it
    granted = sorted(set(charged) & allowances.grant_pairs) if allowances.grant_pairs else []
    at_us = event.occurred_at_us
    calendar = _Windows()
    pairs: list[Pair] = []
    keys: list[WantedKey] = []
    seats: list[WantedSeat] = []
    for (subject, name, cost), rule in zip(event.charges, event_rules, strict=True):
        if rule.bucket:
            keys.append((name, subject, *BUCKET_WINDOW))
        elif rule.calendar:
            keys.append((name, subject, *calendar.calendar(rule, at_us)))
        else:
            pairs.append((name, subject))
        if rule.distinct:  # a first-use window's: in the pair's current one
            start = keys[-1][2] if rule.calendar else None
            seats.append((name, subject, start, _seat_value(rule, event, cost)))
    snapshot = read_unlocked(sorted(pairs), sorted(keys), seats, granted)
    if snapshot.version != version:
        return STALE
    pots: list[Pot | None] | None = None
    if allowances.histories or snapshot.pots:  # (own thresholds: a check announces nothing)
        own: tuple[dict[Pair, History], dict[Pair, Own]] = (allowances.histories, {})
        event_rules, pots = _entitled(cache, event, event_rules, own, snapshot.pots)
    windows: list[Window] = []
    states: list[State] = []
    for (subject, name, _), rule in zip(event.charges, event_rules, strict=True):
        if rule.bucket:
            window = BUCKET_WINDOW
        elif rule.calendar:
            window = calendar.calendar(rule, at_us)
        else:
            current = snapshot.windows.get((name, subject))
            if current is not None and at_us < current[0]:
                return None
            window = first_use_window(rule.period, at_us, current, None)
        # `decide` updates the states in place: these are copies, stored nowhere.
        found = snapshot.states.get((name, subject, window[0]))
        windows.append(window)
        states.append(list(found) if found is not None else fresh_state())
    charges: Sequence[tuple[str, str, int]] = event.charges
    if seats:
        costs = Seats(snapshot.seen).costs(_seat_keys(event, event_rules, windows))
        charges = _seat_charges(event, costs)
    verdict = decide(event_rules, charges, windows, states, at_us, event.event_id, None, pots)
    if spend is not None:
        spend.annotate(0, verdict)
    return verdict
