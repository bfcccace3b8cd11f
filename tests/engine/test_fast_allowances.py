"""Recurring grants' issues, ``grant.low`` and subjects' own thresholds on the fast path.

The fast path (`metering.engine.fast`) decides these itself: the reference
engine is made to refuse (`_refuse_reference`), so a test passes only if no
batch was left to it. ``tests/engine/test_differential.py`` holds the
engines to the same results; here, what each feature stores, and that a
recurring grant's issue is made exactly once by processes racing.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import permutations

import pytest
from decision_paths import refusing
from lock_waits import WAIT_SECONDS, wait_until_blocked
from sqlalchemy import select, text

from metering import FrozenClock, Limit, Meter
from metering.domain.events import EventRecord
from metering.domain.needs import Need
from metering.domain.rules import Rule
from metering.engine.limit_cache import Allowances
from metering.storage.recurring import ScheduleRecord
from metering.storage.tables import counters, webhook_messages

NOV = datetime(2026, 11, 20, 12, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)
CALLS = Limit("calls", maximum=2, period="1mo", window="calendar", lateness="7d")


def _refuse_reference(meter: Meter) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the reference engine decided a batch")

    refusing(meter._engine, refuse, checks=False)


def _messages(meter: Meter, kind: str) -> list[dict[str, object]]:
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(
            select(webhook_messages.c.payload).where(webhook_messages.c.type == kind)
        )
        return sorted((json.loads(payload)["data"] for (payload,) in rows), key=json.dumps)


def _grants(meter: Meter) -> dict[str, tuple[int, int]]:
    return {g.grant_id: (g.amount, g.used) for g in meter.grants()}


def test_a_recurring_grants_issue_is_made_on_the_fast_path(db_url: str) -> None:
    clock = FrozenClock(NOV)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(CALLS)
        meter.grant("org", "calls", 5, every="1mo", rollover_max=2, grant_id="m", low=1)
        meter.consume("org", "calls", 2 + 3)  # 2 of the issue left: they roll over
        _refuse_reference(meter)
        clock.set(DEC + timedelta(hours=1))
        decision = meter.consume("org", "calls", 2 + 6)  # the new issue of 7 pays 6: 1 left
        assert (decision.outcome, decision.charges[0].grants) == ("allowed", (("m/2", 6),))
        assert _grants(meter) == {"m": (5, 3), "m/2": (7, 6)}
        [recurring] = meter.recurring_grants()
        assert recurring.last_issue == 2
        low = [(d["grant_id"], d["left"], d["low_at"]) for d in _messages(meter, "grant.low")]
        assert low == [("m/2", 1, 1)]


def test_no_pair_is_due_before_the_soonest_issue_and_each_is_once_it_is() -> None:
    a, b = ("calls", "a"), ("calls", "b")
    allowances = Allowances.of({}, frozenset(), {a: 100, b: 200}, {})
    assert allowances.due_pairs([a, b], 99) == []
    assert allowances.due_pairs([b, a], 150) == [a]
    schedule = ScheduleRecord(
        "m", "a", "calls", 5, "1mo", True, 0, 100, None, None, None, 2, 300, None, 0
    )
    allowances.learn_due([a], [(schedule, None)], 150)  # a's issue made: next at 300
    assert allowances.due_pairs([a, b], 199) == []
    assert allowances.due_pairs([a, b], 300) == [a, b]
    allowances.learn_due([a, b], [], 300)  # no schedule left
    assert (allowances.due, allowances.due_pairs([a, b], 10**9)) == ({}, [])


def test_a_stale_or_forgotten_soonest_bound_hides_no_due_pair() -> None:
    a = ("calls", "a")
    allowances = Allowances.of({}, frozenset(), {a: 100}, {})
    assert (allowances.due_pairs([a], 50), allowances.soonest.at_us) == ([], 100)
    allowances.soonest.at_us = 10  # an older, lower bound another thread wrote
    assert allowances.due_pairs([a], 50) == []
    allowances.soonest.at_us = None  # forgotten by another thread's `learn_due`
    assert allowances.due_pairs([a], 100) == [a]


def test_what_a_batchs_charges_need_counts_every_subjects_own() -> None:
    """`Allowances.charged` stops looking its subjects up once it has every
    need they have: what it finds is still each charge's, in any order."""
    a, b, c = ("calls", "a"), ("calls", "b"), ("calls", "c")
    allowances = Allowances.of({a: ((0, 5),)}, frozenset({b}), {b: 100}, {c: ((80,), ())})
    rules = {"calls": Rule.of(CALLS)}

    def records(*subjects: str) -> list[EventRecord]:
        return [
            EventRecord(f"e{n}", ((s, "calls", 1),), 0, None, "") for n, s in enumerate(subjects)
        ]

    own = {Need.ENTITLEMENTS, Need.GRANTS, Need.RECURRING, Need.OWN_THRESHOLDS}
    for order in permutations(["a", "b", "c", "z"]):
        assert allowances.charged(rules, records(*order)) == own
    assert allowances.charged(rules, records("z", "b", "z")) == {Need.GRANTS, Need.RECURRING}
    later = EventRecord("x", (("a", "calls", 1), ("a", "calls", 2)), 0, None, "")
    unknown = EventRecord("u", (("a", "nothing", 1),), 0, None, "")
    found = allowances.charged(rules, [*records("a", "b", "c"), later, unknown])
    assert found == own | {Need.REPEATED_COUNTER, Need.INVALID}
    unknown_every = replace(allowances, every=frozenset())  # (not known: each looked up)
    assert unknown_every.charged(rules, records("c", "a")) == {
        Need.ENTITLEMENTS,
        Need.OWN_THRESHOLDS,
    }


def test_grant_low_is_announced_once_by_the_fast_path(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOV)) as meter:
        meter.set_limit(CALLS)
        meter.grant("org", "calls", 10, grant_id="g", low="30%")
        _refuse_reference(meter)
        meter.consume("org", "calls", 2 + 6)  # 4 left: not yet low (3 or less)
        assert _messages(meter, "grant.low") == []
        meter.consume("org", "calls", 1)  # 3 left: low
        meter.consume("org", "calls", 1)  # 2 left: announced already
        [low] = _messages(meter, "grant.low")
        assert low == {
            "grant_id": "g",
            "subject": "org",
            "limit": "calls",
            "amount": 10,
            "used": 7,
            "left": 3,
            "low_at": 3,
            "recurring_grant_id": None,
        }


def test_a_subjects_own_thresholds_are_announced_by_the_fast_path(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOV)) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1mo", window="calendar"))
        meter.set_alert("org", "calls", ["50%", 3])
        _refuse_reference(meter)
        meter.consume("org", "calls", 2)
        meter.consume("other", "calls", 9)  # the limit has no thresholds: nothing
        meter.consume("org", "calls", 3)  # crosses 3 units and 50%
        found = [
            (d["subject"], d["threshold"], d.get("threshold_units"))
            for d in _messages(meter, "limit.threshold")
        ]
        assert sorted(found, key=str) == [("org", 50, None), ("org", None, 3)]


@pytest.mark.postgres
def test_a_grant_drawn_on_meanwhile_is_judged_low_on_what_is_stored(pg_url: str) -> None:
    """PostgreSQL reads grants without a lock: a draw decided while another
    transaction spends the same grant (another window's event) runs again,
    so that the grant it leaves low announces it."""
    with Meter(pg_url, clock=FrozenClock(NOV)) as meter:
        meter.set_limit(CALLS)
        meter.grant("org", "calls", 10, grant_id="g", low=3)
        meter.consume("org", "calls", 2 + 5)  # 5 left
        _refuse_reference(meter)
        with meter.sql_engine.connect() as other, meter.sql_engine.connect() as watcher:
            # Another transaction's draw of 1, still open: 4 left once it commits.
            other.execute(text("UPDATE grants SET used = used + 1 WHERE grant_id = 'g'"))
            blocker = other.execute(text("SELECT pg_backend_pid()")).scalar_one()
            consuming = threading.Thread(target=meter.consume, args=("org", "calls", 1))
            consuming.start()  # reads 5 left: 4 after its draw, not low
            wait_until_blocked(watcher, blocker, "the draw")
            other.commit()
            consuming.join(WAIT_SECONDS)
        assert not consuming.is_alive()
        assert _grants(meter) == {"g": (10, 7)}
        [low] = _messages(meter, "grant.low")
        assert (low["left"], low["used"]) == (3, 7)


@pytest.mark.postgres
def test_check_answers_a_subject_with_grants_on_the_fast_path(pg_url: str) -> None:
    with Meter(pg_url, clock=FrozenClock(NOV)) as meter:
        meter.set_limit(CALLS)
        meter.grant("org", "calls", 10, grant_id="g", low=3)
        meter.consume("org", "calls", 2 + 5)

        def refuse(*_args: object) -> None:
            raise AssertionError("the reference engine checked")

        refusing(meter._engine, refuse, applies=False)
        decision = meter.check("org", "calls", 4)
        assert (decision.outcome, decision.charges[0].grants) == ("allowed", (("g", 4),))
        assert meter.check("org", "calls", 6).denied_by == ("calls",)
        assert _grants(meter) == {"g": (10, 5)}  # nothing drawn


# -- exactly one issue per period, processes racing ---------------------------------

PROCESSES = 6
MONTHS = 8
EACH = 3  # events per process and month


def _month(number: int) -> datetime:
    """An hour into the ``number``-th month from December 2026."""
    months = 2026 * 12 + 11 + number
    return datetime(months // 12, 1 + months % 12, 1, 1, tzinfo=UTC)


def _race(url: str, worker: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    clock = FrozenClock(NOV)
    with Meter(url, clock=clock) as meter:
        _refuse_reference(meter)
        for month in range(MONTHS):
            clock.set(_month(month))
            barrier.wait(60)
            for n in range(EACH):
                meter.consume("org", "calls", 1, event_id=f"w{worker}-m{month}-{n}")


@pytest.mark.slow
def test_processes_racing_make_each_issue_exactly_once_on_the_fast_path(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOV)) as meter:
        meter.set_limit(CALLS)
        meter.grant("org", "calls", 10, every="1mo", grant_id="m", low=1)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(PROCESSES)
    procs = [context.Process(target=_race, args=(db_url, n, barrier)) for n in range(PROCESSES)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(300)
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES
    with Meter(db_url, clock=FrozenClock(_month(MONTHS - 1))) as meter:
        # November's issue, then one per month: each paid 10 of the 18 events
        # over the month's own 2.
        issues = {"m": (10, 0)} | {f"m/{n}": (10, 10) for n in range(2, MONTHS + 2)}
        assert _grants(meter) == issues
        [recurring] = meter.recurring_grants()
        assert recurring.last_issue == MONTHS + 1
        with meter.sql_engine.connect() as connection:
            drawn = connection.execute(select(counters.c.granted).where(counters.c.granted != 0))
            assert list(drawn.scalars()) == [10] * (len(issues) - 1)  # each month's window
        low = sorted(d["grant_id"] for d in _messages(meter, "grant.low"))
        assert low == sorted(g for g in issues if g != "m")
