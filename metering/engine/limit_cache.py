"""What a process keeps of the limits, and an event's rules from them.

`LimitCache` holds every limit as a `Rule` with the limits' version it was read at, the
subjects' `Allowances` of that version (entitlements, grants, recurring issues due, own
thresholds, time zones) and the prices in force; `current` is replaced whole, so a reader never
pairs one version's rules with another's. `rules_for` finds an event's rules or the error that
makes it unacceptable; `CalendarWindows` remembers the windows a batch falls in. The decision
paths (`metering.engine.fast`, `metering.engine.one_trip`) read them; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import Connection

from metering.domain.distinct import value_of
from metering.domain.events import (
    FUTURE_TOLERANCE_US,
    EventRecord,
    check_event_time,
    refuse_free,
)
from metering.domain.grants import History, maximum_at
from metering.domain.imports import ImportPolicy
from metering.domain.instants import from_us
from metering.domain.licenses import consumed_concurrent
from metering.domain.needs import NONE, Need, subject_needs
from metering.domain.rules import (
    Rule,
)
from metering.domain.windows import Window, calendar_window
from metering.domain.zones import ZoneHistory, follows_zone
from metering.engine.money import PriceBook, Pricing, refuse_spend_charge
from metering.engine.seats import HeldCache
from metering.errors import MeteringError, UnknownLimit
from metering.storage.alerts import AlertStore
from metering.storage.allowances import AllowanceStore
from metering.storage.counters import Pair
from metering.storage.prices import PriceStore
from metering.storage.recurring import ScheduleRecord, ScheduleStore
from metering.storage.store import Store

# A subject's own thresholds for a limit: (percentages, amounts) (`metering.alerts`).
Own = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass(slots=True)
class _Bound:
    """A lower bound of a set of times, None until found; any thread may
    forget it or find it again (a stale one stays a lower bound)."""

    at_us: int | None = None


@dataclass(frozen=True, slots=True)
class Allowances:
    """Per-subject policy the hot path needs without a lookup per event:
    every subject's changes of maximum (entitlements), which subjects have
    grants (only theirs are read, under lock, with their counters), when
    their recurring grants' next issues are due (only those are locked, in
    the same read), their thresholds of their own and their changes of time zone."""

    histories: dict[Pair, History] = field(default_factory=dict)
    grant_pairs: frozenset[Pair] = frozenset()
    due: dict[Pair, int] = field(default_factory=dict)
    alerts: dict[Pair, Own] = field(default_factory=dict)
    # What each (limit, subject) with allowances of its own needs (`metering.domain.needs`).
    needs: dict[Pair, frozenset[Need]] = field(default_factory=dict)
    # Each subject's changes of time zone (`metering.domain.zones`): only those with one.
    zones: dict[str, ZoneHistory] = field(default_factory=dict)
    # Every need of ``needs`` (made by `of`; empty: not known).
    every: frozenset[Need] = field(default=frozenset(), compare=False, repr=False)
    # A bound no time of ``due`` is before. Due times only move on
    # (`learn_due`), so a minimum once found stays one.
    soonest: _Bound = field(default_factory=_Bound, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        histories: dict[Pair, History],
        grant_pairs: frozenset[Pair],
        due: dict[Pair, int],
        alerts: dict[Pair, Own],
        zones: dict[str, ZoneHistory] | None = None,
    ) -> Allowances:
        """The allowances, with each pair's needs worked out."""
        needs = {
            pair: subject_needs(
                entitled=pair in histories,
                granted=pair in grant_pairs,
                recurring=pair in due,
                thresholds=pair in alerts,
            )
            for pair in {*histories, *grant_pairs, *due, *alerts}
        }
        every = frozenset().union(*needs.values())
        return cls(histories, grant_pairs, due, alerts, needs, zones or {}, every=every)

    def charged(self, rules: dict[str, Rule], records: Iterable[EventRecord]) -> set[Need]:
        """What the charges of ``records`` need: their rules' needs, their
        subjects' own, an unknown limit's (`Need.INVALID`), one event's
        charges of one counter (`Need.REPEATED_COUNTER`) and a window of a
        subject with a time zone (`Need.TIME_ZONE`: its alignment and billing month)."""
        found: set[Need] = set()
        own, zones, every = self.needs, self.zones, self.every
        for record in records:
            charges = record.charges
            for subject, name, _ in charges:
                rule = rules.get(name)
                if rule is None:
                    found.add(Need.INVALID)
                    continue
                if rule.needs:
                    found |= rule.needs
                if own:
                    needed = own.get((name, subject), NONE)
                    if not needed <= found:
                        found |= needed
                        if every and found >= every:  # (``own`` has nothing more to add)
                            own = {}
                if zones and subject in zones and not rule.bucket:
                    found.add(Need.TIME_ZONE)
            if len(charges) > 1 and len({c[:2] for c in charges}) < len(charges):
                found.add(Need.REPEATED_COUNTER)
        return found

    def learn_due(
        self,
        pairs: Iterable[Pair],
        schedules: Iterable[tuple[ScheduleRecord, object]],
        now_us: int,
    ) -> None:
        """Move on the due time of those of ``pairs`` whose ``schedules`` (all
        of theirs, read under lock: committed) have none due at ``now_us`` any
        more: issuing a recurring grant makes no new version of the limits, so
        the cache learns it here. Due times only move on, so an older reading
        never hides an issue."""
        found: dict[Pair, list[int]] = {pair: [] for pair in pairs}
        for schedule, _ in schedules:
            if schedule.next_issue_us is not None:
                found.setdefault((schedule.limit, schedule.subject), []).append(
                    schedule.next_issue_us
                )
        due = self.due
        for pair, times in found.items():
            if not times:
                due.pop(pair, None)
            elif min(times) > now_us:
                due[pair] = min(times)
        self.soonest.at_us = None  # (found again when next asked: it may have moved on)

    def due_pairs(self, pairs: Iterable[Pair], now_us: int) -> list[Pair]:
        """Those of ``pairs`` with a recurring grant's issue due at ``now_us``, sorted."""
        due = self.due
        if not due:
            return []
        soonest = self.soonest.at_us  # (read once: another thread may forget it)
        if soonest is None:  # (a copy: another thread's `learn_due` may change ``due``)
            soonest = self.soonest.at_us = min(list(due.values()), default=now_us)
        if now_us < soonest:
            return []  # none due yet: the pairs need not be looked at
        return sorted({pair for pair in pairs if due.get(pair, now_us + 1) <= now_us})


class LimitCache:
    """Every limit as a `Rule`, with the version it was read at, and the
    subjects' `Allowances` of that version.

    ``current`` is replaced as a whole, so a reader never pairs one
    version's rules with another's number. Entitlement and grant changes
    bump the same version, and so do prices: ``pricing`` holds them with
    the version they were read at and that version's rules, set before
    ``current`` (a reader that finds another version there runs again).
    """

    def __init__(self) -> None:
        self.current: tuple[int, dict[str, Rule], Allowances] = (-1, {}, Allowances())
        self.pricing = Pricing(PriceBook(), {})
        self._entitled: dict[tuple[str, int, Own | None], Rule] = {}
        self.held = HeldCache()  # whatever the limits' version: its stamps say
        # The limits with dimensions in some era of their history (it only
        # grows): set before ``current``, so it is at least that version's.
        self.dimensioned: frozenset[str] = frozenset()
        # The one-trip call's plans (`metering.engine.one_trip`), each with its version.
        self.plans: dict[tuple[tuple[str, str], ...], Any] = {}
        # Of the rules last asked about: whether one has a breaker, and one a
        # forecast lead (`traits`).
        self._traits: tuple[dict[str, Rule] | None, bool, bool] = (None, False, False)

    def refresh(self, connection: Connection) -> None:
        store = Store(connection)
        version, limits = store.limits_version(), store.list_limits()
        allowances = AllowanceStore(connection)
        found = Allowances.of(
            allowances.histories(),
            frozenset(allowances.grant_pairs()),
            ScheduleStore(connection).due_times(),
            {
                (alert.limit, alert.subject): (alert.thresholds, alert.thresholds_units)
                for alert in AlertStore(connection).listed()
            },
            allowances.time_zones(),
        )
        book = PriceBook.read(PriceStore(connection), version, {lim.name: lim for lim in limits})
        priced = set(book.prices)
        rules = {limit.name: Rule.of(limit, priced=limit.name in priced) for limit in limits}
        self.pricing = Pricing(book, rules)
        self.dimensioned = store.ever_dimensioned()
        self._entitled = {}
        self.plans = {}
        self.current = (version, rules, found)

    def traits(self, rules: dict[str, Rule]) -> tuple[bool, bool]:
        """Whether any of ``rules`` (a version's) has a breaker, and any a
        forecast lead: worked out once per version, not per batch."""
        known = self._traits
        if known[0] is rules:  # (the dict itself: a version's is never changed)
            return known[1], known[2]
        guarded = any(rule.needs and Need.BREAKER in rule.needs for rule in rules.values())
        forecasting = _forecasting(rules)
        self._traits = (rules, guarded, forecasting)
        return guarded, forecasting

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


class CalendarWindows:
    """Calendar windows, remembering the last one per limit (a batch is mostly
    one), and per limit and time zone for subjects with one (``zones``)."""

    def __init__(self, zones: dict[str, ZoneHistory]) -> None:
        self.last: dict[str, Window] = {}
        self.zones = zones
        self.zoned: dict[tuple[str, ZoneHistory], Window] = {}

    def calendar(self, rule: Rule, subject: str, at_us: int) -> Window:
        history = self.zones.get(subject) if self.zones else None
        if history is not None and follows_zone(rule.period):
            key = (rule.name, history)
            window = self.zoned.get(key)
            if window is None or not window[0] <= at_us < window[1]:
                window = self.zoned[key] = calendar_window(rule.period, at_us, history)
            return window
        window = self.last.get(rule.name)
        if window is None or not window[0] <= at_us < window[1]:
            window = self.last[rule.name] = calendar_window(rule.period, at_us)
        return window


def rules_for(
    event: EventRecord,
    rules: dict[str, Rule],
    now_us: int,
    policy: ImportPolicy | None = None,
) -> tuple[list[Rule], MeteringError | None]:
    """The event's rules, or the error that makes it unacceptable (as
    `validate_against_limits`) with the rules found before it; times
    checked as ``policy`` says (an import's)."""
    found: list[Rule] = []
    at_us = event.occurred_at_us
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
        if cost == 0 and rule.gauge is None:
            return found, refuse_free(rule.limit, cost)
        timed = rule if policy is None else policy.rule(rule)
        if at_us > now_us + FUTURE_TOLERANCE_US or at_us < now_us - timed.lateness_us:
            try:
                check_event_time(from_us(at_us), now_us, timed.limit.lateness_seconds)
            except MeteringError as exc:
                return found, exc
        if rule.distinct:
            try:
                seat_value(rule, event, cost)
            except MeteringError as exc:
                return found, exc
        found.append(rule)
    return found, None


# Text values `value_of` found valid (a batch's events repeat their users'):
# such a value needs none of its checks again. Emptied when full.
_VALID: Final[set[str]] = set()
_VALID_KEPT: Final = 4096


def seat_value(rule: Rule, event: EventRecord, cost: int) -> str:
    """The value a charge on seat limit ``rule`` counts (`value_of`)."""
    key, metadata = rule.limit.distinct, event.metadata
    assert key is not None
    raw = metadata.get(key) if metadata else None
    if cost == 1 and type(raw) is str and raw in _VALID:
        return raw
    found = value_of(key, rule.name, metadata, cost)
    if type(raw) is str:  # (a whole number is checked again: its text is made)
        if len(_VALID) >= _VALID_KEPT:
            _VALID.clear()
        _VALID.add(found)
    return found


def _forecasting(rules: Mapping[str, Rule]) -> bool:
    """Whether a cached limit has a forecast lead."""
    return any(rule.needs and Need.FORECAST in rule.needs for rule in rules.values())
