"""Settling more than reserved (issue 22, point 6): `commit(actual=k)` with
``k`` above the reserved cost records the real usage.

The excess is charged in the commit's transaction, drawing on grants like
any charge; what a hard limit has no room for is charged all the same as
overdraft: in the result, in the overage report, denying the subject until
the window resets, with ``limit.exceeded`` once. Nothing is dropped, and
nothing is charged twice (a second commit, the sweeper, a void after it). The
report bills no more overdraft than the window's usage past the maximum it
shows, whatever changed since (an entitlement, the limit, a void).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import ReservationSettled
from metering.reports import overage_report
from metering.webhooks import Webhooks

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("tokens", maximum=10, period="1d", window="calendar"),
                Limit("soft", maximum=10, period="1d", window="calendar", enforcement="soft"),
                Limit("tb", maximum=10, period="1h", algorithm="token_bucket"),
                Limit("b", maximum=100, period="1d", window="calendar"),
            ]
        )
        Webhooks(meter).add("https://example.com/hooks")
        yield meter


def used(meter: Meter, limit: str, subject: str = "s") -> int:
    return sum(counter.used for counter in meter.counters(subject, limit))


def exceeded(meter: Meter) -> list[dict[str, object]]:
    return [json.loads(p)["data"] for _, _, p in Webhooks(meter).messages("limit.exceeded")]


def overdraft_in_report(meter: Meter, limit: str = "tokens") -> int:
    return sum(row.overdraft for row in overage_report(meter, period="2026-11", limit=limit))


def test_the_excess_is_charged_and_what_a_hard_limit_has_no_room_for_is_overdraft(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("s", "tokens", cost=3, event_id="before")
    held = meter.reserve("s", "tokens", cost=4, event_id="r1")
    assert held.commit(actual=9) == 0
    assert used(meter, "tokens") == 12  # 3 + 9: nothing dropped
    result = meter.result("r1")
    assert result is not None
    [charge] = result.charges
    assert (charge.cost, charge.overdraft) == (9, 2)
    assert charge.to_dict()["overdraft"] == 2
    assert overdraft_in_report(meter) == 2
    # Past its maximum, the counter denies the subject until the window resets.
    assert not meter.consume("s", "tokens", event_id="after").allowed
    [notice] = exceeded(meter)
    assert (notice["limit"], notice["subject"], notice["event_id"]) == ("tokens", "s", "r1")
    # A second commit charges nothing more, and announces nothing again.
    assert held.commit(actual=9) == 0
    assert used(meter, "tokens") == 12
    assert len(exceeded(meter)) == 1
    clock.set(datetime(2026, 11, 11, 0, 0, tzinfo=UTC))
    assert meter.consume("s", "tokens", event_id="tomorrow").allowed


def test_a_commit_of_more_within_the_room_left_is_no_overdraft(meter: Meter) -> None:
    held = meter.reserve("s", "tokens", cost=2, event_id="r1")
    assert held.commit(actual=7) == 0
    assert used(meter, "tokens") == 7
    result = meter.result("r1")
    assert result is not None and result.charges[0].cost == 7
    assert result.charges[0].overdraft == 0
    assert "overdraft" not in result.charges[0].to_dict()
    assert overdraft_in_report(meter) == 0
    assert exceeded(meter) == []
    assert meter.consume("s", "tokens", cost=3).allowed
    assert not meter.consume("s", "tokens", cost=1).allowed


def test_grants_pay_for_the_excess_before_any_overdraft(meter: Meter) -> None:
    meter.grant("s", "tokens", 5, grant_id="top-up")
    held = meter.reserve("s", "tokens", cost=8, event_id="r1")  # own allowance
    assert held.commit(actual=20) == 0  # 12 more: 2 own, 5 granted, 5 overdraft
    assert [g.used for g in meter.grants("s", "tokens")] == [5]
    result = meter.result("r1")
    assert result is not None
    [charge] = result.charges
    assert (charge.cost, charge.grants, charge.overdraft) == (20, (("top-up", 5),), 5)
    [row] = overage_report(meter, period="2026-11", limit="tokens")
    assert (row.used, row.granted, row.overdraft, row.overage) == (20, 5, 5, 0)


def test_a_void_after_a_commit_of_more_reverses_the_real_cost_and_its_overdraft(
    meter: Meter,
) -> None:
    meter.grant("s", "tokens", 5, grant_id="top-up")
    meter.reserve("s", "tokens", cost=8, event_id="r1").commit(actual=20)
    correction = meter.void("r1", "billed by mistake")
    assert [c[2] for c in correction.charges] == [20]
    assert used(meter, "tokens") == 0
    assert [g.used for g in meter.grants("s", "tokens")] == [0]
    assert overdraft_in_report(meter) == 0
    assert meter.consume("s", "tokens", cost=10).allowed


@pytest.mark.parametrize("entitled", ["before the commit", "after the commit"])
def test_an_entitlement_raised_since_bills_only_the_usage_past_the_maximum_shown(
    meter: Meter, clock: FrozenClock, entitled: str
) -> None:
    """Hard maximum 30, 25 used, 4 reserved, then an entitlement of 38 from
    before the window, and a commit of 28. The commit measures against the 30
    of its decision (23 past it, in the result); the report shows maximum 38
    and used 53: it bills the 15 past that, not 23 (8 units charged twice).
    The audit bounds the window with the 23 recorded."""
    from metering.upkeep.audit import run_audit

    meter.set_limit(Limit("thirty", maximum=30, period="1d", window="calendar"))
    meter.consume("s", "thirty", cost=25)
    held = meter.reserve("s", "thirty", cost=4, event_id="r1")
    if entitled == "before the commit":
        meter.set_entitlement("s", "thirty", 38, effective_from=datetime(2026, 11, 1, tzinfo=UTC))
    assert held.commit(actual=28) == 0
    if entitled == "after the commit":
        meter.set_entitlement("s", "thirty", 38, effective_from=datetime(2026, 11, 1, tzinfo=UTC))
    result = meter.result("r1")
    assert result is not None
    [charge] = result.charges
    assert (charge.maximum, charge.used, charge.overdraft) == (30, 53, 23)
    [row] = overage_report(meter, period="2026-11", limit="thirty")
    assert (row.maximum, row.used, row.overdraft, row.overage) == (38, 53, 15, 0)
    assert row.overdraft <= row.used - row.granted - row.maximum
    # Raised past the usage: nothing is past the maximum, nothing billed.
    meter.set_entitlement("s", "thirty", 60, effective_from=datetime(2026, 11, 2, tzinfo=UTC))
    [row] = overage_report(meter, period="2026-11", limit="thirty")
    assert (row.maximum, row.used, row.overdraft) == (60, 53, 0)
    assert len(exceeded(meter)) == 1  # what the commit did then, announced once
    clock.advance(minutes=2)
    assert run_audit(meter, full=True).violations == ()


@pytest.mark.parametrize("change", ["lowered", "removed"])
def test_an_entitlement_lowered_since_bills_no_overdraft_the_commit_did_not_take(
    meter: Meter, clock: FrozenClock, change: str
) -> None:
    """38 in force; 30 used, 4 reserved, committed at 10: 2 past the 38. Then
    the entitlement is lowered to 10, or removed (the default 30): usage that
    was allowed within the maximum of its time is not made overdraft."""
    from metering.upkeep.audit import run_audit

    since = datetime(2026, 11, 1, tzinfo=UTC)
    meter.set_limit(Limit("thirty", maximum=30, period="1d", window="calendar"))
    meter.set_entitlement("s", "thirty", 38, effective_from=since)
    meter.consume("s", "thirty", cost=30)
    assert meter.reserve("s", "thirty", cost=4, event_id="r1").commit(actual=10) == 0
    if change == "lowered":
        meter.set_entitlement("s", "thirty", 10, effective_from=since)
    else:
        meter.delete_entitlement("s", "thirty", effective_from=since)
    [row] = overage_report(meter, period="2026-11", limit="thirty")
    assert (row.maximum, row.used, row.overdraft) == (10 if change == "lowered" else 30, 40, 2)
    clock.advance(minutes=2)
    assert run_audit(meter, full=True).violations == ()


def test_a_limit_made_soft_since_bills_its_overdraft_once(meter: Meter) -> None:
    """13 used of a hard 10, 3 of them overdraft; made soft, the 3 past the
    maximum are overage: billed as that, not as overdraft too."""
    assert meter.reserve("s", "tokens", cost=8, event_id="r1").commit(actual=13) == 0
    meter.set_limit(Limit("tokens", maximum=10, period="1d", window="calendar", enforcement="soft"))
    [row] = overage_report(meter, period="2026-11", limit="tokens")
    assert (row.used, row.overage, row.overdraft) == (13, 3, 0)


def test_a_void_of_other_usage_since_bills_no_overdraft_within_the_maximum(
    meter: Meter,
) -> None:
    """5 used, 4 reserved, committed at 9: 4 past the maximum of 10. A void of
    the first 5 leaves 9 used, within it: no overdraft is billed."""
    meter.consume("s", "tokens", cost=5, event_id="early")
    assert meter.reserve("s", "tokens", cost=4, event_id="r1").commit(actual=9) == 0
    assert overdraft_in_report(meter) == 4
    meter.void("early", "refund")
    [row] = overage_report(meter, period="2026-11", limit="tokens")
    assert (row.used, row.overdraft) == (9, 0)


def test_a_soft_limits_excess_is_overage(meter: Meter) -> None:
    held = meter.reserve("s", "soft", cost=6, event_id="r1")
    assert held.commit(actual=14) == 0
    result = meter.result("r1")
    assert result is not None
    [charge] = result.charges
    assert (charge.cost, charge.overage, charge.overdraft) == (14, 4, 0)
    [row] = overage_report(meter, period="2026-11", limit="soft")
    assert (row.overage, row.overdraft) == (4, 0)
    [notice] = exceeded(meter)
    assert notice["limit"] == "soft"


def test_a_bucket_takes_the_excess_as_debt_and_refills_past_it(
    meter: Meter, clock: FrozenClock
) -> None:
    held = meter.reserve("s", "tb", cost=4, event_id="r1")
    assert held.commit(actual=15) == 0  # 6 tokens were left: 5 of overdraft
    result = meter.result("r1")
    assert result is not None and result.charges[0].overdraft == 5
    assert not meter.consume("s", "tb", event_id="now").allowed
    clock.advance(seconds=30 * 60)  # 5 tokens back: the debt is paid, nothing left
    assert not meter.consume("s", "tb", event_id="half-hour").allowed
    clock.advance(seconds=6 * 60 + 1)  # one token more
    assert meter.consume("s", "tb", event_id="later").allowed


def test_a_commit_of_more_after_the_sweeper_charges_the_excess_once(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.reserve("s", "tokens", cost=3, event_id="r1", ttl_seconds=30)
    clock.advance(seconds=31)
    assert meter.sweep_reservations()["committed"] == 1
    assert meter.commit_reservation("r1", actual=5) == 0
    assert used(meter, "tokens") == 5
    assert meter.commit_reservation("r1", actual=5) == 0
    assert meter.commit_reservation("r1", actual=8) == 0
    assert used(meter, "tokens") == 5


def test_a_commit_of_more_past_the_time_to_live_is_charged(
    meter: Meter, clock: FrozenClock
) -> None:
    held = meter.reserve("s", "tokens", cost=3, event_id="r1", ttl_seconds=30)
    clock.advance(seconds=31)
    assert held.commit(actual=4) == 0
    assert used(meter, "tokens") == 4


def test_stacked_charges_give_back_below_and_charge_above_the_actual(meter: Meter) -> None:
    held = meter.reserve(charges=[("s", "tokens", 2), ("org", "b", 6)], event_id="r1")
    assert held.commit(actual=4) == 2  # "b" gives 2 back; "tokens" is charged 2 more
    assert (used(meter, "tokens"), used(meter, "b", "org")) == (4, 4)
    result = meter.result("r1")
    assert result is not None
    assert [c.cost for c in result.charges] == [4, 6]  # the give-back is the reservation's
    correction = meter.void("r1", "refund")
    assert sorted(c[2] for c in correction.charges) == [4, 4]
    assert (used(meter, "tokens"), used(meter, "b", "org")) == (0, 0)


def test_a_commit_of_more_after_a_cancel_is_refused_and_charges_nothing(meter: Meter) -> None:
    held = meter.reserve("s", "tokens", cost=3, event_id="r1")
    held.cancel()
    with pytest.raises(ReservationSettled):
        meter.commit_reservation("r1", actual=9)
    assert used(meter, "tokens") == 0
    assert overdraft_in_report(meter) == 0


def test_concurrent_commits_of_more_lose_nothing(meter: Meter) -> None:
    """Eight threads each commit their reservation at more than reserved
    while others consume: every unit is charged once."""
    held = [meter.reserve("s", "b", cost=1, event_id=f"r{n}") for n in range(8)]
    start = threading.Barrier(9)
    errors: list[BaseException] = []

    def commit(n: int) -> None:
        try:
            start.wait()
            held[n].commit(actual=20)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def consume() -> None:
        start.wait()
        for k in range(10):
            meter.consume("s", "b", event_id=f"c{k}")

    threads = [threading.Thread(target=commit, args=(n,)) for n in range(8)]
    threads.append(threading.Thread(target=consume))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    allowed = sum(1 for k in range(10) if (r := meter.result(f"c{k}")) and r.allowed)
    assert used(meter, "b") == 8 * 20 + allowed
    # 100 of room: what the commits and the consumes took beyond it is overdraft.
    assert overdraft_in_report(meter, "b") == used(meter, "b") - 100


def test_a_commit_of_more_on_a_deleted_limit_rolls_the_real_cost_up(
    meter: Meter, clock: FrozenClock
) -> None:
    """The limit is gone: no counter takes the excess, the result records the
    real cost, and so do the rows of its dimensions (the audit reads them)."""
    from metering.upkeep.audit import run_audit

    meter.set_limit(Limit("dims", 10, period="1d", window="calendar", dimensions=("route",)))
    held = meter.reserve("s", "dims", 1, event_id="r-1", metadata={"route": "/a"})
    meter.delete_limit("dims")
    assert held.commit(actual=3) == 0
    assert [c.cost for c in meter.result("r-1").charges] == [3]
    clock.advance(minutes=2)
    report = run_audit(meter, full=True)
    assert [v for v in report.violations if v.invariant == "rollup_ledger"] == []


@pytest.mark.parametrize("change", ["deleted", "made a bucket"])
def test_a_commit_of_more_on_a_limit_gone_charges_its_window(
    meter: Meter, clock: FrozenClock, change: str
) -> None:
    """The window's counter stays (a void gives back to it): defined again,
    the limit finds the real cost there, as the ledger has it."""
    from metering.upkeep.audit import run_audit

    calls = Limit("calls", 10, period="1d", window="calendar")
    meter.set_limit(calls)
    held = meter.reserve("s", "calls", 1, event_id="r-1")
    if change == "deleted":
        meter.delete_limit("calls")
    else:
        meter.set_limit(Limit("calls", 10, period="1h", algorithm="token_bucket"))
    assert held.commit(actual=3) == 0
    meter.set_limit(calls)
    assert meter.consume("s", "calls", 1).used == 4
    meter.void("r-1", "refund")
    assert [c.used for c in meter.counters("s", "calls")] == [1]
    clock.advance(minutes=2)
    assert run_audit(meter, full=True).violations == ()


def test_a_reset_clears_the_overdraft_of_the_windows_it_clears(meter: Meter) -> None:
    """The overdraft is the cleared counter's usage: it goes with the reset,
    whether or not the window is charged again after it."""
    assert meter.reserve("s", "tokens", cost=8, event_id="r").commit(actual=13) == 0
    assert overdraft_in_report(meter) == 3
    meter.reset("s")
    assert overdraft_in_report(meter) == 0
    assert meter.consume("s", "tokens", 2).allowed
    [row] = overage_report(meter, period="2026-11", limit="tokens")
    assert (row.used, row.overdraft) == (2, 0)
