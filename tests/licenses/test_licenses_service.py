"""Floating licenses (`metering/licenses/service.py`) through `Meter`:
checkout, checkin, renew, expiry, the sweep, entitlements, ``limit.denied``
and bad input; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from metering import FrozenClock, Limit, Meter
from metering.domain.events import charges_of, make_event
from metering.errors import (
    CheckoutConflict,
    CheckoutReleased,
    InvalidInput,
    InvalidLimit,
    UnknownCheckout,
    UnknownLimit,
    WrongAlgorithm,
)
from metering.storage.tables import checkouts, license_pools, results
from metering.storage.webhooks import WebhookStore
from metering.webhooks import Webhooks
from metering.webhooks.delivery import sweep_resets

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("cad", maximum=2, algorithm="concurrent"))
        meter.set_limit(Limit("calls", maximum=5, period="1h"))
        yield meter


def test_checkout_checkin_renew(meter: Meter, clock: FrozenClock) -> None:
    first = meter.checkout("org-1", "cad", ttl_seconds=60)
    assert (first.state, first.held, first.maximum) == ("held", 1, 2)
    assert first.expires_at == NOW + timedelta(seconds=60)
    second = meter.checkout("org-1", "cad", checkout_id="mine")
    assert (second.id, second.held, second.expires_at) == ("mine", 2, NOW + timedelta(minutes=15))
    denied = meter.checkout("org-1", "cad")
    assert (denied.allowed, denied.state, denied.held) == (False, "denied", 2)
    assert denied.retry_at == first.expires_at  # the first one to expire
    assert meter.checkout_info(denied.id) is None  # a denial stores nothing
    assert meter.checkout("org-2", "cad").allowed  # each subject has its own licenses

    clock.advance(seconds=30)
    renewed = meter.renew(first.id)  # its own TTL, from now
    assert renewed.expires_at == clock() + timedelta(seconds=60)
    assert meter.renew(first.id, ttl_seconds=1).expires_at == renewed.expires_at  # never shorter
    assert meter.checkin(first.id) == 1
    assert meter.checkin(first.id) == 0  # once
    with pytest.raises(CheckoutReleased, match="checked in"):
        meter.renew(first.id)
    assert meter.checkout("org-1", "cad", 1).allowed


def test_an_expired_checkout_comes_back_at_its_ttl_and_the_sweep_records_it(
    meter: Meter, clock: FrozenClock
) -> None:
    taken = meter.checkout("org-1", "cad", 2, ttl_seconds=60)
    clock.advance(seconds=59)
    assert not meter.checkout("org-1", "cad").allowed
    clock.advance(seconds=1)
    info = meter.checkout_info(taken.id)
    assert info is not None and (info.state, info.released_by) == ("released", "expiry")
    with pytest.raises(CheckoutReleased, match="expired"):
        meter.renew(taken.id)
    again = meter.checkout("org-1", "cad", 2)
    assert (again.allowed, again.held) == (True, 2)  # back once: not 4
    assert meter.sweep_reservations() == {"committed": 0, "released": 1, "deleted": 0}
    assert meter.sweep_reservations()["released"] == 0
    assert meter.checkin(taken.id) == 0
    clock.advance(days=2)
    swept = meter.sweep_reservations(retention_seconds=86_400)
    assert swept == {"committed": 0, "released": 1, "deleted": 2}
    assert meter.checkouts() == []


def test_an_entitlement_sets_a_subjects_licenses(meter: Meter) -> None:
    meter.set_entitlement("org-1", "cad", 3)
    assert [meter.checkout("org-1", "cad").allowed for _ in range(4)] == [True] * 3 + [False]
    assert meter.checkout("org-2", "cad", 2).allowed
    assert not meter.checkout("org-2", "cad").allowed


def test_a_repeated_checkout_id_answers_the_stored_checkout(meter: Meter) -> None:
    first = meter.checkout("org-1", "cad", checkout_id="job-7")
    again = meter.checkout("org-1", "cad", checkout_id="job-7")
    assert (again.id, again.state, again.held, again.expires_at) == (
        "job-7",
        "held",
        1,
        first.expires_at,
    )
    with pytest.raises(CheckoutConflict):
        meter.checkout("org-2", "cad", checkout_id="job-7")
    assert len(meter.checkouts()) == 1


def test_a_retry_of_an_ended_checkout_is_refused_naming_how_it_ended(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.checkout("org-1", "cad", checkout_id="job-77", ttl_seconds=1)
    clock.advance(seconds=2)
    assert meter.checkout("org-1", "cad", 2).allowed  # the pool is full again
    expired = "'job-77' has ended: it expired at 2026-11-22T12:00:01Z"
    with pytest.raises(CheckoutReleased, match=expired) as ended:
        meter.checkout("org-1", "cad", checkout_id="job-77", ttl_seconds=1)
    error = ended.value
    when = NOW + timedelta(seconds=1)
    assert (error.checkout_id, error.released_by, error.released_at) == ("job-77", "expiry", when)
    meter.checkout("org-2", "cad", checkout_id="job-8")
    clock.advance(seconds=5)
    assert meter.checkin("job-8") == 1
    with pytest.raises(CheckoutReleased, match="'job-8' has ended: it was checked in at ") as ended:
        meter.checkout("org-2", "cad", checkout_id="job-8")  # room enough: still ended
    assert (ended.value.released_by, ended.value.released_at) == ("checkin", clock())
    info = meter.checkout_info("job-77")
    assert info is not None and (info.state, info.allowed) == ("released", False)
    assert info.to_dict()["allowed"] is False
    assert len(meter.checkouts()) == 3  # nothing stored by the refusals
    with pytest.raises(CheckoutConflict):  # another checkout's values: a conflict first
        meter.checkout("org-1", "cad", 2, checkout_id="job-77")


def test_a_state_filter_applies_expiry_first(meter: Meter, clock: FrozenClock) -> None:
    meter.set_entitlement("org-1", "cad", 10)
    kept = meter.checkout("org-1", "cad", ttl_seconds=3600)
    assert meter.checkin(meter.checkout("org-1", "cad", checkout_id="in-1").id) == 1
    clock.advance(seconds=1)
    ended = ["e-1", "e-2", "e-3"]  # one instant: listed by id
    for checkout_id in ended:
        meter.checkout("org-1", "cad", ttl_seconds=5, checkout_id=checkout_id)
    clock.advance(seconds=10)  # expired, and no sweep has marked them
    released = meter.checkouts(state="released")
    assert [c.id for c in released] == [*ended, "in-1"]
    assert [c.released_by for c in released] == ["expiry"] * 3 + ["checkin"]
    assert [c.id for c in meter.checkouts(state="released", count=2)] == ended[:2]
    assert [c.id for c in meter.checkouts(state="held")] == [kept.id]
    assert [c.id for c in meter.checkouts(state="held", count=1)] == [kept.id]
    assert len(meter.checkouts(subject="org-1", count=5)) == 5


def _messages(meter: Meter) -> list[dict[str, Any]]:
    found = meter.database.run(lambda c: WebhookStore(c).messages())
    return [json.loads(payload) for _, _, payload in found]


def test_limit_denied_once_per_run_of_denials_with_the_algorithm(
    meter: Meter, clock: FrozenClock
) -> None:
    Webhooks(meter).add("https://example.com/hooks")
    held = meter.checkout("org-1", "cad", 2, ttl_seconds=60)
    for _ in range(3):
        assert not meter.checkout("org-1", "cad").allowed
    [message] = _messages(meter)
    assert message["type"] == "limit.denied"
    data = message["data"]
    assert (data["algorithm"], data["subject"], data["limit"]) == ("concurrent", "org-1", "cad")
    assert (data["maximum"], data["used"], data["window_start"]) == (2, 2, None)
    assert data["retry_at"] == "2026-11-22T12:01:00Z"
    assert meter.checkin(held.id) == 2
    assert meter.checkout("org-1", "cad", 2).allowed  # fits: the run of denials is over
    assert not meter.checkout("org-1", "cad").allowed
    clock.advance(hours=2)  # no window: nothing resets, whatever the sweeps find
    meter.sweep_reservations()
    assert sweep_resets(meter) == 0
    assert [m["type"] for m in _messages(meter)] == ["limit.denied", "limit.denied"]


def test_consume_check_and_reserve_of_a_concurrent_limit_are_refused(meter: Meter) -> None:
    for call in (
        lambda: meter.consume("org-1", "cad"),
        lambda: meter.check("org-1", "cad"),
        lambda: meter.reserve("org-1", "cad"),
        lambda: meter.consume(charges=[("org-1", "calls", 1), ("org-1", "cad", 1)]),
    ):
        with pytest.raises(WrongAlgorithm, match="concurrent: check a license out"):
            call()
    assert meter.count_results() == 0 and meter.counters() == []
    # Queued (the worker's batch): rejected with the reason; the rest applies.
    events = [
        make_event(charges_of("org-1", limit, 1, None), meter.clock(), event_id, None)
        for limit, event_id in (("cad", "q-1"), ("calls", "q-2"))
    ]
    rejected, allowed = meter.apply(events)
    assert rejected.outcome == "rejected" and "check a license out" in str(rejected.reason)
    assert allowed.outcome == "allowed"


def _stored(meter: Meter) -> tuple[int, int, int]:
    def count(connection: Any) -> tuple[int, int, int]:
        return tuple(  # type: ignore[return-value]
            connection.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (checkouts, license_pools, results)
        )

    return meter.database.run(count)


BAD: list[tuple[str, Callable[[Meter], object], type[Exception], str]] = [
    ("windowed limit", lambda m: m.checkout("org-1", "calls"), WrongAlgorithm, "fixed_window"),
    ("unknown limit", lambda m: m.checkout("org-1", "nope"), UnknownLimit, "nope"),
    ("bad limit name", lambda m: m.checkout("org-1", "Bad Name"), InvalidLimit, "name"),
    ("empty subject", lambda m: m.checkout("", "cad"), InvalidInput, "subject"),
    ("cost 0", lambda m: m.checkout("org-1", "cad", 0), InvalidInput, "cost"),
    ("cost -1", lambda m: m.checkout("org-1", "cad", -1), InvalidInput, "cost"),
    ("cost 1.5", lambda m: m.checkout("org-1", "cad", 1.5), InvalidInput, "cost"),  # type: ignore[arg-type]
    ("cost True", lambda m: m.checkout("org-1", "cad", True), InvalidInput, "cost"),
    ("ttl 0", lambda m: m.checkout("org-1", "cad", ttl_seconds=0), InvalidInput, "ttl"),
    ("ttl nan", lambda m: m.checkout("org-1", "cad", ttl_seconds=math.nan), InvalidInput, "ttl"),
    ("ttl inf", lambda m: m.checkout("org-1", "cad", ttl_seconds=math.inf), InvalidInput, "ttl"),
    ("ttl text", lambda m: m.checkout("org-1", "cad", ttl_seconds="15m"), InvalidInput, "ttl"),  # type: ignore[arg-type]
    (
        "bad id",
        lambda m: m.checkout("org-1", "cad", checkout_id="a b"),
        InvalidInput,
        "checkout_id",
    ),
    ("checkin unknown", lambda m: m.checkin("nope"), UnknownCheckout, "nope"),
    ("checkin bad id", lambda m: m.checkin(""), InvalidInput, "checkout_id"),
    ("renew unknown", lambda m: m.renew("nope"), UnknownCheckout, "nope"),
    ("renew ttl -1", lambda m: m.renew("nope", ttl_seconds=-1), InvalidInput, "ttl"),
    ("list state", lambda m: m.checkouts(state="denied"), InvalidInput, "state"),
    ("grant", lambda m: m.grant("org-1", "cad", 1), WrongAlgorithm, "by an entitlement"),
]


@pytest.mark.parametrize(("case", "call", "error", "text"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_clear_error_that_changes_nothing(
    meter: Meter, case: str, call: Callable[[Meter], object], error: type[Exception], text: str
) -> None:
    kept = meter.checkout("org-1", "cad", checkout_id="kept")
    before = _stored(meter)
    with pytest.raises(error, match=text):
        call(meter)
    assert _stored(meter) == before
    assert [c.id for c in meter.checkouts()] == [kept.id]
