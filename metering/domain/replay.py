"""Replaying recorded demand through other limits: the backtest's rules (docs/simulate.md).

`Replay` is fed the ledger's events in event-time order (`Replay.feed`) and decides each
again with the reference rules (`metering.domain.decisions.decide_event`) against counters
held in memory, under the limits and per-subject maximums given; no database. Counters start
empty, first-use windows open at each subject's first replayed event, grants are not replayed.
A seat charge costs 1 for a value its window does not hold yet (held once an allowed event
takes it), a spend charge the amount recorded; charges on limits not in force or concurrent
are left out. `Replay.rows` gives per (subject, limit) the events, the would-denies and their
cost, the overage, and the events this limit denied when they were decided.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from metering.domain.decisions import ChargeInput, decide_event
from metering.domain.distinct import HELD, SeatKey, Seen, seat_cost, value_of
from metering.domain.grants import History, maximum_at
from metering.domain.jsonable import fields_dict
from metering.domain.limits import Limit
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.domain.windows import Window, calendar_window, first_use_window
from metering.domain.zones import ZoneHistory
from metering.errors import InvalidInput

Pair = tuple[str, str]  # (limit name, subject), as the stores key them
NOT_FITTING: Final = frozenset({"denied", "would_deny"})
# A seat charge of an allowed event with these outcomes takes its seat (not a shadow's would_deny).
TAKES_SEAT: Final = frozenset({"allowed", "overage"})
SIMULATION_COLUMNS: Final = (
    "subject",
    "limit",
    "events",
    "would_deny_events",
    "would_deny_cost",
    "overage",
    "denied_events_then",
)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as the ledger recorded it: when, its charges (subject, limit,
    cost), the limits whose charge was denied when it was decided, and its
    metadata (a seat limit's value)."""

    occurred_at_us: int
    charges: tuple[tuple[str, str, int], ...]
    denied_then: frozenset[str] = frozenset()
    metadata: Mapping[str, Any] | None = None

    @classmethod
    def of_row(
        cls,
        occurred_at_us: int,
        charge_rows: Iterable[list[Any]],
        metadata: Mapping[str, Any] | None = None,
    ) -> StoredEvent:
        """From a ledger row's time, charges (`ChargeDecision.to_row` lists) and metadata."""
        rows = list(charge_rows)
        return cls(
            occurred_at_us,
            tuple((row[0], row[1], row[2]) for row in rows),
            frozenset(row[1] for row in rows if row[4] == "denied"),
            metadata,
        )


@dataclass(frozen=True, slots=True)
class SimulationRow:
    """One subject's figures under one limit (`SIMULATION_COLUMNS`)."""

    subject: str
    limit: str
    events: int
    would_deny_events: int
    would_deny_cost: int
    overage: int
    denied_events_then: int

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self, SIMULATION_COLUMNS)


@dataclass(slots=True)
class _Tally:
    events: int = 0
    would_deny_events: int = 0
    would_deny_cost: int = 0
    overage: int = 0
    denied_events_then: int = 0


@dataclass(slots=True)
class Replay:
    """Counters in memory, fed events oldest first (`feed`), read by `rows`.

    ``limits`` are the limits in force, by name; ``histories`` each
    (limit, subject)'s changes of maximum (`grants.maximum_at`). ``subject``,
    if given, keeps only that subject's charges of each event. ``zones``: each
    subject's changes of time zone (`metering.domain.zones`).
    """

    limits: Mapping[str, Limit]
    histories: Mapping[Pair, History] = field(default_factory=dict)
    subject: str | None = None
    zones: Mapping[str, ZoneHistory] = field(default_factory=dict)
    states: dict[CounterKey, CounterState] = field(default_factory=dict)
    windows: dict[Pair, Window] = field(default_factory=dict)  # first-use, current
    tallies: dict[tuple[str, str], _Tally] = field(default_factory=dict)
    held: Seen = field(default_factory=dict)  # seats taken by the replayed events
    replayed: int = 0

    def feed(self, event: StoredEvent) -> None:
        """Decide ``event`` again and count it (events must come in time order)."""
        at_us = event.occurred_at_us
        inputs: list[ChargeInput] = []
        seats: list[tuple[int, SeatKey]] = []  # a new seat's charge (its place) and key
        for subject, name, cost in event.charges:
            limit = self.limits.get(name)
            if limit is None or limit.algorithm == "concurrent":
                continue
            if self.subject is not None and subject != self.subject:
                continue
            value = None
            if limit.distinct is not None:
                try:
                    value = value_of(limit.distinct, name, event.metadata, 1)
                except InvalidInput:  # recorded before the limit counted seats
                    continue
            history = self.histories.get((name, subject))
            if history:
                limit = limit.with_maximum(maximum_at(history, limit.maximum, at_us))
            key = self._key(limit, subject, at_us)
            if value is not None:
                seat = (name, subject, key.window_start_us, value)
                cost = seat_cost(self.held, seat)
                if cost:
                    seats.append((len(inputs), seat))
            inputs.append(ChargeInput(limit, key, self.states.get(key, CounterState()), cost))
        if not inputs:
            return
        self.replayed += 1
        verdict = decide_event(inputs, at_us)
        if not verdict.denied_by:
            for at, seat in seats:
                if verdict.charges[at].outcome in TAKES_SEAT:
                    self.held[seat] = HELD
        for charge, decided, state in zip(inputs, verdict.charges, verdict.new_states, strict=True):
            self.states[charge.key] = state
            tally = self.tallies.get((decided.subject, decided.limit))
            if tally is None:
                tally = self.tallies[(decided.subject, decided.limit)] = _Tally()
            tally.events += 1
            if decided.limit in event.denied_then:
                tally.denied_events_then += 1
            if decided.outcome in NOT_FITTING:
                tally.would_deny_events += 1
                tally.would_deny_cost += decided.cost
            elif decided.outcome == "overage" and not verdict.denied_by:
                before = charge.state.used - charge.limit.maximum
                tally.overage += decided.overage - (before if before > 0 else 0)

    def _key(self, limit: Limit, subject: str, at_us: int) -> CounterKey:
        if limit.algorithm == "token_bucket":
            return CounterKey(limit.name, subject, NO_WINDOW, NO_WINDOW)
        if limit.window == "calendar":
            window = calendar_window(limit.parsed_period, at_us, self.zones.get(subject, ()))
            return CounterKey(limit.name, subject, *window)
        pair = (limit.name, subject)
        current = self.windows.get(pair)
        window = first_use_window(limit.parsed_period, at_us, current, None)
        self.windows[pair] = window
        return CounterKey(limit.name, subject, *window)

    def rows(self) -> list[SimulationRow]:
        """The figures, by subject then limit."""
        return [
            SimulationRow(
                subject,
                limit,
                t.events,
                t.would_deny_events,
                t.would_deny_cost,
                t.overage,
                t.denied_events_then,
            )
            for (subject, limit), t in sorted(self.tallies.items())
        ]
