"""Settling a reservation on the engine's own connections (issue 20, points 2 and 5).

An ordinary cancel and commit (with or without ``actual``) lock the
reservation and its counters, give back and write in one transaction on
`DirectSqlite` / `DirectPostgres`, with no SQLAlchemy connection; what is
rare (grants to restore, rollups to take back) runs again, whole, under
SQLAlchemy. The differential test of reservations
(``test_transactions_fast_path.py``) holds both to the same rows.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from storage.hot.test_direct_postgres import checkouts

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.errors import InvalidInput, ReservationSettled, UnknownReservation
from metering.storage.tables import counters, reservations

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)


def _used(meter: Meter) -> dict[tuple[str, str], int]:
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(
            select(counters.c.limit_name, counters.c.subject, counters.c.used)
        )
        return {(limit, subject): used for limit, subject, used in rows}


def _settled(meter: Meter) -> dict[str, tuple[object, ...]]:
    columns = (reservations.c.state, reservations.c.settled_by, reservations.c.given_back)
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(select(reservations.c.id, *columns))
        return {row[0]: tuple(row[1:]) for row in rows}


def test_an_ordinary_settle_checks_out_no_sqlalchemy_connection(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1h", window="calendar"),
                Limit("first", maximum=100, period="1h"),
                Limit("bucket", maximum=50, period="60s", algorithm="token_bucket"),
            ]
        )
        meter.consume("warm-up", "calls")  # the limits' cache is loaded under SQLAlchemy
        charges = [("org", "calls", 4), ("org", "first", 4), ("org", "bucket", 4)]
        held = [meter.reserve(charges=charges, event_id=f"r-{n}") for n in range(5)]
        lent = checkouts(meter)
        assert held[0].cancel() == 12
        assert held[0].cancel() == 0  # twice: nothing more
        assert held[1].commit() == 0
        assert held[2].commit(actual=1) == 9
        assert held[3].commit(actual=4) == 0
        with pytest.raises(ReservationSettled):
            held[1].cancel()
        with pytest.raises(UnknownReservation):
            meter.cancel_reservation("nobody")
        assert lent == [0]
        assert held[4].cancel() == 12
        assert lent == [0]
        # 5 reservations of 4 each; back: 4 + 3 (commit of 1) + 4.
        assert _used(meter)[("calls", "org")] == 20 - 4 - 3 - 4
        assert _used(meter)[("first", "org")] == 20 - 4 - 3 - 4
        rows = _settled(meter)
        assert [rows[f"r-{n}"][:2] for n in range(5)] == [
            ("cancelled", "cancel"),
            ("committed", "commit"),
            ("committed", "commit"),
            ("committed", "commit"),
            ("cancelled", "cancel"),
        ]
        assert rows["r-1"][2] is None and rows["r-3"][2] is None
        assert rows["r-2"][2] is not None and '"calls"' in str(rows["r-2"][2])


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_priced_usage_committed_at_what_it_reserved_is_committed_in_full(
    db_url: str, path: str
) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1h", window="calendar"),
                spend_limit("usd_cap", "1", "USD", "1h", window="calendar"),
            ]
        )
        meter.set_price("calls", "0.02", "USD")
        if path == "reference":  # settled under SQLAlchemy, decided by the reference engine
            meter._engine.settle = lambda direct, general: general()  # type: ignore[method-assign]
            meter._engine.paths = [meter._engine.path("reference")]
        held = meter.reserve(charges=[("org", "calls", 3)], event_id="r-0")
        # ``actual`` is the units: their 6 cents stay with them.
        assert held.commit(actual=3) == 0
        assert _settled(meter)["r-0"][:2] == ("committed", "commit")
        assert _used(meter)[("calls", "org")] == 3
        assert _used(meter)[("usd_cap", "org")] == 6
        partial = meter.reserve(charges=[("org", "calls", 3)], event_id="r-1")
        assert partial.commit(actual=2) == 1 + 2  # a unit and its 2 cents
        assert _used(meter)[("usd_cap", "org")] == 10
        with pytest.raises(InvalidInput, match="at most the units it reserved"):
            meter.reserve(charges=[("org", "calls", 3)], event_id="r-2").commit(actual=4)
