"""`ApiKeyStore` on SQLite and PostgreSQL: rows by id and in creation order,
a revocation once, and the last use written once per interval."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from metering import Meter
from metering.storage.api_keys import ApiKeyRecord, ApiKeyStore

T = TypeVar("T")
NOW_US = 1_800_000_000_000_000


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url) as meter:
        yield meter


def _on(meter: Meter, work: Callable[[ApiKeyStore], T]) -> T:
    return meter.database.run(lambda connection: work(ApiKeyStore(connection)))


def test_no_key_at_first(meter: Meter) -> None:
    assert _on(meter, lambda store: store.any()) is False
    assert _on(meter, lambda store: store.count()) == 0
    assert _on(meter, lambda store: store.list()) == []
    assert _on(meter, lambda store: store.get("mk_none")) is None


def test_keys_read_back_by_id_and_in_creation_order(meter: Meter) -> None:
    _on(meter, lambda store: store.insert("mk_b", "h2", "admin", "ops", NOW_US))
    _on(meter, lambda store: store.insert("mk_a", "h1", "customer", "web", NOW_US, "org-1"))
    _on(meter, lambda store: store.insert("mk_c", "h3", "ingest", "early", NOW_US - 1))
    a = ApiKeyRecord("mk_a", "h1", "customer", "web", NOW_US, None, None, "org-1")
    assert _on(meter, lambda store: store.get("mk_a")) == a
    listed = _on(meter, lambda store: store.list())
    assert [key.id for key in listed] == ["mk_c", "mk_a", "mk_b"]
    assert _on(meter, lambda store: (store.any(), store.count())) == (True, 3)


def test_a_key_is_revoked_once_and_stays_counted(meter: Meter) -> None:
    _on(meter, lambda store: store.insert("mk_a", "h", "admin", "ops", NOW_US))
    assert _on(meter, lambda store: store.revoke("mk_a", NOW_US + 5)) is True
    assert _on(meter, lambda store: store.revoke("mk_a", NOW_US + 9)) is False
    assert _on(meter, lambda store: store.revoke("mk_none", NOW_US)) is False
    revoked = _on(meter, lambda store: store.get("mk_a"))
    assert revoked is not None and revoked.revoked_at_us == NOW_US + 5
    assert _on(meter, lambda store: (store.any(), store.count())) == (True, 1)


def test_the_last_use_is_written_when_unset_or_older_than_the_bound(meter: Meter) -> None:
    _on(meter, lambda store: store.insert("mk_a", "h", "admin", "ops", NOW_US))
    assert _on(meter, lambda store: store.note_use("mk_a", NOW_US + 10, NOW_US)) is True
    # a use within the interval writes nothing
    assert _on(meter, lambda store: store.note_use("mk_a", NOW_US + 20, NOW_US + 10)) is False
    assert _on(meter, lambda store: store.note_use("mk_a", NOW_US + 30, NOW_US + 11)) is True
    used = _on(meter, lambda store: store.get("mk_a"))
    assert used is not None and used.last_used_at_us == NOW_US + 30
    assert _on(meter, lambda store: store.note_use("mk_none", NOW_US, NOW_US)) is False
