"""A model of seats (``Limit(distinct=KEY)``) against random streams.

Hypothesis draws random sequences of consume (a subject, a user, a hard or
a soft seat limit, some events late into the previous window), void (some
twice, some of denied events), entitlement change, reset and clock moves.
A plain-Python model, written from the rules of docs/seats.md and not from
the code, keeps per window the live events of each value and predicts
every decision and its cost (1 for a new value, 0 for a held one); after
every step the stored counters (seats used) and the stored values must
equal the model's:

* a window's ``used`` is the number of values with a live event (allowed,
  not voided, not cleared by a reset);
* a hard window never holds more seats than the maximum in force when the
  last seat was taken; a held value is allowed whatever the maximum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from budgets import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.distinct import HELD
from metering.domain.instants import to_us
from metering.errors import CorrectionRefused
from metering.storage.tables import distinct_values

START = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
HOUR_US = 3600 * 1_000_000
DEFAULT = 2
LIMITS = {
    name: Limit(
        name,
        maximum=DEFAULT,
        period="1h",
        window="calendar",
        lateness="2h",
        enforcement=enforcement,
        distinct="user",
    )
    for name, enforcement in (("seats", "hard"), ("soft_seats", "soft"))
}
SUBJECTS = ["s1", "s2"]
USERS = ["u1", "u2", "u3"]

consume = st.tuples(
    st.just("consume"),
    st.sampled_from(SUBJECTS),
    st.tuples(st.sampled_from(USERS), st.sampled_from(sorted(LIMITS))),
    st.sampled_from([0, 0, 0, -1800, -4000]),
)
void = st.tuples(st.just("void"), st.integers(0, 50), st.just(None), st.just(0))
operation = st.one_of(
    consume,
    consume,
    consume,
    void,
    void,
    st.tuples(
        st.just("entitle"),
        st.sampled_from(SUBJECTS),
        st.one_of(st.none(), st.integers(1, 4)),
        st.sampled_from([0, -900]),
    ),
    st.tuples(st.just("reset"), st.sampled_from(SUBJECTS), st.just(None), st.just(0)),
    st.tuples(st.just("advance"), st.sampled_from([60, 900, 2000]), st.just(None), st.just(0)),
)
Window = tuple[str, str, int]  # limit, subject, start


@dataclass
class Event:
    event_id: str
    allowed: bool
    window: Window
    user: str
    # Resets and decisions at one instant are ordered by step, as the engine orders them.
    step: int


@dataclass
class Model:
    live: dict[Window, dict[str, int]] = field(default_factory=dict)
    history: dict[str, dict[int, int | None]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    voided: set[str] = field(default_factory=set)
    # Each reset of a counter: (limit, subject, time, step).
    resets: list[tuple[str, str, int, int]] = field(default_factory=list)

    def maximum(self, subject: str, at: int) -> int:
        changes = sorted((s, m) for s, m in self.history.get(subject, {}).items() if s <= at)
        found = changes[-1][1] if changes else None
        return DEFAULT if found is None else found

    def seats(self, window: Window) -> int:
        return sum(1 for count in self.live.get(window, {}).values() if count > 0)

    def consume(self, event_id: str, subject: str, user: str, limit: str, at: int, step: int):
        start = at - (at - to_us(datetime(1970, 1, 5, tzinfo=UTC))) % HOUR_US
        window = (limit, subject, start)
        values = self.live.setdefault(window, {})
        new = values.get(user, 0) == 0
        soft = LIMITS[limit].enforcement == "soft"
        allowed = not new or soft or self.seats(window) + 1 <= self.maximum(subject, at)
        if allowed:
            values[user] = values.get(user, 0) + 1
        self.events.append(Event(event_id, allowed, window, user, step))
        return allowed, 1 if new else 0

    def void(self, index: int) -> str | None:
        """None: voided now; else the event id (denied: refused; voided before: a duplicate)."""
        event = self.events[index]
        if not event.allowed or event.event_id in self.voided:
            return event.event_id
        self.voided.add(event.event_id)
        limit, subject, start = event.window
        if any(
            (name, owner) == (limit, subject) and event.step < step and at < start + HOUR_US
            for name, owner, at, step in self.resets
        ):
            return None  # the reset cleared its window after it: nothing to give back
        values = self.live[event.window]
        values[event.user] = max(values.get(event.user, 0) - 1, 0)
        return None

    def reset(self, subject: str, now: int, step: int) -> None:
        """Deletes the subject's current counters, and records each."""
        for window in list(self.live):
            limit, owner, start = window
            if owner == subject and start + HOUR_US > now:
                del self.live[window]
                self.resets.append((limit, subject, now, step))


def _run(url: str, operations: list[tuple[Any, ...]]) -> None:
    clock = FrozenClock(START)
    model = Model()
    with Meter(url, clock=clock) as meter:
        meter.set_limits(LIMITS.values())
        for step, (kind, a, b, c) in enumerate(operations):
            now = to_us(clock())
            if kind == "consume":
                user, limit = b
                at = clock() + timedelta(seconds=c)
                event_id = f"e{step}"
                allowed, cost = model.consume(event_id, a, user, limit, to_us(at), step)
                decision = meter.consume(
                    a, limit, event_id=event_id, occurred_at=at, metadata={"user": user}
                )
                assert (decision.allowed, decision.charges[0].cost) == (allowed, cost)
            elif kind == "void" and model.events:
                index = a % len(model.events)
                refused = model.void(index)
                event = model.events[index]
                if refused is not None and not event.allowed:
                    with pytest.raises(CorrectionRefused):
                        meter.void(event.event_id, "model")
                else:
                    assert meter.void(event.event_id, "model").duplicate == (refused is not None)
            elif kind == "entitle":
                at = clock() + timedelta(seconds=c)
                model.history.setdefault(a, {})[to_us(at)] = b
                for limit in LIMITS:
                    meter.set_entitlement(a, limit, b, effective_from=at)
            elif kind == "reset":
                model.reset(a, now, step)
                meter.reset(subject=a)
            elif kind == "advance":
                clock.advance(seconds=a)
            _compare(meter, model)


def _compare(meter: Meter, model: Model) -> None:
    stored = {
        (c.limit, c.subject, to_us(c.window_start)): c.used
        for c in meter.counters()
        if c.window_start is not None and c.used
    }
    expected = {window: model.seats(window) for window in model.live if model.seats(window)}
    assert stored == expected
    with meter.sql_engine.connect() as connection:
        d = distinct_values.c
        rows = connection.execute(
            select(d.limit_name, d.subject, d.window_start_us, d.value, d.live_events)
        )
        values = {(n, s, w, v): live for n, s, w, v, live in rows if live}
    assert values == {  # a value's row is HELD while it has a live event
        (*window, user): HELD
        for window, users in model.live.items()
        for user, live in users.items()
        if live
    }


SETTINGS = settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# A reset, then at the same instant a seat taken and voided: the void gives
# the seat back (the reset came first), as the engine's reset clock says.
RESET_THEN_VOID = [
    ("consume", "s2", ("u1", "soft_seats"), 0),
    ("reset", "s2", None, 0),
    ("consume", "s2", ("u1", "soft_seats"), 0),
    ("void", 1, None, 0),
]


@SETTINGS
@example(operations=RESET_THEN_VOID)
@given(operations=st.lists(operation, min_size=1, max_size=40))
def test_sqlite_seats_match_the_model(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path, operations: list
) -> None:
    directory = tmp_path_factory.mktemp("seats")
    _run(copy_sqlite(sqlite_template, directory / "seats.db"), operations)


@pytest.mark.postgres
@settings(SETTINGS, max_examples=examples(25))
@example(operations=RESET_THEN_VOID)
@given(operations=st.lists(operation, min_size=1, max_size=40))
def test_postgresql_seats_match_the_model(
    postgres_server: PostgresServer, pg_template_url: str, operations: list
) -> None:
    with postgres_server.copy_of(pg_template_url, "seats") as url:
        _run(url, operations)
