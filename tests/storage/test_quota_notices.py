"""Quota-change notices: sent at commit (PostgreSQL), heard by a listener.

A listener hears a committed reset, entitlement or limit change with its
(subject, limit), nothing of a transaction rolled back; after its server
restarts it says (None, None), every key (notices may have been missed),
and listens again; it takes one place in the engine's budget.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from servers import PostgresServer

from metering import FrozenClock, Limit, Meter
from metering.storage.quota_notices import QuotaListener, notify, parse

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
WAIT_SECONDS = 30  # a bound on a hang, not a timing


class Heard:
    """The notices a listener passed on, in order."""

    def __init__(self) -> None:
        self.notices: queue.Queue[tuple[str | None, str | None]] = queue.Queue()

    def __call__(self, subject: str | None, limit: str | None) -> None:
        self.notices.put((subject, limit))

    def next(self) -> tuple[str | None, str | None]:
        return self.notices.get(timeout=WAIT_SECONDS)


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    with Meter(pg_url, clock=FrozenClock(NOW), connections=4) as m:
        m.set_limit(Limit("calls", maximum=10, period="1d", window="calendar"))
        yield m


@pytest.fixture
def heard(meter: Meter) -> Iterator[Heard]:
    heard = Heard()
    listener = QuotaListener.for_engine(meter.sql_engine, heard)
    assert listener is not None and listener.listening
    yield heard
    listener.close()


def test_payloads_are_a_subject_and_a_limit_or_every_one() -> None:
    assert parse('["org-1", "calls"]') == ("org-1", "calls")
    assert parse('[null, "calls"]') == (None, "calls")
    for other in ("", "{}", "[1, 2]", '["a"]', "not json", '["a", "b", "c"]'):
        assert parse(other) == (None, None)


@pytest.mark.postgres
def test_committed_changes_are_heard_with_their_keys(meter: Meter, heard: Heard) -> None:
    meter.consume("org-1", "calls")
    meter.reset(subject="org-1", limit="calls")
    assert heard.next() == ("org-1", "calls")
    meter.set_entitlement("org-2", "calls", 5)
    assert heard.next() == ("org-2", "calls")
    meter.set_limit(Limit("calls", maximum=3, period="1d", window="calendar"))
    assert heard.next() == (None, "calls")


@pytest.mark.postgres
def test_a_listener_takes_one_place_of_the_budget(meter: Meter) -> None:
    before = meter.connections_in_use()
    assert before is not None
    listener = QuotaListener.for_engine(meter.sql_engine, Heard())
    assert listener is not None
    assert meter.connections_in_use() == before + 1
    listener.close()
    assert meter.connections_in_use() == before


@pytest.mark.postgres
def test_a_rolled_back_change_is_never_heard(meter: Meter, heard: Heard) -> None:
    with meter.sql_engine.connect() as connection:
        notify(connection, "org-1", "calls")
        connection.rollback()
    meter.reset(subject="org-9", limit="calls")  # the next one heard is this one
    assert heard.next() == ("org-9", "calls")


@pytest.mark.postgres
def test_after_a_restart_every_key_is_dropped_and_it_listens_again(
    meter: Meter, heard: Heard, postgres_server: PostgresServer
) -> None:
    postgres_server.stop()
    postgres_server.start()
    assert heard.next() == (None, None)  # the connection was lost
    assert heard.next() == (None, None)  # listening again: what was missed
    meter.database.dispose()  # SQLAlchemy's pooled connections died too
    meter.reset(subject="org-1", limit="calls")
    assert heard.next() == ("org-1", "calls")


def test_sqlite_has_no_listener_and_notify_does_nothing(sqlite_url: str) -> None:
    with Meter(sqlite_url) as meter:
        assert QuotaListener.for_engine(meter.sql_engine, Heard()) is None
        with meter.sql_engine.begin() as connection:
            notify(connection, "org-1", "calls")
        assert meter.connections_in_use() is None
