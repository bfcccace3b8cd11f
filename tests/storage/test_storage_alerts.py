"""`AlertStore` on SQLite and PostgreSQL: one row of thresholds per subject and
limit, replaced by the next; setting or removing one bumps the limits'
version, removing nothing does not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from metering import Meter
from metering.storage.alerts import AlertRecord, AlertStore
from metering.storage.limits import LimitStore

T = TypeVar("T")
NOW_US = 1_800_000_000_000_000


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url) as meter:
        yield meter


def _on(meter: Meter, work: Callable[[AlertStore], T]) -> T:
    return meter.database.run(lambda connection: work(AlertStore(connection)))


def _version(meter: Meter) -> int:
    return meter.database.run(lambda connection: LimitStore(connection).limits_version())


ORG_CALLS = AlertRecord("org", "calls", (50, 80), (900,), NOW_US)
ORG_API = AlertRecord("org", "api", (), (10, 20), NOW_US)
TEAM_CALLS = AlertRecord("team", "calls", (90,), (), NOW_US)


def _put_all(meter: Meter) -> None:
    for record in (TEAM_CALLS, ORG_CALLS, ORG_API):
        _on(meter, lambda store, record=record: store.put(record))


def test_thresholds_read_back_sorted_by_limit_then_subject(meter: Meter) -> None:
    _put_all(meter)
    assert _on(meter, lambda store: store.listed()) == [ORG_API, ORG_CALLS, TEAM_CALLS]
    assert _on(meter, lambda store: store.listed(subject="org")) == [ORG_API, ORG_CALLS]
    assert _on(meter, lambda store: store.listed(limit="calls")) == [ORG_CALLS, TEAM_CALLS]
    assert _on(meter, lambda store: store.listed("team", "api")) == []


def test_the_thresholds_of_pairs_are_those_that_have_their_own(meter: Meter) -> None:
    _put_all(meter)
    found = _on(
        meter, lambda store: store.of([("calls", "org"), ("api", "team"), ("calls", "org")])
    )
    assert found == {("calls", "org"): ORG_CALLS}
    assert _on(meter, lambda store: store.of([])) == {}


def test_a_put_replaces_the_subjects_thresholds_and_bumps_the_version(meter: Meter) -> None:
    _put_all(meter)
    before = _version(meter)
    replaced = AlertRecord("org", "calls", (), (5,), NOW_US + 1)
    _on(meter, lambda store: store.put(replaced))
    assert _on(meter, lambda store: store.listed("org", "calls")) == [replaced]
    assert _version(meter) == before + 1


def test_removing_bumps_the_version_only_when_there_was_a_row(meter: Meter) -> None:
    _put_all(meter)
    before = _version(meter)
    assert _on(meter, lambda store: store.remove("org", "calls")) is True
    assert _version(meter) == before + 1
    assert _on(meter, lambda store: store.remove("org", "calls")) is False
    assert _version(meter) == before + 1
    assert _on(meter, lambda store: store.listed()) == [ORG_API, TEAM_CALLS]
