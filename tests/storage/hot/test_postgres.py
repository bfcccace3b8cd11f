"""The PostgreSQL hot path writes a batch's rows through the tuple ids its
locks returned: a row updated while its lock waited is written in its new
version (the lock returns the id of the version it locked). A batch's ids
sent ahead of its read are what the read finds; its decisions are made
while its write is on its way, equal to those made when read. Its results
are sent as they are decided, written once, and rolled back with the
batch: by a repeated id another transaction wrote meanwhile, or a decline."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from lock_waits import WAIT_SECONDS, wait_until_blocked
from sqlalchemy import select, text

from metering import FrozenClock, Limit, Meter, make_event
from metering.domain.instants import to_us
from metering.engine import fast
from metering.errors import EventConflict, UnknownLimit
from metering.storage.hot import ReadRequest
from metering.storage.hot.postgres import FEW_ROWS, PostgresHotStore
from metering.storage.results import ResultRecord
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
            snapshot = store.read(ReadRequest(ids, [], []))
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


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many results each send of `PostgresHotStore.sending` sent, three at a time."""
    monkeypatch.setattr(fast, "SEND_EVERY", 3)
    chunks: list[int] = []
    sending = PostgresHotStore.sending

    @contextmanager
    def counted(store: PostgresHotStore) -> Iterator[Any]:
        with sending(store) as send:
            assert send is not None
            yield lambda records: (chunks.append(len(records)), send(records))

    monkeypatch.setattr(PostgresHotStore, "sending", counted)
    return chunks


def _used(meter: Meter) -> dict[str, list[int]]:
    return {s: [c.used for c in meter.counters(s, "calls")] for s in SUBJECTS}


def test_results_sent_while_a_batch_is_decided_are_written_once(
    meter: Meter, clock: FrozenClock, sent: list[int]
) -> None:
    meter.apply([make_event([(s, "calls", 1)], clock(), event_id=f"a-{s}") for s in SUBJECTS])
    assert sent == []  # a batch that creates counters sends its results with them
    events = [make_event([(s, "calls", 2)], clock(), event_id=f"s-{s}") for s in SUBJECTS]
    decided = meter.apply([*events, events[1]])
    assert sent == [3] * 6 + [2]
    assert [d.allowed for d in decided] == [True] * (len(SUBJECTS) + 1)
    assert getattr(decided[-1], "duplicate", None)
    assert meter.count_results() == 2 * len(SUBJECTS)
    assert _used(meter) == {s: [3] for s in SUBJECTS}


def test_an_id_decided_meanwhile_fails_a_chunk_sent_while_deciding_and_the_batch_runs_again(
    meter: Meter, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    meter.apply([make_event([(s, "calls", 1)], clock(), event_id=f"a-{s}") for s in SUBJECTS])
    monkeypatch.setattr(fast, "SEND_EVERY", 3)
    events = [make_event([(s, "calls", 1)], clock(), event_id=f"r-{s}") for s in SUBJECTS]
    decide = fast._Applying.decide
    raced: list[bool] = []

    def racing(applying: Any, snapshot: Any, send: Any = None) -> None:
        raced.append(send is not None)
        if len(raced) == 1:  # after the lookup: the first chunk's insert meets it
            with Meter(pg_url, clock=clock) as other:
                other.apply([make_event([("elsewhere", "calls", 7)], clock(), event_id="r-org-01")])
        decide(applying, snapshot, send)

    monkeypatch.setattr(fast._Applying, "decide", racing)
    decided = list(meter.apply(events))
    assert raced == [True, True]  # decided again, its results sent again
    assert isinstance(decided[1], EventConflict)
    assert all(d.allowed for n, d in enumerate(decided) if n != 1)
    assert meter.count_results() == 2 * len(SUBJECTS)
    assert _used(meter) == {s: [1] if s == "org-01" else [2] for s in SUBJECTS}
    assert [c.used for c in meter.counters("elsewhere", "calls")] == [7]


def test_results_sent_are_rolled_back_when_the_batch_ends_without_its_write(
    meter: Meter, clock: FrozenClock, pg_url: str
) -> None:
    at = to_us(clock())
    record = ResultRecord("sent-then-declined", "allowed", "f", at, at, (), None, [], None)
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as raw:
        store = PostgresHotStore(raw)
        store.read(ReadRequest(None, [], []))
        with pytest.raises(RuntimeError), store.sending() as send:
            assert send is not None
            send([record])
            raise RuntimeError("declined")
        assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert meter.count_results() == 0


def test_an_unacceptable_event_met_after_results_were_sent_writes_nothing(
    meter: Meter, clock: FrozenClock, sent: list[int]
) -> None:
    meter.apply([make_event([(s, "calls", 1)], clock(), event_id=f"a-{s}") for s in SUBJECTS])
    events = [make_event([(s, "calls", 1)], clock(), event_id=f"u-{s}") for s in SUBJECTS]
    events.append(make_event([("org-00", "nope", 1)], clock(), event_id="u-unknown"))
    with pytest.raises(UnknownLimit):
        meter.apply(events, invalid="raise")
    assert sent == [3] * 6
    assert meter.count_results() == len(SUBJECTS)
    assert _used(meter) == {s: [1] for s in SUBJECTS}
