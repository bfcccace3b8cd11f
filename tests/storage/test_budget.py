"""One connection budget per process, on a real PostgreSQL.

Every connection a `Meter` opens to PostgreSQL (SQLAlchemy's pool, the hot
path's own, the leases' listener) takes a place in the process's budget
(``connections=``, ``METERING_DB_CONNECTIONS``): the server never sees more
than the budget from one process, counted in ``pg_stat_activity`` by the
process's ``application_name``, however many threads call it at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import psycopg
import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import ConfigurationError
from metering.storage.budget import ConnectionBudget
from metering.storage.connections import make_engine

pytestmark = pytest.mark.postgres

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
BUDGET = 4


def plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def open_by(url: str, application: str) -> int:
    """How many connections the server has open for ``application``."""
    with psycopg.connect(plain(url), autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (application,)
        ).fetchone()
    assert row is not None
    return int(row[0])


class Sampler:
    """The most connections ``application`` had open at once, sampled on a thread."""

    def __init__(self, url: str, application: str) -> None:
        self.most = 0
        self._stop = threading.Event()
        self._admin = psycopg.connect(plain(url), autocommit=True)
        self._application = application
        self._thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        while not self._stop.is_set():
            row = self._admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                (self._application,),
            ).fetchone()
            assert row is not None
            self.most = max(self.most, int(row[0]))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._admin.close()


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    url = f"{pg_url}?application_name=budgeted"
    with Meter(url, clock=FrozenClock(NOW), connections=BUDGET) as m:
        m.set_limits(
            [
                Limit("calls", maximum=100_000, period="1d", window="calendar"),
                Limit("small", maximum=40, period="1d", window="calendar"),
            ]
        )
        yield m


def _calls(meter: Meter, thread: int) -> int:
    """Hot-path consumes, checks, first denials (SQLAlchemy) and admin reads."""
    allowed = 0
    for n in range(30):
        allowed += meter.consume(f"s-{n % 4}", "calls").allowed
        allowed += meter.consume("shared", "small").allowed
        if n % 5 == 0:
            meter.check(f"s-{thread}", "calls")
            meter.counters(f"s-{thread}")
            meter.lease("hot", "calls")
    return allowed


def test_sixteen_threads_never_open_more_than_the_budget(pg_url: str, meter: Meter) -> None:
    with Sampler(pg_url, "budgeted") as sampler, ThreadPoolExecutor(16) as pool:
        allowed = sum(pool.map(lambda t: _calls(meter, t), range(16)))
    assert allowed >= 16 * 30 + 40  # every call answered: none failed for want of a connection
    assert 1 <= sampler.most <= BUDGET
    assert open_by(pg_url, "budgeted") <= BUDGET  # idle ones too
    assert meter.connections_in_use() <= BUDGET


class Connection:
    """Stands for a driver's connection (the budget only keeps a weak reference)."""


def test_a_budget_waits_for_a_place_then_gives_it_back() -> None:
    budget = ConnectionBudget(2, timeout=0.01)
    first, second = Connection(), Connection()
    assert budget.connect(lambda: first) is first
    assert budget.connect(lambda: second) is second
    assert budget.in_use == 2
    with pytest.raises(Exception, match="2 connections"):
        budget.connect(Connection)
    budget.closed(first)
    budget.closed(first)  # closed twice: one place back, not two
    assert budget.in_use == 1
    third = budget.connect(Connection)
    assert budget.in_use == 2
    del third  # collected without a close: its place comes back too
    assert budget.in_use == 1


def test_a_connection_that_fails_to_open_takes_no_place() -> None:
    budget = ConnectionBudget(1, timeout=0.01)

    def refused() -> Connection:
        raise OSError("refused")

    with pytest.raises(OSError):
        budget.connect(refused)
    assert budget.in_use == 0


@pytest.mark.parametrize("connections", [2, 0, 1001, True])
def test_an_engine_refuses_a_budget_too_small_for_its_paths(connections: int) -> None:
    # Nothing is connected: the refusal comes first, naming the argument.
    with pytest.raises(ConfigurationError, match="connections must be a whole number from 3"):
        make_engine("postgresql://nobody@127.0.0.1:1/none", connections=connections)
