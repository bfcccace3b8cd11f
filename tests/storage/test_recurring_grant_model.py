"""A model of recurring grants with rollover and priorities (issue 22, point 4).

Hypothesis draws random sequences of consume, check, one-off grant,
recurring grant (monthly, some with rollover, some ending) and clock
advances of a day to a few months, with a frozen clock. A plain-Python
model, written from docs/allowances.md and not from the code, predicts
every decision and every grant: issues at the first of each month (the
first at once), each with the base amount plus up to ``rollover_max`` of
what the last issue left when the new one is made; draws by priority (the
lowest first), then the earliest expiring, then the earliest given, then by
id. Issues are made when the subject's window is read (consume, check, the
grants' list): nothing runs between the steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from budgets import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite

from metering import FrozenClock, Limit, Meter
from metering.domain.instants import from_us, to_us

START = datetime(2026, 10, 20, 12, 0, tzinfo=UTC)
MAXIMUM = 4
LIMIT = Limit("calls", maximum=MAXIMUM, period="1mo", window="calendar")
SUBJECTS = ["s1", "s2"]
DAY = 86_400

consume = st.tuples(st.just("consume"), st.sampled_from(SUBJECTS), st.integers(1, 7), st.just(None))
recurring = st.tuples(
    st.just("recurring"),
    st.sampled_from(SUBJECTS),
    st.integers(1, 6),
    st.tuples(
        st.sampled_from([0, 2, 10, 10]),  # rollover_max
        st.sampled_from([50, 100, 150]),  # priority
        st.sampled_from([None, None, 40 * DAY, 100 * DAY]),  # until, from now
    ),
)
advance = st.tuples(
    st.just("advance"),
    st.sampled_from([DAY, 10 * DAY, 35 * DAY, 95 * DAY]),
    st.just(0),
    st.just(None),
)
operation = st.one_of(
    consume,
    consume,
    st.tuples(st.just("check"), st.sampled_from(SUBJECTS), st.integers(1, 7), st.just(None)),
    st.tuples(
        st.just("grant"),
        st.sampled_from(SUBJECTS),
        st.integers(1, 6),
        st.tuples(st.sampled_from([None, 5 * DAY, 45 * DAY]), st.sampled_from([50, 100, 150])),
    ),
    recurring,
    recurring,
    advance,
    advance,
)


def month_end(at_us: int) -> int:
    """The first instant of the calendar month after the one holding ``at_us``."""
    moment = from_us(at_us)
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return to_us(datetime(year, month, 1, tzinfo=UTC))


def month_start(at_us: int) -> int:
    moment = from_us(at_us)
    return to_us(datetime(moment.year, moment.month, 1, tzinfo=UTC))


@dataclass
class Grant:
    subject: str
    amount: int
    start: int
    expires: int | None
    priority: int
    used: int = 0

    def left(self) -> int:
        return self.amount - self.used


@dataclass
class Schedule:
    subject: str
    amount: int
    rollover_max: int
    priority: int
    until: int | None
    issues: list[str] = field(default_factory=list)


@dataclass
class Model:
    grants: dict[str, Grant] = field(default_factory=dict)
    schedules: dict[str, Schedule] = field(default_factory=dict)
    # (subject, month start) -> (usage, of it paid by grants)
    windows: dict[tuple[str, int], list[int]] = field(default_factory=dict)

    def issue(self, now: int) -> None:
        """Every schedule's issues whose periods have started by ``now``."""
        for sid, schedule in self.schedules.items():
            while True:
                last = self.grants[schedule.issues[-1]]
                assert last.expires is not None
                if last.expires > now or (
                    schedule.until is not None and last.expires >= schedule.until
                ):
                    break
                end = month_end(last.expires)
                if schedule.until is not None:
                    end = min(end, schedule.until)
                amount = schedule.amount + min(schedule.rollover_max, last.left())
                gid = f"{sid}/{len(schedule.issues) + 1}"
                self.grants[gid] = Grant(
                    schedule.subject, amount, last.expires, end, schedule.priority
                )
                schedule.issues.append(gid)

    def decide(self, subject: str, cost: int, at: int, *, record: bool) -> tuple[bool, list]:
        window = self.windows.setdefault((subject, month_start(at)), [0, 0])
        room = max(MAXIMUM - (window[0] - window[1]), 0)
        active = sorted(
            (g.priority, g.expires if g.expires is not None else math.inf, g.start, gid)
            for gid, g in self.grants.items()
            if g.subject == subject and g.start <= at and (g.expires is None or at < g.expires)
        )
        available = sum(self.grants[gid].left() for *_, gid in active)
        fits = cost <= room + available
        draws: list[tuple[str, int]] = []
        if fits:
            need = max(cost - room, 0)
            for *_, gid in active:
                take = min(self.grants[gid].left(), need)
                if take > 0:
                    draws.append((gid, take))
                    need -= take
            if record:
                for gid, take in draws:
                    self.grants[gid].used += take
                window[0] += cost
                window[1] += sum(take for _, take in draws)
        return fits, draws


def _run(url: str, operations: list[tuple[Any, ...]]) -> None:
    clock = FrozenClock(START)
    model = Model()
    with Meter(url, clock=clock) as meter:
        meter.set_limit(LIMIT)
        for step, (kind, subject, amount, extra) in enumerate(operations):
            now = to_us(clock())
            model.issue(now)  # whatever reads a window next makes the due issues
            if kind == "consume":
                fits, draws = model.decide(subject, amount, now, record=True)
                decision = meter.consume(subject, "calls", amount, event_id=f"e{step}")
                assert decision.allowed == fits
                assert list(decision.charges[0].grants) == draws
            elif kind == "check":
                fits, _ = model.decide(subject, amount, now, record=False)
                assert meter.check(subject, "calls", amount).allowed == fits
            elif kind == "grant":
                seconds, priority = extra
                expires = None if seconds is None else now + seconds * 1_000_000
                gid = f"g{step}"
                model.grants[gid] = Grant(subject, amount, now, expires, priority)
                meter.grant(
                    subject,
                    "calls",
                    amount,
                    None if expires is None else from_us(expires),
                    grant_id=gid,
                    priority=priority,
                )
            elif kind == "recurring":
                rollover, priority, until_in = extra
                until = None if until_in is None else now + until_in * 1_000_000
                sid = f"r{step}"
                end = month_end(now) if until is None else min(month_end(now), until)
                model.grants[sid] = Grant(subject, amount, now, end, priority)
                model.schedules[sid] = Schedule(subject, amount, rollover, priority, until, [sid])
                given = meter.grant(
                    subject,
                    "calls",
                    amount,
                    grant_id=sid,
                    every="1mo",
                    rollover_max=rollover,
                    priority=priority,
                    until=None if until is None else from_us(until),
                )
                assert (given.grant_id, given.amount, to_us(given.expires_at)) == (sid, amount, end)
            elif kind == "advance":
                clock.advance(seconds=subject)
            _compare(meter, model, to_us(clock()))


def _compare(meter: Meter, model: Model, now: int) -> None:
    model.issue(now)  # listing the grants reads every window
    stored = {
        g.grant_id: (g.amount, g.used, to_us(g.effective_from), g.expires_at, g.priority)
        for g in meter.grants()
    }
    expected = {
        gid: (g.amount, g.used, g.start, g.expires and from_us(g.expires), g.priority)
        for gid, g in model.grants.items()
    }
    assert stored == expected
    counters = {
        (c.subject, to_us(c.window_start)): c.used
        for c in meter.counters(limit="calls")
        if c.window_start is not None and c.used
    }
    assert counters == {key: w[0] for key, w in model.windows.items() if w[0]}
    assert all(g.used <= g.amount for g in model.grants.values())


SETTINGS = settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(operations=st.lists(operation, min_size=1, max_size=30))
def test_recurring_grants_on_sqlite_match_the_model(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path, operations: list
) -> None:
    directory = tmp_path_factory.mktemp("recurring")
    _run(copy_sqlite(sqlite_template, directory / "model.db"), operations)


@pytest.mark.postgres
@settings(SETTINGS, max_examples=examples(25))
@given(operations=st.lists(operation, min_size=1, max_size=30))
def test_recurring_grants_on_postgresql_match_the_model(
    postgres_server: PostgresServer, pg_template_url: str, operations: list
) -> None:
    with postgres_server.copy_of(pg_template_url, "recurring") as url:
        _run(url, operations)
