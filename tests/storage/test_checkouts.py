"""`CheckoutStore.list` by state, on SQLite and PostgreSQL: the state as it
stands at the ``now`` passed in (a held checkout at or past its expiry is
released, swept or not), applied in SQL before ``count``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from metering import Meter
from metering.domain.licenses import CheckoutState, ReleasedBy
from metering.storage.checkouts import CheckoutRecord, CheckoutStore

NOW_US = 1_800_000_000_000_000
HELD, RELEASED = CheckoutState.HELD, CheckoutState.RELEASED


def _record(checkout_id: str, created: int, expires: int, state: CheckoutState) -> CheckoutRecord:
    released = (expires, ReleasedBy.CHECKIN) if state is RELEASED else (None, None)
    return CheckoutRecord(checkout_id, "org-1", "cad", 1, state, created, 60, expires, *released)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    rows = [  # newest first: the expired ones are the newest
        _record("at-expiry", NOW_US - 1, NOW_US, HELD),  # expiry is exclusive: released now
        _record("expired", NOW_US - 2, NOW_US - 1, HELD),
        _record("checked-in", NOW_US - 3, NOW_US - 3, RELEASED),
        _record("live", NOW_US - 4, NOW_US + 1, HELD),
        _record("long", NOW_US - 5, NOW_US + 60, HELD),
    ]
    with Meter(db_url) as meter:
        for row in rows:
            meter.database.run(lambda connection, row=row: CheckoutStore(connection).insert(row))
        yield meter


def _listed(meter: Meter, state: str | None, count: int = 10) -> list[str]:
    found = meter.database.run(
        lambda connection: CheckoutStore(connection).list("org-1", "cad", state, count, NOW_US)
    )
    return [record.id for record in found]


def test_a_state_is_as_it_stands_at_now(meter: Meter) -> None:
    assert _listed(meter, "held") == ["live", "long"]
    assert _listed(meter, "released") == ["at-expiry", "expired", "checked-in"]
    assert _listed(meter, None) == ["at-expiry", "expired", "checked-in", "live", "long"]


def test_count_rows_of_the_state_when_there_are_that_many(meter: Meter) -> None:
    assert _listed(meter, "held", count=1) == ["live"]
    assert _listed(meter, "held", count=2) == ["live", "long"]
    assert _listed(meter, "released", count=2) == ["at-expiry", "expired"]
