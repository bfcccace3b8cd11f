"""The answer to `Meter.reserve` (`metering/reservations/handle.py`), on a
recording settler: a denied reservation settles nothing; cancel and commit
are each asked of the settler and set the state; leaving a ``with`` block
commits what is still held, even when the block raised; a settled or expired
reservation's error keeps its state true. `ReservationInfo` as operators see it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering.domain.decisions import Decision
from metering.domain.reservations import HeldCharge, ReservationState
from metering.errors import ReservationExpired, ReservationSettled
from metering.reservations.handle import Reservation, ReservationInfo
from metering.storage.reservations import ReservationRecord

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
HELD, DENIED = ReservationState.HELD, ReservationState.DENIED


class Settler:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[str, str, int | None]] = []
        self.error = error

    def cancel_reservation(self, reservation_id: str) -> int:
        self.calls.append(("cancel", reservation_id, None))
        if self.error is not None:
            raise self.error
        return 2

    def commit_reservation(self, reservation_id: str, actual: int | None = None) -> int:
        self.calls.append(("commit", reservation_id, actual))
        if self.error is not None:
            raise self.error
        return 0 if actual is None else 2 - actual


def decision(outcome: str = "allowed") -> Decision:
    return Decision("r-1", outcome, (), NOW, NOW)  # type: ignore[arg-type]


def test_cancel_and_commit_are_the_settlers_and_set_the_state() -> None:
    settler = Settler()
    held = Reservation(settler, decision(), HELD, NOW)
    assert (held.id, held.allowed, held.expires_at) == ("r-1", True, NOW)
    assert held.cancel() == 2 and held.state == ReservationState.CANCELLED
    other = Reservation(settler, decision(), HELD)
    assert other.commit(1) == 1 and other.state == ReservationState.COMMITTED
    assert settler.calls == [("cancel", "r-1", None), ("commit", "r-1", 1)]
    assert repr(other) == "<Reservation r-1 committed allowed=True>"


def test_a_denied_reservation_settles_nothing() -> None:
    settler = Settler()
    denied = Reservation(settler, decision("denied"), DENIED)
    assert (denied.cancel(), denied.commit(), denied.allowed) == (0, 0, False)
    with denied:
        pass
    assert settler.calls == [] and denied.state == DENIED


def test_leaving_the_block_commits_what_is_held_even_on_an_error() -> None:
    settler = Settler()
    with pytest.raises(RuntimeError), Reservation(settler, decision(), HELD) as held:
        raise RuntimeError("the work failed")
    assert held.state == ReservationState.COMMITTED
    with Reservation(settler, decision(), HELD) as cancelled:
        cancelled.cancel()
    assert [call[0] for call in settler.calls] == ["commit", "cancel"]  # not committed again


def test_a_settled_or_expired_reservations_error_keeps_its_state_true() -> None:
    committed = Reservation(
        Settler(ReservationSettled("r-1", "committed", "cancel")), decision(), HELD
    )
    with pytest.raises(ReservationSettled):
        committed.cancel()
    assert committed.state == ReservationState.COMMITTED
    cancelled = Reservation(
        Settler(ReservationSettled("r-1", "cancelled", "cancel")), decision(), HELD
    )
    with pytest.raises(ReservationSettled):
        cancelled.cancel()
    assert cancelled.state == HELD  # what it is, the store says: nothing learnt here
    expired = Reservation(Settler(ReservationExpired("r-1", action="commit")), decision(), HELD)
    with pytest.raises(ReservationExpired):
        expired.commit(0)
    assert expired.state == ReservationState.COMMITTED


def test_the_operators_view_of_a_stored_reservation() -> None:
    charges = (
        HeldCharge("org", "calls", 3, 0, 3_600_000_000),
        HeldCharge("org", "tokens", 9, 0, 1),
    )
    record = ReservationRecord(
        "r-1",
        ReservationState.CANCELLED,
        charges,
        1_000_000,
        61_000_000,
        2_000_000,
        "api",
        (("org", "calls", 0, 3), ("org", "calls", 0, 0)),
    )
    info = ReservationInfo.of(record)
    assert [info.given_back_of(c) for c in charges] == [3, 0]
    shown = info.to_dict()
    assert shown["state"] == "cancelled" and shown["settled_by"] == "api"
    assert shown["charges"][0] == {"subject": "org", "limit": "calls", "cost": 3, "given_back": 3}
    assert shown["created_at"] == "1970-01-01T00:00:01+00:00"
    assert shown["settled_at"] == "1970-01-01T00:00:02+00:00"
