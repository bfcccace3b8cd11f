"""The breakers table (`metering.storage.breakers`) on SQLite and PostgreSQL:
rows written and read back exactly (rates as doubles), the quarantined listed
by limit then subject, a release that starts the history again, and one
for another quarantine (or none) that changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Connection

from metering import Meter
from metering.domain.breaker import Breaker
from metering.storage.breakers import BreakerStore, Quarantine

HELD = Breaker(12.5, 0.25, 5_000_000, 1_000_000, None, 4_000_000)
FREE = Breaker(1 / 3, 1e-9, 5_000_000, 2_000_000, 3_000_000, None)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url) as meter:
        yield meter


def test_rows_are_written_read_and_listed(meter: Meter) -> None:
    def work(connection: Connection) -> None:
        store = BreakerStore(connection)
        store.write({("api", "org-2"): HELD, ("api", "org-1"): FREE, ("b", "org-1"): HELD})
        found = store.read([("api", "org-1"), ("api", "org-2"), ("api", "none")], lock=True)
        assert found == {("api", "org-1"): FREE, ("api", "org-2"): HELD}
        assert store.quarantined() == [
            Quarantine("api", "org-2", 4_000_000),
            Quarantine("b", "org-1", 4_000_000),
        ]

    meter.database.run(work)


def test_a_release_ends_only_the_quarantine_it_names(meter: Meter) -> None:
    def work(connection: Connection) -> None:
        store = BreakerStore(connection)
        store.write({("api", "org-1"): HELD, ("api", "org-2"): FREE})
        assert store.release(("api", "org-2"), 9_000_000) is None  # not quarantined
        assert store.release(("api", "org-1"), 9_000_000, at_us=1) is None  # another one
        assert store.read([("api", "org-1")], lock=False)[("api", "org-1")] == HELD
        ended = store.release(("api", "org-1"), 9_000_000, at_us=4_000_000)
        assert ended == Quarantine("api", "org-1", 4_000_000)
        after = store.read([("api", "org-1")], lock=False)[("api", "org-1")]
        assert (after.quarantined_at_us, after.since_us, after.short_rate) == (None, 9_000_000, 0)
        assert store.quarantined() == []

    meter.database.run(work)
