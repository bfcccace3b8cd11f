"""A model of a hard limit with entitlements, grants, corrections and resets.

Hypothesis draws random sequences of consume (some late, into the previous
window), grant, void (some twice, some of denied events), entitlement
change (some effective in the past) and reset, with a frozen clock that
moves. A plain-Python model, written from the rules in the README and not
from the code, predicts every decision; after every step the stored
counters and grants must equal the model's, and:

* every window's counter equals the allowed charges in the ledger less the
  voided ones (windows never reset); a void of an event whose window a
  reset cleared after it gives nothing back;
* no allowed charge takes its window's own usage (``used`` less what grants
  paid) above the subject's maximum at the event's time, and no grant pays
  more than its amount.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from budgets import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.instants import to_us
from metering.errors import CorrectionRefused
from metering.storage.tables import results

START = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
HOUR_US = 3600 * 1_000_000
DEFAULT = 4
LIMIT = Limit("calls", maximum=DEFAULT, period="1h", window="calendar", lateness="2h")
SUBJECTS = ["s1", "s2"]

consume = st.tuples(
    st.just("consume"),
    st.sampled_from(SUBJECTS),
    st.integers(1, 4),
    st.sampled_from([0, 0, -1800, -4000]),
)
operation = st.one_of(
    consume,
    consume,
    consume,
    st.tuples(
        st.just("grant"),
        st.sampled_from(SUBJECTS),
        st.integers(1, 8),
        st.sampled_from([None, 600, 3000]),
    ),
    st.tuples(st.just("void"), st.integers(0, 50), st.just(0), st.just(0)),
    st.tuples(
        st.just("entitle"),
        st.sampled_from(SUBJECTS),
        st.one_of(st.none(), st.integers(1, 8)),
        st.sampled_from([0, -900]),
    ),
    st.tuples(st.just("reset"), st.sampled_from(SUBJECTS), st.just(0), st.just(0)),
    st.tuples(st.just("advance"), st.sampled_from([60, 900, 2000]), st.just(0), st.just(0)),
)


@dataclass
class Grant:
    subject: str
    amount: int
    start: int
    expires: int | None
    used: int = 0


@dataclass
class Window:
    used: int = 0
    draws: dict[str, int] = field(default_factory=dict)
    reset: bool = False
    stored: bool = True  # its counter exists (a reset deletes it, a consume makes it)


@dataclass
class Model:
    windows: dict[tuple[str, int], Window] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)
    history: dict[str, dict[int, int | None]] = field(default_factory=dict)
    events: list[tuple[str, bool, str, int, int, list[tuple[str, int]]]] = field(
        default_factory=list
    )
    voided: set[str] = field(default_factory=set)
    # The step at which each event was decided, and each counter a reset
    # cleared (subject, window start, step): a void of an event whose counter
    # a later step cleared gives nothing back (the counter started over
    # without it). Steps, not clocks, order them: the clock is frozen, and a
    # reset in the very microsecond of a decision may come before or after it.
    decided: dict[str, int] = field(default_factory=dict)
    resets: list[tuple[str, int, int]] = field(default_factory=list)

    def maximum(self, subject: str, at: int) -> int:
        changes = sorted((s, m) for s, m in self.history.get(subject, {}).items() if s <= at)
        found = changes[-1][1] if changes else None
        return DEFAULT if found is None else found

    def consume(self, event_id: str, subject: str, cost: int, at: int) -> tuple[bool, int, list]:
        start = at - (at - to_us(datetime(1970, 1, 5, tzinfo=UTC))) % HOUR_US
        window = self.windows.setdefault((subject, start), Window())
        window.stored = True
        maximum = self.maximum(subject, at)
        own = window.used - sum(window.draws.values())
        room = max(maximum - own, 0)
        active = sorted(
            (g.expires if g.expires is not None else math.inf, g.start, gid)
            for gid, g in self.grants.items()
            if g.subject == subject and g.start <= at and (g.expires is None or at < g.expires)
        )
        available = sum(self.grants[gid].amount - self.grants[gid].used for *_, gid in active)
        # Grants add room over the maximum, never over own usage already past it.
        fits = own <= maximum and cost <= room + available
        draws: list[tuple[str, int]] = []
        if fits:
            need = max(cost - room, 0)
            for *_, gid in active:
                grant = self.grants[gid]
                take = min(grant.amount - grant.used, need)
                if take > 0:
                    draws.append((gid, take))
                    grant.used += take
                    window.draws[gid] = window.draws.get(gid, 0) + take
                    need -= take
            window.used += cost
            assert window.used - sum(window.draws.values()) <= maximum
        self.events.append((event_id, fits, subject, start, cost, draws))
        return fits, maximum, draws

    def void(self, index: int, now: int) -> str | None:
        event_id, allowed, subject, start, cost, draws = self.events[index]
        if not allowed or event_id in self.voided:
            return event_id
        self.voided.add(event_id)
        decided = self.decided[event_id]
        if (subject, start) in {(o, s) for o, s, step in self.resets if step > decided}:
            # Its counter no longer adds up to the ledger's charges less voids.
            self.windows[(subject, start)].reset = True
            return None
        window = self.windows[(subject, start)]
        window.used -= min(cost, window.used)
        for gid, amount in draws:
            window.draws[gid] = max(window.draws.get(gid, 0) - amount, 0)
            grant = self.grants[gid]
            if grant.expires is None or now < grant.expires:
                grant.used -= amount
        return None

    def reset(self, subject: str, now: int, step: int) -> None:
        """Clears the subject's current counter; recorded only if there was one."""
        for (owner, start), window in self.windows.items():
            if owner == subject and start + HOUR_US > now and window.stored:
                window.used, window.draws, window.reset, window.stored = 0, {}, True, False
                self.resets.append((subject, start, step))


def _run(url: str, operations: list[tuple[Any, ...]]) -> None:
    clock = FrozenClock(START)
    model = Model()
    with Meter(url, clock=clock) as meter:
        meter.set_limit(LIMIT)
        for step, (kind, a, b, c) in enumerate(operations):
            now = to_us(clock())
            if kind == "consume":
                at = clock() + timedelta(seconds=c)
                event_id = f"e{step}"
                allowed, maximum, draws = model.consume(event_id, a, b, to_us(at))
                model.decided[event_id] = step
                decision = meter.consume(a, "calls", b, event_id=event_id, occurred_at=at)
                charge = decision.charges[0]
                assert (decision.allowed, charge.maximum) == (allowed, maximum)
                assert list(charge.grants) == draws
            elif kind == "grant":
                gid = f"g{step}"
                expires = None if c is None else clock() + timedelta(seconds=c)
                model.grants[gid] = Grant(a, b, now, None if expires is None else to_us(expires))
                meter.grant(a, "calls", b, expires, grant_id=gid)
            elif kind == "void" and model.events:
                index = a % len(model.events)
                refused = model.void(index, now)
                event_id = model.events[index][0]
                if refused is not None and not model.events[index][1]:
                    with pytest.raises(CorrectionRefused):
                        meter.void(event_id, "model")
                else:
                    assert meter.void(event_id, "model").duplicate == (refused is not None)
            elif kind == "entitle":
                at = clock() + timedelta(seconds=c)
                model.history.setdefault(a, {})[to_us(at)] = b
                meter.set_entitlement(a, "calls", b, effective_from=at)
            elif kind == "reset":
                model.reset(a, now, step)
                meter.reset(subject=a)
            elif kind == "advance":
                clock.advance(seconds=a)
            _compare(meter, model)


def _compare(meter: Meter, model: Model) -> None:
    stored = {
        (c.subject, to_us(c.window_start)): c.used
        for c in meter.counters(limit="calls")
        if c.window_start is not None and c.used
    }
    expected = {key: w.used for key, w in model.windows.items() if w.used}
    assert stored == expected
    grants = {g.grant_id: (g.used, g.amount) for g in meter.grants()}
    assert grants == {gid: (g.used, g.amount) for gid, g in model.grants.items()}
    assert all(used <= amount for used, amount in grants.values())
    # The ledger's own account: allowed charges less voided ones, per window.
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(select(results.c.event_id, results.c.outcome, results.c.charges))
        ledger: dict[tuple[str, int], int] = {}
        for event_id, outcome, charges in rows:
            if outcome != "allowed" or event_id in model.voided:
                continue
            row = json.loads(charges)[0]
            ledger[(row[0], row[9])] = ledger.get((row[0], row[9]), 0) + row[2]
    for key, window in model.windows.items():
        if not window.reset:
            assert stored.get(key, 0) == ledger.get(key, 0)


SETTINGS = settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(operations=st.lists(operation, min_size=1, max_size=40))
def test_sqlite_matches_the_model(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path, operations: list
) -> None:
    directory = tmp_path_factory.mktemp("model")
    _run(copy_sqlite(sqlite_template, directory / "model.db"), operations)


@pytest.mark.postgres
@settings(SETTINGS, max_examples=examples(15))
@given(operations=st.lists(operation, min_size=1, max_size=40))
def test_postgresql_matches_the_model(
    postgres_server: PostgresServer, pg_template_url: str, operations: list
) -> None:
    with postgres_server.copy_of(pg_template_url, "model") as url:
        _run(url, operations)
