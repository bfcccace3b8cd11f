"""The fast path: what `Meter.consume`, batches and the worker decide with.

One transaction; two calls of a `HotStore` (`read` under lock, then
`write`), and between them the lean rules of `metering.domain.rules`, event
after event, so a batch gives exactly the results of applying its events one
by one. It implements every need but the rare (`FAST_IMPLEMENTS`): money at the
prices in force at ``occurred_at`` with spend caps (`metering.engine.money`),
seats (`metering.engine.seats`), entitlements, grants and recurring grants'
issues and runaway breakers read with the counters, own thresholds,
notices, forecasts and ``grant.low``, dimensions, reservations and imports.
An event whose counters all have room for every charge its batch (one event
for `consume`) makes of them is allowed without its rules being evaluated
(`metering.domain.room`). What it cannot decide it returns as `Declined`,
before writing anything. Limits are cached per process (`metering.engine.limit_cache`) with
the version they were read at; a read at another version declines as stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from functools import partial
from itertools import chain
from operator import itemgetter
from typing import Any, Final, cast

from sqlalchemy import Connection

from metering.domain.breaker import steady
from metering.domain.decisions import CHARGE_KEYS, ROW_FIELDS, ChargeDecision
from metering.domain.distinct import SeatKey
from metering.domain.events import (
    FUTURE_TOLERANCE_US,
    EventRecord,
    Rejected,
    UsageEvent,
)
from metering.domain.forecast import added
from metering.domain.grants import Balance, History, Pot, drawn_since, used_by_grant
from metering.domain.money import Price, counted_amounts, tiered_amount
from metering.domain.needs import EVERY, Need
from metering.domain.notifications import Notice, payload_of
from metering.domain.recurring import Issue, issue_id, low_threshold
from metering.domain.reservations import held_charge
from metering.domain.rollups import WOULD_DENY, merged, rollup_deltas, spend_deltas
from metering.domain.room import Room, Sums, allowed_row, covered, drawn_row
from metering.domain.rules import (
    BUCKET_WINDOW,
    USED,
    EventOutcome,
    Key,
    Rule,
    State,
    decide,
    fresh_state,
    grants_low,
)
from metering.domain.state import CounterKey
from metering.domain.windows import Window, first_use_window
from metering.domain.zones import ZoneHistory, billing_month
from metering.engine.answers import (
    CONFLICT,
    DUPLICATE,
    NEW,
    Answer,
    Batch,
    Declined,
    Hold,
    NotHeld,
    Unacceptable,
)
from metering.engine.breakers import Breakers
from metering.engine.forecasts import forecast_keys, forecast_with, leads_of, with_forecasts
from metering.engine.limit_cache import (
    CalendarWindows,
    LimitCache,
    Own,
    rules_for,
    seat_value,
)
from metering.engine.money import Pricing, refuse_spend_charge, repriced
from metering.engine.seats import Assumed, Seats
from metering.errors import EventConflict, InvalidInput, MeteringError
from metering.pipeline.messages import encode_event, raw_text
from metering.storage.allowances import AllowanceStore, draws_of
from metering.storage.connections import RetryTransaction
from metering.storage.counters import Pair
from metering.storage.hot import (
    ALL_GRANTS,
    Changes,
    HotStore,
    ReadRequest,
    Snapshot,
    WantedKey,
    WantedSeat,
)
from metering.storage.hot.extras import new_secret
from metering.storage.hot.pick import hot_store
from metering.storage.rates import created_rate
from metering.storage.recurring import ScheduleRecord, issues_of
from metering.storage.reservations import HoldRow, hold_row
from metering.storage.results import ResultRecord
from metering.storage.store import Store
from metering.storage.webhook_records import encode_payload
from metering.storage.webhooks import WebhookStore

# Every need but the rare, which the reference engine decides.
FAST_IMPLEMENTS: Final = EVERY - {
    Need.EARLY_FIRST_USE,  # found while deciding: declined
    Need.HELD_SEATS,  # refused, with the reference engine's error
    Need.HELD_GAUGE,  # refused too
}


class _Decline(Exception):
    """Raised where a path finds it cannot decide the batch; `apply_records`
    and `check_record` return its `Declined`."""

    def __init__(self, declined: Declined) -> None:
        super().__init__(declined.reason)
        self.declined = declined


# An event's counters: (key, window) per charge, in the order of its charges.
_Fixed = list[tuple[Key, Window]]
_event_id: Final = itemgetter(0)  # of a `ResultRecord`
# A batch of more events than this sends its results as they are decided, this many at a time.
SEND_EVERY: Final = 250
_CHARGE_OUTCOME: Final = CHARGE_KEYS.index("outcome")  # in a charge's row


def _seat_values(event: EventRecord, event_rules: Sequence[Rule]) -> dict[int, str] | None:
    """The value each charge on a seat limit counts, by position (None: no
    seat limit); `MeteringError` for one with no valid value."""
    values: dict[int, str] | None = None
    for position, rule in enumerate(event_rules):
        if rule.distinct:
            if values is None:
                values = {}
            values[position] = seat_value(rule, event, event.charges[position][2])
    return values


def _seat_keys(
    event: EventRecord, rules: Sequence[Rule], windows: Sequence[Window]
) -> list[SeatKey | None]:
    """Per charge, the value it counts in its window (None: not a seat limit)."""
    return [
        (name, subject, window[0], seat_value(rule, event, cost)) if rule.distinct else None
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
    spend charges after its own (`Pricing.expand`, remembered per version of
    the cache), and its priced charges' amounts, to be written on its
    consumed charges' rows (`ChargeDecision.to_row`)."""

    def __init__(self, pricing: Pricing) -> None:
        self.pricing = pricing
        self.book = pricing.book
        # By the event's position in the batch: its priced charges' (currency,
        # amount), by their position in the event.
        self.amounts: dict[int, dict[int, tuple[str, int]]] = {}
        # The events whose spend charges are priced by their counters (tiers);
        # the usual one, with one priced charge, as (its position, its price).
        self.counted: dict[int, tuple[int, Price] | None] = {}
        # Per counted event of a batch's room (`_Applying._tiered`): what its
        # counter held before it, one after the other, and what it costs then.
        self.ahead: dict[int, tuple[int, int]] = {}

    @classmethod
    def of(cls, cache: LimitCache, version: int) -> _Spend:
        """The batch's money, priced at ``version``."""
        pricing = cache.pricing
        if pricing.book.version != version:
            raise _Decline(Declined("prices cached at another version", stale=True))
        return cls(pricing)

    def expand(
        self, index: int, event: EventRecord, event_rules: list[Rule]
    ) -> tuple[EventRecord, list[Rule], MeteringError | None]:
        """``event`` and its rules with its spend charges after its own
        (`Money.expand`), or the error of a charge that costs too much."""
        try:
            found = self.pricing.expand(event.charges, event.occurred_at_us)
        except InvalidInput as exc:
            return event, event_rules, exc
        if found is None:  # created between the reads of a refresh: not for the cache
            raise _Decline(Declined("a spend limit not cached", stale=True))
        amounts, is_counted, counted, charges, added = found
        if amounts:
            self.amounts[index] = amounts
        if is_counted:
            self.counted[index] = counted
        if not added:
            return event, event_rules, None
        expanded = EventRecord(
            event.event_id, charges, event.occurred_at_us, event.metadata, event.fingerprint
        )
        return expanded, [*event_rules, *added], None

    def reprice(
        self,
        index: int,
        event: EventRecord,
        charges: Sequence[tuple[str, str, int]],
        states: Sequence[State],
    ) -> Sequence[tuple[str, str, int]]:
        """``charges`` with event ``index``'s spend charges priced by its
        counters' ``states`` before it, when a price of it is counted."""
        if index not in self.counted:
            return charges
        single = self.counted[index]
        if single is not None:
            return self.reprice_one(index, event, single, states[single[0]][USED], charges)
        book, at_us = self.book, event.occurred_at_us
        used = [state[USED] for state in states]
        found, spent = repriced(book.prices, book.spend, event.charges, at_us, used)
        self.amounts[index] = {c.index: (c.currency, c.amount) for c in found}
        return [
            charge if amount is None else (charge[0], charge[1], amount)
            for charge, amount in zip(charges, spent, strict=True)
        ]

    def reprice_one(
        self,
        index: int,
        event: EventRecord,
        single: tuple[int, Price],
        used: int,
        charges: Sequence[tuple[str, str, int]] | None = None,
    ) -> list[tuple[str, str, int]]:
        """``charges`` (the event's) with its spend charges each costing what
        its one priced charge does (at ``single``: its position and price)
        on a counter that held ``used`` before it (found `ahead` when it held
        what the batch's room foresaw)."""
        if charges is None:
            charges = event.charges
        position, price = single
        ahead = self.ahead.get(index)
        if ahead is not None and ahead[0] == used:
            amount = ahead[1]
        else:
            amount = tiered_amount(price, used, charges[position][2])
        self.amounts[index] = {position: (price.currency, amount)}
        head = len(event.charges) - len(self.book.spend.get(price.currency, ()))
        if head == len(charges) - 1:  # the usual: one spend limit of its currency
            subject, name, _ = charges[head]
            return [*charges[:head], (subject, name, amount)]
        return [*charges[:head], *[(s, name, amount) for s, name, _ in charges[head:]]]

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
        raise _Decline(Declined("an event before its window", Need.EARLY_FIRST_USE))
    window = first_use_window(rule.period, at_us, current, None)
    if window != current:
        windows[pair] = moved[pair] = window
    return window


def apply_records(
    connection: Connection | None,
    cache: LimitCache,
    batch: Batch,
    *,
    retry: bool = False,
    store: HotStore | None = None,
) -> list[Answer] | Declined:
    """Apply ``batch`` in order inside the caller's transaction; one answer per event.

    The transaction is ``connection``'s (its `hot_store`), or ``store``'s own
    when ``connection`` is None (a direct connection), whose `write` then
    also stores the breakers, notices and forecasts (`_direct_extras`); dead
    letters a store does not take decline (`Need.DEAD_LETTERS`). Every decline
    comes before anything is written. ``retry``: the transaction runs again
    (a repeated id failed the results insert): ids are looked up first.
    """
    if store is None:
        assert connection is not None
        store = hot_store(connection)
    if cache.current[0] < 0:
        if connection is None:
            return Declined("the limits are not loaded yet", stale=True)
        cache.refresh(connection)
    applying = _Applying(cache, batch)
    # A batch's ids are looked up (`_Applying.read`): sent now, while it is
    # planned (not a reservation's: one of a seat declines before any read).
    ahead = None
    if batch.hold is None and (retry or batch.lookup_first or len(batch.records) > 1):
        ahead = list(dict.fromkeys([record.event_id for record in batch.records]))
    try:
        with nullcontext() if ahead is None else store.looking_up(ahead):
            applying.plan()
            snapshot = applying.read(store, retry)
        applying.breakers = _breakers(
            applying.rules, applying.breaker_pairs, snapshot, batch.now_us
        )
        # A batch on the store's own connection sends its results as they are
        # decided, while the rest are: of fixed windows only (none of its
        # events may decline then; a decline rolls back what was sent), and
        # whose counters all have rows, locked (else a transaction that
        # inserted one of them, then an id of these, would wait for this
        # one's results while this one's insert of that counter waited for it).
        early = (
            connection is None
            and not applying.pairs
            and len(applying.todo) > SEND_EVERY
            and all(key in snapshot.states for key in applying.keys)
        )
        with store.sending() if early else nullcontext() as send:
            applying.decide(snapshot, send)
            return applying.write(connection, store, snapshot)
    except _Decline as exc:
        return exc.declined


# An event to decide: its position in the batch, the event (with its spend
# charges), its rules, the error that makes it unacceptable, and its
# counters' keys and windows when none is a first-use window.
_Todo = tuple[int, EventRecord, list[Rule], MeteringError | None, _Fixed | None]


class _Applying:
    """One `apply_records` call: planned, read under lock, decided, written.

    A batch with an unacceptable event is always looked up: a decided id
    answers first (its duplicate or conflict), whatever the event's time or
    limit. ``batch.rejected``, and with ``invalid="reject"`` ids reused with
    other charges, are kept as dead letters in the same transaction. An
    import's ``policy`` changes the rules after each subject's own maximum
    is applied, announces nothing when it does not enforce, and marks the
    results it writes.
    """

    def __init__(self, cache: LimitCache, batch: Batch) -> None:
        self.cache = cache
        self.batch = batch
        self.version, self.rules, self.allowances = cache.current
        self.calendar = CalendarWindows(self.allowances.zones)
        self.first: dict[str, int] = {}  # each id's first position
        # Each event's answer, or for a repeat its first occurrence's position.
        self.answers: list[Answer | int] = [-1] * len(batch.records)
        self.todo: list[_Todo] = []
        self.pairs: set[Pair] = set()  # first-use windows' (limit, subject)
        self.keys: dict[Key, int] = {}  # fixed windows' keys, with their ends
        self.dimensioned: dict[str, tuple[str, ...]] = {}  # limits rolled up by dimension
        self.wanted_seats: set[WantedSeat] = set()  # the seat values the batch charges
        self.spend: _Spend | None = None
        self.looked_up = False
        enforce = batch.policy is None or batch.policy.enforce
        self.notices: list[Notice] = []
        self.wanted_notices: list[Notice] | None = self.notices if enforce else None
        self.records: list[ResultRecord] = []
        self.refused: list[Rejected] = []  # the rejected events, kept whole (`refused_event`)
        self.moved: dict[Pair, Window] = {}
        self.created: dict[Key, int] = {}
        self.before: dict[Key, tuple[object, ...]] = {}
        self.seats = Seats({})
        self.issues: list[tuple[ScheduleRecord, list[Issue]]] = []
        self.had_row: set[Pair] = set()
        self.breaker_pairs: set[Pair] = set()  # the charged pairs of limits with a breaker
        self.breaking: set[str] = set()  # the limits with a breaker the short way found
        self.breakers: Breakers | None = None
        self.sums = Sums()  # what the batch charges each counter (`metering.domain.room`)
        # Per event with seat charges and no first-use window: its `_seat_keys`.
        self.event_seats: dict[int, list[SeatKey | None]] = {}
        # The events with fixed windows whose one priced charge's price is
        # counted (`_Spend.counted`), grouped while planned (`_tier`) per
        # counter: its price, spend counters, and its charges' costs and
        # events; their spend charges' sums are found once it is read (`_tiered`).
        self.tiered: dict[Key, tuple[Price, tuple[Key, ...], list[int], list[int]]] = {}
        self.unlike: set[Key] = set()  # counters of ``tiered`` not summed
        # The events of one priced charge and one spend charge (`_priced_one`).
        self.paired: set[int] = set()
        self.simple: dict[str, bool] = {}  # `_spend_simple` by spend limit
        self.paying: dict[str, int] = {}  # how many spend counters a currency's charges pay
        self.read_used: dict[str, int] = {}  # what each grant read had used (`drawn_since`)
        self.sent = 0  # how many of ``records`` `decide` sent (`HotStore.sending`)

    def plan(self) -> None:
        """Each event's rules, spend charges and counters' keys."""
        batch, cache = self.batch, self.cache
        # Priced limits at all (a refresh under way may pair versions: `_Spend.of` checks).
        book = cache.pricing.book
        priced = bool(book.prices) or book.version != self.version
        # An event whose charges are all on `_plain` rules takes the short
        # way below: what `rules_for` and `_keys` find of it, found inline;
        # one on `_short` rules skips `rules_for` (`_short_rules`).
        short = batch.hold is None and batch.policy is None
        plain: dict[str, Rule | None] = {}
        shorts: dict[str, Rule | None] = {}
        pricing: dict[str, Rule | None] = {}
        first, todo = self.first, self.todo
        # Whether any limit has a breaker: else no charge's pair is looked for below.
        guarded = cache.traits(self.rules)[0]
        for index, event in enumerate(batch.records):
            event_id = event.event_id
            if event_id in first:
                self.answers[index] = first[event_id]
                continue
            first[event_id] = index
            shortened = None
            if short:
                # (An event whose first charge is known not `_plain` is not.)
                charges = event.charges
                found = None
                if not charges or plain.get(charges[0][1], True) is not None:
                    found = self._plain_rules(event, plain)
                if found is not None:
                    fixed = self._plain_keys(index, event, found)
                    if fixed is not None:
                        todo.append((index, event, found, None, fixed))
                        continue
                if priced and len(event.charges) == 1 and self._priced_one(index, event, pricing):
                    continue
                shortened = self._short_rules(event, shorts)
            values: dict[int, str] | None = None
            if shortened is not None:
                (event_rules, values), error = shortened, None
            else:
                if batch.hold is not None and self._seats(event):
                    raise _Decline(Declined("seats are taken by consuming", Need.HELD_SEATS))
                event_rules, error = rules_for(event, self.rules, batch.now_us, batch.policy)
            # A short event's own rules have no breaker (`_short_window`): its spend rules may.
            own = len(event_rules) if shortened is not None else 0
            if priced and error is None and _priced_rules(event_rules):
                if self.spend is None:
                    self.spend = _Spend.of(cache, self.version)
                event, event_rules, error = self.spend.expand(index, event, event_rules)
            fixed = None if error is not None else self._keys(index, event, event_rules, values)
            if self.spend is not None and index in self.spend.counted:
                single = self.spend.counted[index]
                if single is None or fixed is None or index in self.event_seats:
                    self.sums.poisoned.update((name, subject) for subject, name, _ in event.charges)
                else:  # its spend charges' sums are known once its counter is read
                    self._tier(index, event, fixed, single)
            self.todo.append((index, event, event_rules, error, fixed))
            if guarded and error is None and len(event_rules) > own:
                added = zip(event.charges[own:], event_rules[own:], strict=True)
                for (subject, name, _), rule in added:
                    if rule.needs and Need.BREAKER in rule.needs:
                        self.breaker_pairs.add((name, subject))
        if self.breaking:  # the short way's charges: each counted in ``keys``
            breaking = self.breaking
            self.breaker_pairs.update((n, s) for n, s, _ in self.keys if n in breaking)
        if self.sums.timed:  # (one span for all: not a pair's per charge)
            records = batch.records
            if len(records) == 1:  # (`consume`)
                at_us = records[0].occurred_at_us
                self.sums.span = (at_us, at_us)
            else:
                times = [event.occurred_at_us for event in records]
                self.sums.span = (min(times), max(times))

    def _priced_one(self, index: int, event: EventRecord, pricing: dict[str, Rule | None]) -> bool:
        """Plan an event of one charge on a `_priced` rule whose price adds
        charges on `_spend_simple` rules only: what the general way finds of
        it (`_short_rules`, `_Spend.expand`, `_keys`, `_tier`), without their
        loops; one that adds a single spend charge is ``paired`` (`decide`
        makes its rows inline). False for any other event: planned the
        general way, which prices it again alike."""
        found = self._in_time(event, pricing, _priced)
        if found is None:
            return False
        if self.spend is None:
            self.spend = _Spend.of(self.cache, self.version)
        spend = self.spend
        expanded, event_rules, error = spend.expand(index, event, found)
        if error is not None:
            self.todo.append((index, event, event_rules, error, None))
            return True
        at_us, counted, simple = expanded.occurred_at_us, self._counted, self.simple
        for rule in event_rules[1:]:
            known = simple.get(rule.name)
            if known is None:
                known = simple[rule.name] = _spend_simple(rule)
            if not known:
                return False  # planned the general way (pricing it again finds the same)
        if len(event_rules) == 2:  # the usual: one spend limit of its currency
            (subject, name, cost), (payer, spent, amount) = expanded.charges
            fixed = [
                counted(event_rules[0], subject, name, cost, at_us),
                counted(event_rules[1], payer, spent, amount, at_us),
            ]
            self.paired.add(index)
        else:
            fixed = [
                counted(rule, subject, name, cost, at_us)
                for (subject, name, cost), rule in zip(expanded.charges, event_rules, strict=True)
            ]
        if index in spend.counted:
            single = spend.counted[index]
            if single is None:
                self.sums.poisoned.update((name, subject) for subject, name, _ in expanded.charges)
            else:
                self._tier(index, expanded, fixed, single)
        self.todo.append((index, expanded, event_rules, None, fixed))
        return True

    def _plain_rules(self, event: EventRecord, plain: dict[str, Rule | None]) -> list[Rule] | None:
        """The rules of an event when each of its charges is `_plain`,
        costs more than 0 and is in its time (`rules_for` finds no error
        but a seat value's: `_plain_keys`); else None."""
        return self._in_time(event, plain, _plain)

    def _in_time(
        self,
        event: EventRecord,
        known: dict[str, Rule | None],
        kind: Callable[[Rule | None], Rule | None],
    ) -> list[Rule] | None:
        """The rules of an event when ``kind`` takes each of its charges'
        (``known`` keeps its answers by name) and each charge costs more
        than 0 and is in its time; else None. A rule it takes with
        dimensions is noted in ``dimensioned``, one with a breaker in ``breaking``."""
        now_us, at_us, rules = self.batch.now_us, event.occurred_at_us, self.rules
        found: list[Rule] = []
        for _, name, cost in event.charges:
            try:
                rule = known[name]
            except KeyError:
                rule = known[name] = kind(rules.get(name))
                if rule is not None:
                    if rule.dimensions:
                        self.dimensioned[name] = rule.dimensions
                    if rule.needs and Need.BREAKER in rule.needs:
                        self.breaking.add(name)
            if (
                rule is None
                or cost == 0
                or not now_us - rule.lateness_us <= at_us <= now_us + FUTURE_TOLERANCE_US
            ):
                return None
            found.append(rule)
        return found

    def _short_rules(
        self, event: EventRecord, shorts: dict[str, Rule | None]
    ) -> tuple[list[Rule], dict[int, str] | None] | None:
        """The rules of an event whose charges are all on `_short` rules
        (priced ones and seat limits too), cost more than 0, are in their
        time and count valid seat values (`rules_for` finds no error), and
        those values by position, each found once; else None."""
        found = self._in_time(event, shorts, _short)
        if found is None:
            return None
        try:
            return found, _seat_values(event, found)
        except MeteringError:
            return None

    def _plain_keys(self, index: int, event: EventRecord, event_rules: list[Rule]) -> _Fixed | None:
        """`_keys` of an event whose rules are all `_plain`, or None (nothing
        noted) when a charge on a seat limit counts no valid value (`rules_for`
        finds its error)."""
        at_us, counted, charges = event.occurred_at_us, self._counted, event.charges
        if len(charges) == 1:  # most events
            rule, (subject, name, cost) = event_rules[0], charges[0]
            if not rule.distinct:
                return [counted(rule, subject, name, cost, at_us)]
            try:
                value = seat_value(rule, event, cost)
            except MeteringError:
                return None
            found = counted(rule, subject, name, cost, at_us)
            seat = (*found[0], value)
            self.wanted_seats.add(seat)
            self.event_seats[index] = [seat]
            return [found]
        try:
            values = _seat_values(event, event_rules)
        except MeteringError:
            return None
        return self._keys(index, event, event_rules, values)

    def _counted(
        self, rule: Rule, subject: str, name: str, cost: int, at_us: int
    ) -> tuple[Key, Window]:
        """A charge's counter key and calendar window: its cost summed into the
        batch's totals, and its pair noted when it has allowances (`Sums.timed`)."""
        window = self.calendar.calendar(rule, subject, at_us)
        key = (name, subject, window[0])
        self.keys[key] = window[1]
        totals = self.sums.totals
        total = totals.get(key)
        if total is not None:
            totals[key] = total + cost
            return key, window
        totals[key] = cost
        entitled, granted = self.allowances.histories, self.allowances.grant_pairs
        if entitled or granted:  # (its charges' times: the batch's, found by `plan`)
            pair = (name, subject)
            if pair in entitled or pair in granted:
                self.sums.timed.add(pair)
        return key, window

    def _seats(self, event: EventRecord) -> bool:
        """Whether ``event`` charges a seat limit (a reservation of one is
        refused before its other charges are judged, as the reference does)."""
        rules = self.rules
        return any(name in rules and rules[name].distinct for _, name, _ in event.charges)

    def _keys(
        self,
        index: int,
        event: EventRecord,
        event_rules: list[Rule],
        values: dict[int, str] | None = None,
    ) -> _Fixed | None:
        """The event's counters' keys and windows, or None when one is a
        first-use window (known once its current window is read); its seat
        values (``values`` has those found already, by position) in
        ``event_seats`` (with fixed windows)."""
        fixed: _Fixed | None = []
        keys, at_us = self.keys, event.occurred_at_us
        seats: list[SeatKey | None] | None = None
        for position, ((subject, name, cost), rule) in enumerate(
            zip(event.charges, event_rules, strict=True)
        ):
            if rule.dimensions:
                self.dimensioned[name] = rule.dimensions
            if rule.bucket:
                key = (name, subject, BUCKET_WINDOW[0])
                keys[key] = BUCKET_WINDOW[1]
                if fixed is not None:
                    fixed.append((key, BUCKET_WINDOW))
                self.sums.poisoned.add((name, subject))
            elif rule.calendar:
                key, window = self._counted(rule, subject, name, cost, at_us)
                if fixed is not None:
                    fixed.append((key, window))
                if rule.distinct:
                    value = values.get(position) if values else None
                    if value is None:
                        value = seat_value(rule, event, cost)
                    seat = (name, subject, window[0], value)
                    self.wanted_seats.add(seat)
                    if seats is None:
                        seats = [None] * len(event_rules)
                    seats[position] = seat
            else:
                self.pairs.add((name, subject))
                self.sums.poisoned.add((name, subject))  # a first-use window's
                fixed = None
                if rule.distinct:  # in the pair's current window, or in a new one (none)
                    self.wanted_seats.add((name, subject, None, seat_value(rule, event, cost)))
        if seats is not None and fixed is not None:
            self.event_seats[index] = seats
        return fixed

    def read(self, store: HotStore, retry: bool) -> Snapshot:
        """The batch's state in one read, locked."""
        batch, allowances, pairs, keys = self.batch, self.allowances, self.pairs, self.keys
        due = allowances.due_pairs(chain(pairs, (key[:2] for key in keys)), batch.now_us)
        granted: list[Pair] = []
        since = ALL_GRANTS
        grant_pairs = allowances.grant_pairs
        if grant_pairs:  # (every fixed window's granted pair is `timed`)
            timed = self.sums.timed
            if len(timed) == 1 and not pairs:  # (most of `consume`'s)
                [pair] = timed
                granted = [pair] if pair in grant_pairs else []
            else:
                granted = sorted((timed | pairs) & grant_pairs)
            if granted:  # grants count at the events' instants, now and later (window ends)
                span = self.sums.span  # (the batch's times, when `plan` found them)
                first = span[0] if span else min(e.occurred_at_us for e in batch.records)
                since = min(batch.now_us, first)
        # One event skips the id lookup: a repeated id fails the results
        # insert, and the transaction runs again (``retry``), looking up.
        self.looked_up = (
            retry
            or batch.lookup_first
            or len(batch.records) > 1
            or any(item[3] is not None for item in self.todo)
        )
        ids = list(self.first) if self.looked_up else None
        wanted = sorted((*key, end) for key, end in keys.items())
        wanted_seats, held = self.wanted_seats, self.cache.held
        asked: Iterable[WantedSeat] = wanted_seats
        assumed: Assumed = {}
        # One value with its first counter (SQLite): known held, or read there.
        one = len(wanted_seats) == 1 and store.folds_one_seat
        stamp = None
        if one:
            [seat] = wanted_seats
            stamp = held.stamp_of(seat)
            if stamp is not None:
                asked = ()
        elif wanted_seats and store.keeps_stamps:  # those known held: read if their stamp moved
            asked, assumed = held.split(wanted_seats)
        # (Without first-use windows, every seat's window start is known.)
        seats = sorted(asked, key=_seat_order if pairs else None)
        request = ReadRequest(
            ids,
            sorted(pairs),
            wanted,
            granted,
            seats,
            due,
            breaker_pairs=_breaker_pairs(self.rules, self.breaker_pairs),
            grants_since_us=since,
        )
        snapshot = store.read(request)
        if snapshot.version != self.version:
            raise _Decline(Declined("the limits changed since they were cached", stale=True))
        if snapshot.pots:  # what the grants had used: the batch's draws are the rest (`_draws`)
            self.read_used = used_by_grant(snapshot.pots.values())
        if one:
            # A window met first is read whole where the value's row was the
            # only reason to fold the read (no grant, no breaker: `FOLDED`).
            whole = not granted and not self.breaker_pairs
            held.settle_one(seat, stamp, snapshot, store.read_seats, store.read_held, whole)
        elif wanted_seats and store.keeps_stamps:
            held.settle(seats, assumed, snapshot, store.read_seats, store.read_held)
        if due:
            allowances.learn_due(due, snapshot.schedules, batch.now_us)
        return snapshot

    def decide(
        self, snapshot: Snapshot, send: Callable[[Sequence[ResultRecord]], None] | None = None
    ) -> None:
        """Each event in order over ``snapshot``'s state, which it updates;
        with ``send``, the results decided sent to it every `SEND_EVERY`
        and the rest at the end (``sent`` of ``records``)."""
        batch = self.batch
        if snapshot.schedules:
            self.issues = _issues(snapshot, self.todo, batch.now_us, self.allowances.zones)
        self.seats = Seats(snapshot.seen)
        self.had_row = set(snapshot.windows)  # `_first_use` adds the windows it opens
        marker = None if batch.policy is None else batch.policy.marker
        reason: str | None
        found = snapshot.stored
        rooms = self._rooms(snapshot)
        # Covered counters (`metering.domain.room`): each charged, so one that
        # has a row is remembered as it was before the batch once, here.
        states, before = snapshot.states, self.before
        for key in rooms:
            state = states.get(key)
            if state is not None and key not in before:
                before[key] = tuple(state)
        # An event of one charge on a covered counter, without money (most of
        # a batch's): its row is made here, as `_allowed` makes it.
        plain, breakers = self.spend is None, self.breakers
        # A covered counter's pair is `steady` (`_rooms`): its breaker's steps deferred.
        defer = None if breakers is None else breakers.deferred.append
        paired = self.paired if rooms else None
        event_seats, seats = self.event_seats, self.seats
        now_us, answers, records = batch.now_us, self.answers, self.records
        due = SEND_EVERY if send is not None else len(self.todo) + 1
        for index, event, event_rules, error, fixed in self.todo:
            stored = found.get(event.event_id) if found else None
            if stored is not None:
                same = stored.fingerprint == event.fingerprint
                answers[index] = Answer(DUPLICATE, stored) if same else Answer(CONFLICT, None)
                continue
            if error is not None:
                if batch.invalid == "raise":
                    raise Unacceptable(index, error)
                self.refused.append(refused_event(event, str(error)))
                outcome, reason, rows = "rejected", str(error), []
                denied_by: tuple[str, ...] = ()
            elif plain and fixed is not None and len(fixed) == 1 and fixed[0][0] in rooms:
                key, window = fixed[0]
                room = rooms[key]
                state = states.get(key)
                if state is None:
                    state = states[key] = fresh_state()
                    self.created[key] = window[1]
                subject, name, cost = event.charges[0]
                if event_seats and index in event_seats:
                    seat = event_seats[index][0]
                    if seat is not None:
                        cost = seats.taken(seat)
                if room[1] is None:
                    rows = [allowed_row(subject, name, cost, state, room, window)]
                else:
                    at_us = event.occurred_at_us
                    rows = [drawn_row(subject, name, cost, state, room, window, at_us)]
                if defer is not None:
                    defer(rows[0])
                outcome, denied_by, reason = "allowed", (), marker
            elif (
                paired
                and index in paired
                and fixed is not None
                and fixed[0][0] in rooms
                and fixed[1][0] in rooms
            ):
                rows = self._paired(index, event, fixed, states, rooms)
                if breakers is not None:
                    breakers.charged("allowed", rows, event.event_id, now_us)
                outcome, denied_by, reason = "allowed", (), marker
            else:
                if rooms and fixed is not None and _covers(rooms, fixed):
                    verdict = self._allowed(index, event, fixed, snapshot, rooms)
                else:
                    verdict = self._verdict(index, event, event_rules, fixed, snapshot)
                outcome, denied_by, reason = verdict.outcome, verdict.denied_by, marker
                rows = verdict.rows
            record = ResultRecord(
                event.event_id,
                outcome,
                event.fingerprint,
                event.occurred_at_us,
                now_us,
                denied_by,
                reason,
                rows,
                event.metadata,
            )
            records.append(record)
            answers[index] = Answer(NEW, record)
            if len(records) == due:
                assert send is not None
                send(sorted(records[self.sent :], key=_event_id))
                self.sent, due = due, due + SEND_EVERY
        if send is not None and len(records) > self.sent:
            send(sorted(records[self.sent :], key=_event_id))
            self.sent = len(records)

    def _rooms(self, snapshot: Snapshot) -> dict[Key, Room]:
        """The counters every charge of the batch fits (`metering.domain.room`):
        none with an import's policy (its rules change per event), nor of a
        breaker a charge may trip or that holds its subject to a quarantine."""
        if self.batch.policy is not None:
            return {}
        allowances, breakers = self.allowances, self.breakers
        if self.tiered:
            self._tiered(snapshot.states)
        if breakers is not None:  # stepped as the events are decided: none may trip
            now_us, states = self.batch.now_us, breakers.states
            self.sums.poisoned.update(
                pair for pair in self.breaker_pairs if not steady(states.get(pair), now_us)
            )
        return covered(
            self.sums,
            self.rules,
            snapshot.states,
            allowances.histories,
            snapshot.pots,
            allowances.alerts,
        )

    def _tier(
        self, index: int, event: EventRecord, fixed: _Fixed, single: tuple[int, Price]
    ) -> None:
        """Group event ``index``, priced by its counter (``single``: its priced
        charge's position and price), with the batch's other charges of that
        counter (``tiered``): its spend charges' costs out of the batch's
        totals, as `_tiered` puts their sums back. A counter charged at
        another price or with other spend counters is not summed: its pair
        and theirs are poisoned."""
        position, price = single
        totals, charges = self.sums.totals, event.charges
        count = self.paying.get(price.currency)
        if count is None:
            assert self.spend is not None
            count = len(self.spend.book.spend.get(price.currency, ()))
            self.paying[price.currency] = count
        head = len(charges) - count
        if count == 1:  # the usual: one spend limit of its currency
            paid: tuple[Key, ...] = (fixed[head][0],)
            totals[paid[0]] -= charges[head][2]
        else:
            paid = tuple([key for key, _ in fixed[head:]])
            for key, charge in zip(paid, charges[head:], strict=True):
                totals[key] -= charge[2]
        key = fixed[position][0]
        known = self.tiered.get(key)
        if known is None:
            self.tiered[key] = (price, paid, [charges[position][2]], [index])
        elif (known[0] is price or known[0] == price) and known[1] == paid:
            known[2].append(charges[position][2])
            known[3].append(index)
        else:  # another price or other spend counters: not summed
            self.unlike.add(key)
            self.sums.poisoned.update((k[0], k[1]) for k in (key, *known[1], *paid))

    def _tiered(self, states: Mapping[Key, State]) -> None:
        """The sums of the spend charges of the events priced by their
        counters (``tiered``) in the batch's totals, in place of the amounts
        they were expanded with: per counter, with one price and the same
        spend counters for all of its charges, what each costs one after the
        other from its usage before the batch (`counted_amounts`, kept in
        `_Spend.ahead`); else its pair and theirs are poisoned."""
        assert self.spend is not None
        totals, poisoned, unlike = self.sums.totals, self.sums.poisoned, self.unlike
        ahead = self.spend.ahead
        for key, (price, paid, costs, events) in self.tiered.items():
            state = states.get(key)
            used = state[USED] if state is not None else 0
            if key in unlike or used < 0 or totals[key] != sum(costs):
                poisoned.update((k[0], k[1]) for k in (key, *paid))
                continue
            amounts = counted_amounts(price, used, costs)
            amount = sum(amounts)
            for paid_key in paid:
                totals[paid_key] += amount
            if len(costs) == 1:
                ahead[events[0]] = (used, amount)
                continue
            for index, cost, amount in zip(events, costs, amounts, strict=True):
                ahead[index] = (used, amount)
                if cost > 0:
                    used += cost

    def _allowed(
        self,
        index: int,
        event: EventRecord,
        fixed: _Fixed,
        snapshot: Snapshot,
        rooms: dict[Key, Room],
    ) -> EventOutcome:
        """An event whose charges are all on covered counters: allowed, its
        rows written without evaluating its rules (`metering.domain.room`);
        a charge on a seat limit costs what its value's live events say
        (`Seats.taken`), counted as it is made."""
        event_seats = self.event_seats.get(index) if self.event_seats else None
        states, created = snapshot.states, self.created
        at_us = event.occurred_at_us
        rows = []
        charges: Sequence[tuple[str, str, int]] = event.charges
        spend = self.spend
        if spend is not None and index in spend.counted:  # priced by its counter before it
            single = spend.counted[index]
            assert single is not None
            state = states.get(fixed[single[0]][0])
            charges = spend.reprice_one(index, event, single, state[USED] if state else 0)
        for position, ((subject, name, cost), (key, window)) in enumerate(
            zip(charges, fixed, strict=True)
        ):
            if event_seats is not None:
                seat = event_seats[position]
                if seat is not None:
                    cost = self.seats.taken(seat)
            state = states.get(key)
            if state is None:  # (one that has a row is in ``before``: `decide`)
                state = states[key] = fresh_state()
                created[key] = window[1]
            room = rooms[key]
            if room[1] is None:
                rows.append(allowed_row(subject, name, cost, state, room, window))
            else:
                rows.append(drawn_row(subject, name, cost, state, room, window, at_us))
        verdict = EventOutcome("allowed", rows, ())
        if self.spend is not None:
            self.spend.annotate(index, verdict)
        if self.breakers is not None:
            self.breakers.charged("allowed", rows, event.event_id, self.batch.now_us)
        return verdict

    def _paired(
        self,
        index: int,
        event: EventRecord,
        fixed: _Fixed,
        states: dict[Key, State],
        rooms: dict[Key, Room],
    ) -> list[list[Any]]:
        """The rows of a ``paired`` event (a priced charge and its one spend
        charge) on covered counters, as `_allowed` makes them and
        `_Spend.annotate` marks them: its spend charge at the amount its
        priced one costs there."""
        assert self.spend is not None
        spend = self.spend
        (subject, name, cost), (payer, spent, amount) = event.charges
        (key, window), (paid, paid_window) = fixed
        state = states.get(key)
        single = spend.counted.get(index)
        if single is not None:  # priced by its counter: by what it holds before it
            used = state[USED] if state is not None else 0
            ahead = spend.ahead.get(index)
            if ahead is not None and ahead[0] == used:
                amount = ahead[1]
            else:
                amount = tiered_amount(single[1], used, cost)
            currency = single[1].currency
        else:
            currency = spend.amounts[index][0][0]
        at_us = event.occurred_at_us
        row = self._covered_row(subject, name, cost, key, window, states, rooms, at_us)
        if len(row) == ROW_FIELDS:
            row.append([])  # no grant paid
        row.append([currency, amount])
        paid_row = self._covered_row(payer, spent, amount, paid, paid_window, states, rooms, at_us)
        return [row, paid_row]

    def _covered_row(
        self,
        subject: str,
        name: str,
        cost: int,
        key: Key,
        window: tuple[int, int],
        states: dict[Key, State],
        rooms: dict[Key, Room],
        at_us: int,
    ) -> list[Any]:
        """The row of a charge on counter ``key``, covered (`rooms`), as
        `_allowed` makes it: its state made if the batch read none."""
        state = states.get(key)
        if state is None:
            state = states[key] = fresh_state()
            self.created[key] = window[1]
        room = rooms[key]
        if room[1] is None:
            return allowed_row(subject, name, cost, state, room, window)
        return drawn_row(subject, name, cost, state, room, window, at_us)

    def _verdict(
        self,
        index: int,
        event: EventRecord,
        event_rules: list[Rule],
        fixed: _Fixed | None,
        snapshot: Snapshot,
    ) -> EventOutcome:
        """One acceptable event, decided with its subjects' own allowances."""
        allowances = self.allowances
        event_pots: list[Pot | None] | None = None
        if allowances.histories or snapshot.pots or allowances.alerts:
            own = (allowances.histories, allowances.alerts)
            event_rules, event_pots = _entitled(self.cache, event, event_rules, own, snapshot.pots)
        breakers = self.breakers
        if breakers is not None:
            event_rules, event_pots = _quarantined(breakers, event, event_rules, event_pots)
        policy = self.batch.policy
        if policy is not None:  # after `_entitled` (its shared rules stay), and a quarantine
            event_rules = [policy.rule(rule) for rule in event_rules]
        if fixed is None:
            fixed = self._first_use_keys(event, event_rules, snapshot.windows)
        event_windows, event_states = self._states(fixed, snapshot.states)
        charges: Sequence[tuple[str, str, int]] = event.charges
        event_seats: list[SeatKey | None] | None = None
        if self.wanted_seats and any(rule.distinct for rule in event_rules):
            event_seats = self.event_seats.get(index)  # planned with the same windows
            if event_seats is None:
                event_seats = _seat_keys(event, event_rules, event_windows)
            charges = _seat_charges(event, self.seats.costs(event_seats))
        if self.spend is not None:
            charges = self.spend.reprice(index, event, charges, event_states)
        verdict = decide(
            event_rules,
            charges,
            event_windows,
            event_states,
            event.occurred_at_us,
            event.event_id,
            self.wanted_notices,
            event_pots,
        )
        if event_seats is not None:
            outcomes = [row[_CHARGE_OUTCOME] for row in verdict.rows]
            self.seats.count_outcomes(event_seats, verdict.outcome, outcomes)
        if self.spend is not None:
            self.spend.annotate(index, verdict)
        if breakers is not None:
            breakers.charged(verdict.outcome, verdict.rows, event.event_id, self.batch.now_us)
        return verdict

    def _first_use_keys(
        self, event: EventRecord, event_rules: list[Rule], windows: dict[Pair, Window | None]
    ) -> _Fixed:
        """The event's counters when one is a first-use window, read now."""
        fixed: _Fixed = []
        at_us = event.occurred_at_us
        for (subject, name, _), rule in zip(event.charges, event_rules, strict=True):
            if rule.bucket:
                window = BUCKET_WINDOW
            elif rule.calendar:
                window = self.calendar.calendar(rule, subject, at_us)
            else:
                window = _first_use(rule, (name, subject), at_us, windows, self.moved)
            fixed.append(((name, subject, window[0]), window))
        return fixed

    def _states(self, fixed: _Fixed, states: dict[Key, State]) -> tuple[list[Window], list[State]]:
        """An event's windows and counters: a new counter is remembered as
        created, a stored one as it was before the batch changed it."""
        windows: list[Window] = []
        found: list[State] = []
        for key, window in fixed:
            state = states.get(key)
            if state is None:
                state = states[key] = fresh_state()
                self.created[key] = window[1]
            elif key not in self.before and key not in self.created:
                self.before[key] = tuple(state)
            windows.append(window)
            found.append(state)
        return windows, found

    def write(
        self, connection: Connection | None, store: HotStore, snapshot: Snapshot
    ) -> list[Answer] | Declined:
        """Write what the batch changed, and its notices and dead letters."""
        batch = self.batch
        if len(self.first) == len(batch.records):  # no id repeated: `decide` answered each
            final = cast(list[Answer], self.answers)
        else:
            final = _resolve(self.answers, batch.records, snapshot.stored)
        # Queued input keeps its conflicts in the dead-letter record; a caller
        # who is answered `EventConflict` (``invalid="raise"``) has been told.
        conflicts = [
            Rejected(event.event_id, str(EventConflict(event.event_id)), event.fingerprint)
            for event, answer in zip(batch.records, final, strict=True)
            if answer.kind == CONFLICT and batch.invalid == "reject"
        ]
        changes = self._changes(snapshot)
        low = self._draws(snapshot, changes)
        if batch.hold is not None:
            changes.holds = _holds(self.records, batch.hold, batch.now_us, self.looked_up)
        dead = [*batch.rejected, *conflicts, *self.refused]
        if dead and store.takes_rejected:
            changes.rejected, dead = dead, []  # in the write's round trip
        forecasting = connection is not None or self.cache.traits(self.rules)[1]
        leads = self._leads() if forecasting and self.wanted_notices is not None else {}
        breakers = self.breakers
        more = bool(self.notices or dead or low or leads or breakers)
        if more and connection is None:  # the store writes them (`_direct_extras`)
            if dead:
                return Declined("dead letters to write", Need.DEAD_LETTERS)
            _direct_extras(self, changes, snapshot, low, leads)
            more = False
        meanwhile = None if batch.meanwhile is None else partial(batch.meanwhile, final)
        store.write(changes, batch.now_us, commit=not more, meanwhile=meanwhile)
        if changes.seats:  # their windows' stamps moved
            self.cache.held.forget(seat[:3] for seat in changes.seats)
        if connection is not None and breakers is not None:
            enforce = batch.policy is None or batch.policy.enforce
            breakers.write(connection, batch.now_us, announce=enforce)
        if connection is not None and more:
            notices: list[Notice] = self.notices
            if notices or leads:
                charged = ((r.event_id, r.charges) for r in self.records)
                notices = with_forecasts(connection, leads, charged, notices, batch.now_us)
            _record_extras(connection, notices, dead, batch.now_us, low)
        return final

    def _leads(self) -> dict[str, int]:
        """The forecast leads of the limits the batch charged."""
        rules = self.rules
        charged = {row[1] for record in self.records for row in record.charges}
        return leads_of(rules[name].limit for name in charged if name in rules)

    def _month(self, key: Key, end_us: int) -> str | None:
        """A new counter's billing month (None: a token bucket's)."""
        if end_us == BUCKET_WINDOW[1]:
            return None
        return billing_month(self.allowances.zones.get(key[1], ()), key[2])

    def _changes(self, snapshot: Snapshot) -> Changes:
        """Counters, windows, results, rollups and seats to write."""
        states = snapshot.states
        had_row = self.had_row
        moved = sorted(self.moved.items())
        rollups = rollup_deltas(self.records, self.dimensioned)
        if self.spend is not None and self.spend.amounts:
            spent = spend_deltas(self.records)
            rollups = merged(rollups, spent) if rollups else spent
        before = self.before
        changes = Changes(
            updated=[
                (key, states[key]) for key, old in before.items() if tuple(states[key]) != old
            ],
            created=[
                (key, end, states[key], self._month(key, end))
                for key, end in sorted(self.created.items())
            ],
            new_windows=[item for item in moved if item[0] not in had_row],
            moved_windows=[item for item in moved if item[0] in had_row],
            results=sorted(self.records[self.sent :], key=_event_id),
            rollups=rollups,
        )
        if self.seats.added:
            changes.seats = dict(self.seats.added)
        return changes

    def _draws(self, snapshot: Snapshot, changes: Changes) -> list[str]:
        """The batch's draws on grants and its recurring grants' issues, in
        ``changes``; the grants its draws leave at or below their threshold."""
        pots = snapshot.pots
        if not pots:
            return []
        draws = drawn_since(pots, self.read_used)
        if draws is None:  # a pot drew in more than one window: its rows tell which
            draws = draws_of(row for record in self.records for row in record.charges)
        changes.draws = draws
        changes.issues = self.issues
        watched = snapshot.watched
        if not (watched and changes.draws):
            return []
        drawn = {key[3] for key, amount in changes.draws.items() if amount > 0}
        changes.expected = {g: watched[g][1] for g in sorted(drawn) if g in watched}
        thresholds = {g: watched[g][0] for g in changes.expected}
        return grants_low(pots, thresholds, changes.expected)


def _breaker_pairs(rules: Mapping[str, Rule], pairs: Iterable[Pair]) -> list[Pair]:
    """Those of ``pairs`` on limits with a breaker, sorted (read with the counters)."""
    return sorted(pair for pair in pairs if rules[pair[0]].limit.breaker_factor)


def _breakers(
    rules: Mapping[str, Rule], pairs: Iterable[Pair], snapshot: Snapshot, now_us: int
) -> Breakers | None:
    """The batch's breakers as ``snapshot`` read them; None without any."""
    wanted = _breaker_pairs(rules, pairs)
    if not wanted:
        return None
    return Breakers({name: rules[name].limit for name, _ in wanted}, snapshot.breakers, now_us)


def _direct_extras(
    applying: _Applying, changes: Changes, snapshot: Snapshot, low: list[str], leads: dict[str, int]
) -> None:
    """What a direct connection's store writes with the rest (`HotStore.write`):
    the breakers stepped and their ``limit.quarantined`` notices, ``grant.low``,
    and the notices told their forecasts, worked out from the counters' rates
    as read and what the batch adds (the rates the write sets)."""
    batch, breakers = applying.batch, applying.breakers
    now_us = batch.now_us
    found: list[tuple[Notice, dict[str, Any]]] = []
    if breakers is not None:
        changes.breakers = breakers.changed_states()
        if breakers.notices and (batch.policy is None or batch.policy.enforce):
            secret = snapshot.secret
            if secret is None:  # the first trip ever: the write makes it
                secret = changes.secret = new_secret()
            found = breakers.documents(secret, now_us)
    notices: list[Notice] = applying.notices
    if notices or leads:
        charges = ((r.event_id, r.charges) for r in applying.records)
        charged, keys = forecast_keys(leads, charges, notices)
        if keys:
            counters = _written_rates(applying, snapshot, keys)
            left = _grants_left(snapshot.pots, {(k.limit, k.subject) for k in keys}, now_us)
            notices = forecast_with(leads, charged, notices, now_us, counters, left)
    found.extend((notice, payload_of(notice, now_us)) for notice in notices)
    changes.low = low
    changes.notices = [(notice, encode_payload(document)) for notice, document in found]


def _written_rates(
    applying: _Applying, snapshot: Snapshot, keys: Iterable[CounterKey]
) -> dict[CounterKey, tuple[int, float, int]]:
    """``used``, the rate and its instant of those of ``keys`` that have a
    row once the batch is written (as `CounterStore.read_rates` would read them)."""
    now_us, states, rates = applying.batch.now_us, snapshot.states, snapshot.rates
    found: dict[CounterKey, tuple[int, float, int]] = {}
    for counter in keys:
        key = (counter.limit, counter.subject, counter.window_start_us)
        state = states.get(key)
        if state is None:
            continue
        used = state[USED]
        if key in applying.created:
            found[counter] = (used, created_rate(used), now_us)
            continue
        read = rates.get(key)
        if read is None:  # rows cached without their rates: read them
            raise _Decline(Declined("a counter's rate not read"))
        before = applying.before.get(key)
        if before is None or tuple(state) == before:  # not written
            found[counter] = (used, *read)
        else:
            found[counter] = (used, *added(read[0], read[1], used - before[USED], now_us))
    return found


def _grants_left(pots: Mapping[Pair, Pot], pairs: Iterable[Pair], now_us: int) -> dict[Pair, int]:
    """What the grants in force of ``pairs`` have left after the batch's draws
    (as `AllowanceStore.grants_left`)."""
    found: dict[Pair, int] = {}
    for pair in pairs:
        pot = pots.get(pair)
        if pot is None:
            continue
        left = sum(b.left for b in pot.balances if b.left > 0 and b.active_at(now_us))
        if left:
            found[pair] = left
    return found


def _issues(
    snapshot: Snapshot,
    todo: Iterable[tuple[int, EventRecord, list[Rule], MeteringError | None, _Fixed | None]],
    now_us: int,
    zones: Mapping[str, ZoneHistory],
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
        history = zones.get(schedule.subject, ()) if zones else ()
        due = issues_of(schedule, last, now_us, history) if pair in charged else []
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
    `metering.upkeep.dead_letters.replay` once it is acceptable."""
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


def _plain(rule: Rule | None) -> Rule | None:
    """``rule`` when a charge of it needs nothing `_Applying.plan` finds
    beyond its counter's key (and seat value) and the checks of its time and
    cost: a `_short_window` one without money; else None."""
    if rule is None or rule.money or not _short_window(rule):
        return None
    return rule


def _short(rule: Rule | None) -> Rule | None:
    """``rule`` when a charge of it needs nothing `_Applying._short_rules` does
    not find: `_short_window`, and not a spend limit's (an event that names
    one is refused); else None."""
    if (
        rule is None
        or not _short_window(rule)
        or (rule.money and refuse_spend_charge(rule.limit) is not None)
    ):
        return None
    return rule


def _priced(rule: Rule | None) -> Rule | None:
    """``rule`` when it is `_short` and priced, and no seat limit (`_Applying._priced_one`)."""
    if rule is None or not rule.money or rule.distinct or _short(rule) is None:
        return None
    return rule


def _priced_rules(rules: Sequence[Rule]) -> bool:
    """Whether any of ``rules`` is priced: a plain loop (`any` of a
    generator costs a batch's events about a microsecond each more)."""
    for rule in rules:  # noqa: SIM110 - a loop, as the docstring says
        if rule.money:
            return True
    return False


def _spend_simple(rule: Rule) -> bool:
    """Whether a charge of spend limit ``rule`` is counted as `_Applying._counted`
    counts it with nothing more: no dimensions, seats nor breaker."""
    return (
        _short_window(rule)
        and not rule.dimensions
        and not rule.distinct
        and not (rule.needs and Need.BREAKER in rule.needs)
    )


def _short_window(rule: Rule) -> bool:
    """Whether a charge of ``rule`` is counted as `_Applying._counted` counts
    it: a calendar window's, with a price, a spend cap, seats, dimensions or
    a breaker perhaps, but no gauge nor concurrent license."""
    return not (not rule.calendar or rule.bucket or rule.concurrent or rule.gauge is not None)


def _covers(rooms: dict[Key, Room], fixed: _Fixed) -> bool:
    """Whether every counter of an event is covered (`metering.domain.room`),
    each charged once (two charges of one counter are judged on its state
    before the event: `metering.domain.rules.decide`)."""
    if len(fixed) == 1:
        return fixed[0][0] in rooms
    keys = set()
    for key, _ in fixed:
        if key not in rooms or key in keys:
            return False
        keys.add(key)
    return True


def _entitled(
    cache: LimitCache,
    event: EventRecord,
    event_rules: list[Rule],
    own: tuple[dict[Pair, History], dict[Pair, Own]],
    pots: dict[Pair, Pot],
) -> tuple[list[Rule], list[Pot | None] | None]:
    """The event's rules with its subjects' own maximums and thresholds
    (``own``), and their grants (None: no charge has any)."""
    histories, alerts = own
    rules: list[Rule] | None = None
    found: list[Pot | None] | None = None
    at_us = event.occurred_at_us
    for position, (subject, name, _) in enumerate(event.charges):
        pair = (name, subject)
        history = histories.get(pair) if histories else None
        thresholds = alerts.get(pair) if alerts else None
        if history or thresholds:
            if rules is None:
                rules = list(event_rules)
            rules[position] = cache.rule_for(event_rules[position], history, at_us, thresholds)
        pot = pots.get(pair) if pots else None
        if pot is not None and not event_rules[position].bucket:
            if found is None:
                found = [None] * len(event_rules)
            found[position] = pot
    return (event_rules if rules is None else rules), found


def _quarantined(
    breakers: Breakers,
    event: EventRecord,
    event_rules: list[Rule],
    pots: list[Pot | None] | None,
) -> tuple[list[Rule], list[Pot | None] | None]:
    """The event's rules with those of its quarantined subjects held to the
    quarantine (`Limit.quarantined`, from the maximum in force), unpaid by grants."""
    rules: list[Rule] | None = None
    for position, (subject, name, _) in enumerate(event.charges):
        if not breakers.is_quarantined(name, subject):
            continue
        if rules is None:
            rules = list(event_rules)
        rule = event_rules[position]
        held = Rule.of(rule.limit.with_maximum(rule.maximum).quarantined(), priced=rule.money)
        rules[position] = held
        if pots is not None:
            pots = list(pots)
            pots[position] = None
    return (event_rules, pots) if rules is None else (rules, pots)


def _resolve(
    answers: Sequence[Answer | int],
    events: Sequence[EventRecord],
    stored: dict[str, ResultRecord],
) -> list[Answer]:
    """Answer repeats within the batch: against the stored result when there
    is one (as the general engine does), else like their first occurrence."""
    final: list[Answer] = []
    for event, value in zip(events, answers, strict=True):
        if isinstance(value, Answer):
            final.append(value)
            continue
        assert value >= 0, "an event left unanswered"
        record = stored.get(event.event_id)
        if record is not None:
            same = record.fingerprint == event.fingerprint
            final.append(Answer(DUPLICATE, record) if same else Answer(CONFLICT, None))
            continue
        first = final[value]
        if first.kind == CONFLICT or events[value].fingerprint != event.fingerprint:
            final.append(Answer(CONFLICT, None))
        else:
            final.append(Answer(DUPLICATE, first.record))
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


# Reads, without a lock, what `HotStore.read` would lock: the limits'
# version, the first-use windows of the pairs, the counters of the keys and
# of those windows, the grants of the grant pairs and their draws, the live
# events of the seat values and the breakers of the breaker pairs
# (`metering.storage.hot.postgres.read_unlocked`).
ReadUnlocked = Callable[[ReadRequest], Snapshot]


def check_record(
    read_unlocked: ReadUnlocked, cache: LimitCache, event: EventRecord, now_us: int
) -> EventOutcome | Declined:
    """What applying ``event`` would decide now, by the hot path's rules,
    reading the state in one statement (``read_unlocked``) and writing
    nothing (`Meter.check`).

    A quarantined subject is held to its quarantine (`_quarantined`); the
    breakers are read, never stepped. Declined: an unacceptable event (the
    reference engine raises its error with its own message), a recurring
    grant's issue due, an event before its subject's current first-use
    window, or the cached limits are stale.
    """
    version, rules, allowances = cache.current
    if version < 0:
        return Declined("the limits are not loaded yet", stale=True)
    spend: _Spend | None = None
    stale = Declined("the limits changed since they were cached", stale=True)
    try:
        event_rules, error = rules_for(event, rules, now_us)
        if error is None and _priced_rules(event_rules):
            if cache.pricing.book.version != version:
                return stale
            spend = _Spend(cache.pricing)
            event, event_rules, error = spend.expand(0, event, event_rules)
    except _Decline as exc:
        return exc.declined  # a spend limit not cached yet
    if error is not None:
        return Declined(str(error), Need.INVALID)
    charged = [(name, subject) for subject, name, _ in event.charges]
    if allowances.due_pairs(charged, now_us):
        return Declined("a recurring grant's issue is due", Need.RECURRING)
    granted = sorted(set(charged) & allowances.grant_pairs) if allowances.grant_pairs else []
    at_us = event.occurred_at_us
    calendar = CalendarWindows(allowances.zones)
    pairs: list[Pair] = []
    keys: list[WantedKey] = []
    seats: list[WantedSeat] = []
    for (subject, name, cost), rule in zip(event.charges, event_rules, strict=True):
        if rule.bucket:
            keys.append((name, subject, *BUCKET_WINDOW))
        elif rule.calendar:
            keys.append((name, subject, *calendar.calendar(rule, subject, at_us)))
        else:
            pairs.append((name, subject))
        if rule.distinct:  # a first-use window's: in the pair's current one
            start = keys[-1][2] if rule.calendar else None
            seats.append((name, subject, start, seat_value(rule, event, cost)))
    guarded = [
        (name, subject)
        for (subject, name, _), rule in zip(event.charges, event_rules, strict=True)
        if rule.needs and Need.BREAKER in rule.needs
    ]
    wanted = _breaker_pairs(rules, guarded) if guarded else []
    since = min(at_us, now_us)  # grants count at the event's instant, now and later
    request = ReadRequest(
        None,
        sorted(pairs),
        sorted(keys),
        granted,
        seats,
        breaker_pairs=wanted,
        grants_since_us=since,
    )
    snapshot = read_unlocked(request)
    if snapshot.version != version:
        return stale
    pots: list[Pot | None] | None = None
    if allowances.histories or snapshot.pots:  # (own thresholds: a check announces nothing)
        own: tuple[dict[Pair, History], dict[Pair, Own]] = (allowances.histories, {})
        event_rules, pots = _entitled(cache, event, event_rules, own, snapshot.pots)
    breakers = _breakers(rules, wanted, snapshot, now_us) if wanted else None
    if breakers is not None:  # held to a quarantine; never stepped: a check writes nothing
        event_rules, pots = _quarantined(breakers, event, event_rules, pots)
    windows: list[Window] = []
    states: list[State] = []
    for (subject, name, _), rule in zip(event.charges, event_rules, strict=True):
        if rule.bucket:
            window = BUCKET_WINDOW
        elif rule.calendar:
            window = calendar.calendar(rule, subject, at_us)
        else:
            current = snapshot.windows.get((name, subject))
            if current is not None and at_us < current[0]:
                return Declined("an event before its window", Need.EARLY_FIRST_USE)
            window = first_use_window(rule.period, at_us, current, None)
        # `decide` updates the states in place: these are copies, stored nowhere.
        found = snapshot.states.get((name, subject, window[0]))
        windows.append(window)
        states.append(list(found) if found is not None else fresh_state())
    charges: Sequence[tuple[str, str, int]] = event.charges
    if seats:
        costs = Seats(snapshot.seen).costs(_seat_keys(event, event_rules, windows))
        charges = _seat_charges(event, costs)
    if spend is not None:
        charges = spend.reprice(0, event, charges, states)
    verdict = decide(event_rules, charges, windows, states, at_us, event.event_id, None, pots)
    if spend is not None:
        spend.annotate(0, verdict)
    return verdict
