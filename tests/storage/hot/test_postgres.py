"""The PostgreSQL hot path writes a batch's rows through the tuple ids its
locks returned: a row updated while its lock waited is written in its new
version (the lock returns the id of the version it locked). A batch's ids
sent ahead of its read are what the read finds; its decisions are made
while its write is on its way, equal to those made when read."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from lock_waits import WAIT_SECONDS, wait_until_blocked
from sqlalchemy import select, text

from metering import FrozenClock, Limit, Meter, make_event
from metering.domain.instants import to_us
from metering.errors import EventConflict
from metering.storage.hot.postgres import FEW_ROWS, PostgresHotStore
from metering.storage.tables import current_windows
from metering.usage.results import Decisions

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
SUBJECTS = [f"org-{n:02}" for n in range(FEW_ROWS + 4)]  # past the few rows' statements

pytestmark = pytest.mark.postgres


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(pg_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limit(Limit("calls", maximum=1000, period="1d", window="calendar"))
        meter.set_limit(Limit("trial", maximum=1000, period="1h", window="first_use"))
        yield meter


def _batch_behind(meter: Meter, clock: FrozenClock, limit: str, update: str) -> None:
    """A batch of one event per subject, applied while ``update`` of org-00's
    rows is open, then committed."""
    events = [make_event([(s, limit, 1)], clock(), event_id=f"b-{s}") for s in SUBJECTS]
    with meter.sql_engine.connect() as other, meter.sql_engine.connect() as watcher:
        other.execute(text(update + " WHERE subject = 'org-00'"))
        blocker = other.execute(text("SELECT pg_backend_pid()")).scalar_one()
        applying = threading.Thread(target=meter.apply, args=(events,))
        applying.start()
        wait_until_blocked(watcher, blocker, "the batch")
        other.commit()
        applying.join(WAIT_SECONDS)
    assert not applying.is_alive()


@pytest.mark.parametrize("limit", ["calls", "trial"])
def test_a_batch_that_waited_for_a_counter_update_writes_its_new_version(
    meter: Meter, clock: FrozenClock, limit: str
) -> None:
    meter.apply([make_event([(s, limit, 3)], clock(), event_id=f"a-{s}") for s in SUBJECTS])
    _batch_behind(meter, clock, limit, "UPDATE counters SET used = used + 1")
    used = {s: [c.used for c in meter.counters(s, limit)] for s in SUBJECTS}
    assert used == {s: [5 if s == "org-00" else 4] for s in SUBJECTS}


def test_a_batch_that_waited_for_a_window_update_moves_its_new_version(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.apply([make_event([(s, "trial", 3)], clock(), event_id=f"a-{s}") for s in SUBJECTS])
    clock.advance(hours=2)  # every first-use window has ended: the batch opens new ones
    _batch_behind(meter, clock, "trial", "UPDATE current_windows SET limit_name = limit_name")
    used = {s: [c.used for c in meter.counters(s, "trial")] for s in SUBJECTS}
    assert used == {s: [3, 1] for s in SUBJECTS}
    with meter.sql_engine.connect() as connection:
        windows = connection.execute(
            select(current_windows.c.subject, current_windows.c.window_start_us)
        )
        starts = {subject: start for subject, start in windows}
    assert starts == dict.fromkeys(SUBJECTS, to_us(clock()))


def test_ids_sent_ahead_of_the_read_are_those_it_finds(
    meter: Meter, clock: FrozenClock, pg_url: str
) -> None:
    meter.apply([make_event([(s, "calls", 1)], clock(), event_id=f"a-{s}") for s in SUBJECTS[:3]])
    ids = ["a-org-02", "new", "a-org-00"]
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as raw:
        store = PostgresHotStore(raw)
        with store.looking_up(ids):
            snapshot = store.read(ids, [], [], to_us(clock()))
        assert raw.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        raw.execute("ROLLBACK")
    assert snapshot.version >= 0
    assert sorted(snapshot.stored) == ["a-org-00", "a-org-02"]
    assert snapshot.stored["a-org-02"].outcome == "allowed"


def test_a_batch_s_decisions_are_made_while_it_is_written(meter: Meter, clock: FrozenClock) -> None:
    events = [make_event([(s, "calls", 1)], clock(), event_id=f"m-{s}") for s in SUBJECTS]
    meter.apply(events[:2])
    events += [events[0], make_event([("org-03", "trial", 1)], clock(), event_id="m-org-03")]
    decided = meter.apply(events)
    assert decided._made is not None  # every one made before any is read
    again = Decisions([e.event_id for e in events], decided._answers)
    plain = [d.event_id if isinstance(d, EventConflict) else d for d in decided]
    assert plain == [d.event_id if isinstance(d, EventConflict) else d for d in again]
    assert [getattr(d, "duplicate", None) for d in decided[:3]] == [True, True, False]
    assert isinstance(decided[-1], EventConflict) and getattr(decided[-2], "duplicate", None)
