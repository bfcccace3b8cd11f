"""The speculative round trip (`metering.storage.hot.speculative`) against
another writer of the same rows, on PostgreSQL.

Two meters share a database: ``a`` consumes (its fast path decides on the
rows it cached), ``b`` changes the same counters, grants and seat values in
between (another consume, a reset, a void), so ``a``'s rows are stale when
it speculates next. Every answer and every stored table must be the
reference engine's, run alone on a database of its own with the same
calls. Then two meters, two threads each, consume the same subjects of a
hard limit: allowed events never pass the maximum, and each counter holds
exactly what its allowed events charged. Both fail when the speculative
write does not check the rows it decided on.
"""

from __future__ import annotations

import logging
import random
import selectors
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from budgets import examples
from differential import SETTINGS, answer, databases, stored
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.engine import fast
from metering.storage.hot.speculative import SPECULATION, SpeculativeStore
from metering.storage.tables import counters, results

# `meters` takes its PostgreSQL databases at run time (request.getfixturevalue),
# where conftest.py's marking by fixture does not see them: without this, the
# module ran in `make test-fast` and started a PostgreSQL there.
pytestmark = pytest.mark.postgres

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
LIMITS = [
    Limit("calls", maximum=6, period="1h", window="calendar"),
    spend_limit("spend", "5", "USD", "1h", window="calendar"),
    Limit("fu", maximum=5, period="30m"),
    Limit("seats", maximum=2, period="1h", window="calendar", distinct="user"),
]
# What an event charges (each with ``calls``, priced); ``a`` and ``b`` do not
# take the one-trip function's path, which would decide them all.
EXTRA: dict[str, list[tuple[str, int]]] = {"calls": [], "fu": [("fu", 1)], "seats": [("seats", 1)]}
SUBJECTS = ("s1", "s2")


def set_up(meter: Meter) -> None:
    meter.set_limits(LIMITS)
    meter.set_price("calls", "1", "USD")
    meter.grant("s2", "calls", 2, grant_id="g-s2")


def oracle(meter: Meter) -> Meter:
    """``meter`` deciding by the reference engine alone."""
    engine = meter._engine
    engine.paths = [engine.path("reference")]
    if engine.direct is not None:
        engine.direct.close()
        engine.direct = None
    return meter


@contextmanager
def meters(request: pytest.FixtureRequest) -> Iterator[tuple[Meter, Meter, Meter]]:
    """``a`` and ``b`` on one database, the oracle on another."""
    clock = FrozenClock(NOW)
    with databases(request, "postgresql", 2) as (shared, alone), ExitStack() as stack:
        a = stack.enter_context(Meter(shared, clock=clock, group_commit=False))
        b = stack.enter_context(Meter(shared, clock=clock, group_commit=False))
        for meter in (a, b):
            engine = meter._engine
            engine.paths = [path for path in engine.paths if path.name != "one_trip"]
        reference = oracle(stack.enter_context(Meter(alone, clock=clock)))
        set_up(a)
        set_up(reference)
        yield a, b, reference


Step = tuple[str, ...]


def run(step: Step, a: Meter, b: Meter, reference: Meter, n: int) -> None:
    """One step on the shared database and on the oracle's: the same answer."""
    verb = step[0]
    if verb in ("a", "b"):
        _, subject, extra = step
        charges = [(subject, "calls", 1), *((subject, name, c) for name, c in EXTRA[extra])]
        metadata = {"user": f"u{n % 3}"}
        event_id = f"e{n}"

        def call(meter: Meter) -> Any:
            return answer(
                lambda: meter.consume(charges=charges, event_id=event_id, metadata=metadata)
            )

        found = call(a if verb == "a" else b)
        assert found == call(reference), step
    elif verb == "reset":
        _, subject, limit = step
        assert b.reset(subject, limit) == reference.reset(subject, limit)
    else:  # void an earlier event, if it was allowed
        _, event_id = step

        def void(meter: Meter) -> Any:
            found = answer(lambda: meter.void(event_id, "test", correction_id=f"c-{event_id}"))
            return found if isinstance(found, tuple) else found.charges

        assert void(b) == void(reference)


def scenario(writer: str) -> list[Step]:
    """``a`` consumes twice (its rows cached), then ``writer`` changes them
    between each of ``a``'s next consumes, until the limits deny."""
    steps: list[Step] = []
    for subject in SUBJECTS:
        for extra in EXTRA:
            steps += [("a", subject, extra), ("a", subject, extra)]
            for _ in range(3):
                if writer == "consume":
                    steps.append(("b", subject, extra))
                elif writer == "reset":
                    steps.append(("reset", subject, "calls"))
                else:
                    steps.append(("void", f"e{len(steps) - 1}"))
                steps.append(("a", subject, extra))
    return steps


@pytest.mark.parametrize("writer", ["consume", "reset", "void"])
def test_a_write_between_the_cached_read_and_the_speculation(
    request: pytest.FixtureRequest, writer: str
) -> None:
    before = SPECULATION.copy()
    with meters(request) as (a, b, reference):
        for n, step in enumerate(scenario(writer)):
            run(step, a, b, reference, n)
        assert stored(a) == stored(reference)
    done = SPECULATION - before
    # The checks were put to work: some speculation found its rows changed by
    # the other meter. (How many hit first depends on the threads' timing and
    # the gate; the sequential tests above make hits happen on purpose.)
    assert done["mismatch"] > 0, done


STEPS = st.one_of(
    st.tuples(
        st.sampled_from(["a", "a", "b"]), st.sampled_from(SUBJECTS), st.sampled_from(sorted(EXTRA))
    ),
    st.tuples(st.just("reset"), st.sampled_from(SUBJECTS), st.sampled_from(["calls", "spend"])),
    st.tuples(st.just("void"), st.sampled_from([f"e{n}" for n in range(30)])),
)


@settings(SETTINGS, max_examples=examples(25))
@given(steps=st.lists(STEPS, min_size=5, max_size=30))
def test_a_stream_with_another_writer_decides_as_the_reference(
    request: pytest.FixtureRequest, steps: list[Step]
) -> None:
    with meters(request) as (a, b, reference):
        for n, step in enumerate(steps):
            run(step, a, b, reference, n)
        assert stored(a) == stored(reference)


@pytest.mark.parametrize("seed", [1, 2])
def test_two_speculating_meters_never_pass_a_hard_limit(pg_url: str, seed: int) -> None:
    maximum = 25
    with Meter(pg_url, group_commit=False) as a, Meter(pg_url, group_commit=False) as b:
        for meter in (a, b):  # (the one-trip function would decide them all)
            engine = meter._engine
            engine.paths = [path for path in engine.paths if path.name != "one_trip"]
        a.set_limits([Limit("calls", maximum=maximum, period="1h", window="calendar"), LIMITS[1]])
        a.set_price("calls", "0.01", "USD")
        before = SPECULATION.copy()
        errors: list[BaseException] = []

        def hammer(meter: Meter, rng: random.Random) -> None:
            try:
                for _ in range(45):
                    meter.consume(rng.choice(["x", "y"]), "calls")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=hammer, args=(meter, random.Random(seed * 10 + n)))
            for n, meter in enumerate((a, b, a, b))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        with a.sql_engine.connect() as connection:
            query = select(counters.c.subject, counters.c.used).where(
                counters.c.limit_name == "calls"
            )
            used = dict(connection.execute(query).all())
        done = SPECULATION - before
    assert used == _allowed_by_subject(pg_url)
    assert all(n <= maximum for n in used.values()), used
    assert sum(used.values()) == 2 * maximum  # 180 calls on two subjects: both full
    # The checks were put to work: some speculation found its rows changed by
    # the other meter. (How many hit first depends on the threads' timing and
    # the gate; the sequential tests above make hits happen on purpose.)
    assert done["mismatch"] > 0, done


def _allowed_by_subject(url: str) -> dict[str, int]:
    with Meter(url) as meter:
        found: Counter[str] = Counter()
        with meter.sql_engine.connect() as connection:
            for (event_id,) in connection.execute(
                select(results.c.event_id).where(results.c.outcome == "allowed")
            ):
                decision = meter.result(event_id)
                assert decision is not None
                for charge in decision.charges:
                    if charge.limit == "calls":
                        found[charge.subject] += charge.cost
        return dict(found)


def test_a_repeated_id_is_answered_as_stored_and_writes_nothing(
    request: pytest.FixtureRequest,
) -> None:
    """Its speculation writes the counters before the results insert fails:
    the whole pipeline rolls back, and the read that follows finds the id."""
    before = SPECULATION.copy()
    with meters(request) as (a, _, reference):
        for meter in (a, reference):
            for event_id in ("first", "second", "first", "third", "second"):
                meter.consume("s1", "calls", event_id=event_id)
        assert [a.result(e) for e in ("first", "second", "third")] == [
            reference.result(e) for e in ("first", "second", "third")
        ]
        assert stored(a) == stored(reference)
    done = SPECULATION - before
    # The checks were put to work: some speculation found its rows changed by
    # the other meter. (How many hit first depends on the threads' timing and
    # the gate; the sequential tests above make hits happen on purpose.)
    assert done["mismatch"] > 0, done


def test_a_failed_speculation_logs_no_warning(
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check that aborts the pipeline is the answer, not noise for the
    logs. The checks' answer is made to arrive before the writes are sent
    (as on a busy machine), so the pipeline meets the error inside its block."""
    send = SpeculativeStore.send_expectations

    def answered_first(store: SpeculativeStore) -> None:
        send(store)
        store.raw.pgconn.send_flush_request()
        store.raw.pgconn.flush()
        with selectors.DefaultSelector() as selector:  # until the answer is there
            selector.register(store.raw.fileno(), selectors.EVENT_READ)
            selector.select(10)

    with meters(request) as (a, b, _):
        a.consume("s1", "calls")  # its rows cached
        b.consume("s1", "calls")  # and now stale
        # Only now: a miss sends no checks, and nothing would answer the wait.
        monkeypatch.setattr(SpeculativeStore, "send_expectations", answered_first)
        before = SPECULATION.copy()
        with caplog.at_level(logging.WARNING):
            a.consume("s1", "calls")
        assert (SPECULATION - before)["mismatch"] == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_an_event_whose_rows_are_not_cached_is_planned_once(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A miss reads the rows there and then, locked, and decides on them."""
    planned: list[int] = []
    plan = fast._Applying.plan

    def counted(applying: Any) -> None:
        planned.append(len(applying.batch.records))
        plan(applying)

    monkeypatch.setattr(fast._Applying, "plan", counted)
    with meters(request) as (a, _, _):
        before = SPECULATION.copy()
        planned.clear()
        first = a.consume("s1", "calls")  # nothing cached yet
        assert ((SPECULATION - before)["miss"], len(planned)) == (1, 1)
        second = a.consume("s1", "calls")  # cached: a hit
        assert ((SPECULATION - before)["hit"], len(planned)) == (1, 2)
    assert [first.allowed, second.allowed] == [True, True]
