"""Atomic stacking in `decide_event`, and the `Decision` an event ends with."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta

import pytest

from metering.clock import FrozenClock
from metering.domain.decisions import (
    ChargeDecision,
    ChargeInput,
    Decision,
    EventVerdict,
    decide_event,
    make_decision,
    positional,
)
from metering.domain.grants import Balance, Pot
from metering.domain.instants import from_us, to_us
from metering.domain.limits import Limit
from metering.domain.state import CounterKey, CounterState

SECOND = 1_000_000
WINDOW_START = to_us(datetime(2026, 11, 22, 11, 59, tzinfo=UTC))
WINDOW_END = WINDOW_START + 120 * SECOND
START_ISO = "2026-11-22T12:00:00+00:00"  # the frozen clock's instant (conftest.py)

USER = Limit("user_calls", maximum=10, period="2m")
ORG = Limit("org_calls", maximum=5, period="2m")
SOFT = Limit("seats", maximum=5, period="2m", enforcement="soft")
BUCKET = Limit("api", maximum=10, period="10s", algorithm="token_bucket")


def charge(limit: Limit, state: CounterState, cost: int, subject: str = "user-7") -> ChargeInput:
    if limit.algorithm == "token_bucket":
        key = CounterKey(limit.name, subject, 0, 0)
    else:
        key = CounterKey(limit.name, subject, WINDOW_START, WINDOW_END)
    return ChargeInput(limit, key, state, cost)


def as_decision(verdict: EventVerdict, clock: FrozenClock, event_id: str = "job-991") -> Decision:
    return Decision(
        event_id=event_id,
        outcome=verdict.outcome,
        charges=verdict.charges,
        occurred_at=clock(),
        decided_at=clock() + timedelta(milliseconds=5),
        denied_by=verdict.denied_by,
    )


# --------------------------------------------------------------------------- stacking


def test_stacked_event_is_denied_when_the_org_limit_does_not_fit(now_us: int) -> None:
    user_state = CounterState(used=3)
    org_state = CounterState(used=4)
    verdict = decide_event(
        [charge(USER, user_state, 2), charge(ORG, org_state, 2, subject="org-42")], now_us
    )
    assert verdict.outcome == "denied"
    assert verdict.denied_by == ("org_calls",)

    new_user, new_org = verdict.new_states
    assert new_user == user_state  # the fitting charge consumed nothing
    assert new_org.used == 4
    assert (new_org.denied_count, new_org.denied_cost) == (1, 2)
    assert new_org.first_denied_at_us == now_us

    user_decision, org_decision = verdict.charges
    assert (user_decision.allowed, user_decision.outcome) == (True, "allowed")
    assert (user_decision.used, user_decision.remaining) == (3, 7)  # figures before the event
    assert (org_decision.allowed, org_decision.outcome) == (False, "denied")
    assert (org_decision.used, org_decision.remaining) == (4, 1)
    assert org_decision.subject == "org-42"
    assert org_decision.retry_at == from_us(WINDOW_END)
    assert user_decision.retry_at is None


def test_stacked_event_consumes_every_charge_when_all_fit(now_us: int) -> None:
    user_state, org_state = CounterState(used=3), CounterState(used=1)
    verdict = decide_event(
        [charge(USER, user_state, 2), charge(ORG, org_state, 2, subject="org-42")], now_us
    )
    assert verdict.outcome == "allowed"
    assert verdict.denied_by == ()
    assert [s.used for s in verdict.new_states] == [5, 3]
    assert [c.used for c in verdict.charges] == [5, 3]
    assert [c.remaining for c in verdict.charges] == [5, 2]
    assert all(c.outcome == "allowed" for c in verdict.charges)


def test_stacked_event_names_every_limit_that_denied_it_in_order(now_us: int) -> None:
    verdict = decide_event(
        [
            charge(ORG, CounterState(used=5), 1, subject="org-42"),
            charge(SOFT, CounterState(), 1),
            charge(USER, CounterState(used=10), 1),
        ],
        now_us,
    )
    assert verdict.outcome == "denied"
    assert verdict.denied_by == ("org_calls", "user_calls")
    assert verdict.new_states[1] == CounterState()


def test_soft_charge_is_not_consumed_when_a_hard_charge_denies(now_us: int) -> None:
    soft_state = CounterState(used=7)
    verdict = decide_event(
        [charge(SOFT, soft_state, 3), charge(ORG, CounterState(used=5), 1, subject="org-42")],
        now_us,
    )
    assert verdict.outcome == "denied"
    assert verdict.denied_by == ("org_calls",)
    assert verdict.new_states[0] == soft_state
    soft_decision = verdict.charges[0]
    assert soft_decision.allowed is True
    assert soft_decision.outcome == "allowed"  # it fit, but nothing was consumed
    assert soft_decision.used == 7
    assert soft_decision.overage == 2  # the overage already there, not the new one


def test_soft_overage_with_a_fitting_hard_charge_consumes_both(now_us: int) -> None:
    verdict = decide_event(
        [charge(SOFT, CounterState(used=5), 2), charge(USER, CounterState(), 2)], now_us
    )
    assert verdict.outcome == "overage"
    assert verdict.denied_by == ()
    assert [s.used for s in verdict.new_states] == [7, 2]
    soft_decision, user_decision = verdict.charges
    assert (soft_decision.outcome, soft_decision.overage) == ("overage", 2)
    assert (user_decision.outcome, user_decision.overage) == ("allowed", 0)


def test_token_bucket_charge_is_not_consumed_when_a_window_denies(now_us: int) -> None:
    bucket_state = CounterState(used=4, tat_us=now_us + 3 * SECOND, tat_rem=0, tat_scale=10)
    verdict = decide_event(
        [charge(BUCKET, bucket_state, 1), charge(ORG, CounterState(used=5), 1, subject="org-42")],
        now_us,
    )
    assert verdict.denied_by == ("org_calls",)
    assert verdict.new_states[0] == bucket_state
    assert verdict.charges[0].remaining == 7
    assert verdict.charges[0].resets_at == from_us(now_us + 3 * SECOND)


def test_token_bucket_denial_denies_the_window_charge_too(now_us: int) -> None:
    empty = CounterState(used=10, tat_us=now_us + 10 * SECOND, tat_rem=0, tat_scale=10)
    user_state = CounterState(used=1)
    verdict = decide_event([charge(BUCKET, empty, 1), charge(USER, user_state, 1)], now_us)
    assert verdict.denied_by == ("api",)
    assert verdict.new_states[1] == user_state
    assert verdict.new_states[0].denied_count == 1
    assert verdict.charges[0].retry_at == from_us(now_us + SECOND)


def test_a_single_charge_event_is_its_charge_verdict(now_us: int) -> None:
    verdict = decide_event([charge(USER, CounterState(), 1)], now_us)
    assert verdict.outcome == "allowed"
    assert len(verdict.charges) == len(verdict.new_states) == 1


# --------------------------------------------------------------------------- Decision


def test_decision_retry_at_is_none_when_any_denied_charge_can_never_fit(
    clock: FrozenClock, now_us: int
) -> None:
    verdict = decide_event(
        [
            charge(USER, CounterState(used=10), 1),  # retry at the window end
            charge(ORG, CounterState(), 6, subject="org-42"),  # 6 > maximum 5: never
        ],
        now_us,
    )
    assert verdict.charges[0].retry_at is not None
    assert verdict.charges[1].retry_at is None
    assert as_decision(verdict, clock).retry_at is None


def test_decision_retry_at_is_the_latest_retry_of_the_denied_charges(
    clock: FrozenClock, now_us: int
) -> None:
    empty_bucket = CounterState(tat_us=now_us + 10 * SECOND, tat_scale=10)
    verdict = decide_event(
        [charge(BUCKET, empty_bucket, 2), charge(ORG, CounterState(used=5), 1, subject="org-42")],
        now_us,
    )
    decision = as_decision(verdict, clock)
    assert verdict.charges[0].retry_at == from_us(now_us + 2 * SECOND)
    assert decision.retry_at == from_us(WINDOW_END)
    assert decision.retry_at == max(c.retry_at for c in verdict.charges if c.retry_at)


def test_an_allowed_decision_has_no_retry_at(clock: FrozenClock, now_us: int) -> None:
    decision = as_decision(decide_event([charge(USER, CounterState(), 1)], now_us), clock)
    assert decision.allowed
    assert decision.retry_at is None


def test_decision_figures_describe_the_first_denying_charge(
    clock: FrozenClock, now_us: int
) -> None:
    verdict = decide_event(
        [charge(USER, CounterState(used=2), 1), charge(ORG, CounterState(used=5), 1)], now_us
    )
    decision = as_decision(verdict, clock)
    assert not decision.allowed
    assert decision.used == 5
    assert decision.maximum == 5
    assert decision.resets_at == from_us(WINDOW_END)
    assert decision.remaining == 0  # the smallest remaining of all charges


def test_decision_figures_describe_the_first_charge_when_allowed(
    clock: FrozenClock, now_us: int
) -> None:
    verdict = decide_event(
        [charge(USER, CounterState(used=2), 1), charge(ORG, CounterState(used=1), 1)], now_us
    )
    decision = as_decision(verdict, clock)
    assert decision.allowed
    assert (decision.used, decision.maximum) == (3, 10)
    assert decision.remaining == 3


@pytest.mark.parametrize(
    ("outcome", "allowed"),
    [("allowed", True), ("overage", True), ("denied", False), ("rejected", False)],
)
def test_decision_allowed_follows_the_outcome(
    clock: FrozenClock, outcome: str, allowed: bool
) -> None:
    decision = Decision(
        event_id="e1", outcome=outcome, charges=(), occurred_at=clock(), decided_at=clock()
    )  # type: ignore[arg-type]
    assert decision.allowed is allowed


def test_a_rejected_decision_without_charges_has_no_figures(clock: FrozenClock) -> None:
    decision = Decision(
        event_id="e1",
        outcome="rejected",
        charges=(),
        occurred_at=clock(),
        decided_at=clock(),
        reason="occurred_at: is more than 5 minutes in the future",
    )
    assert (decision.used, decision.remaining, decision.maximum) == (None, None, None)
    assert decision.resets_at is None
    assert decision.retry_at is None


# --------------------------------------------------------------------------- round trip


def stacked_decision(clock: FrozenClock, now_us: int) -> Decision:
    verdict = decide_event(
        [
            charge(BUCKET, CounterState(), 2),
            charge(SOFT, CounterState(used=4), 2),
            charge(ORG, CounterState(used=5), 1, subject="org-42"),
        ],
        now_us,
    )
    return as_decision(verdict, clock)


def charge_json(subject: str, limit: str, cost: int, **figures: object) -> dict[str, object]:
    """A charge as `ChargeDecision.to_dict` writes it: ``figures`` over an allowed one."""
    return {
        "subject": subject,
        "limit": limit,
        "cost": cost,
        "allowed": True,
        "outcome": "allowed",
        "used": 0,
        "remaining": 0,
        "maximum": 0,
        "overage": 0,
        "window_start": None,
        "resets_at": None,
        "retry_at": None,
        "grants": [],
        **figures,
    }


def test_decision_to_dict_is_every_field_as_json(clock: FrozenClock, now_us: int) -> None:
    data = stacked_decision(clock, now_us).to_dict()
    start, end = "2026-11-22T11:59:00+00:00", "2026-11-22T12:01:00+00:00"
    assert data == {
        "event_id": "job-991",
        "outcome": "denied",
        "allowed": False,
        "denied_by": ["org_calls"],
        "reason": None,
        "occurred_at": "2026-11-22T12:00:00+00:00",
        "decided_at": "2026-11-22T12:00:00.005000+00:00",
        "charges": [
            # A token bucket has no window.
            charge_json("user-7", "api", 2, remaining=10, maximum=10, resets_at=START_ISO),
            charge_json(
                "user-7",
                "seats",
                2,
                used=4,
                remaining=1,
                maximum=5,
                window_start=start,
                resets_at=end,
            ),
            charge_json(
                "org-42",
                "org_calls",
                1,
                allowed=False,
                outcome="denied",
                used=5,
                maximum=5,
                window_start=start,
                resets_at=end,
                retry_at=end,
            ),
        ],
        "would_deny": [],
    }
    assert json.loads(json.dumps(data)) == data


def test_decision_to_dict_carries_the_verdict_and_iso_times(
    clock: FrozenClock, now_us: int
) -> None:
    data = stacked_decision(clock, now_us).to_dict()
    assert data["event_id"] == "job-991"
    assert data["outcome"] == "denied"
    assert data["allowed"] is False
    assert data["denied_by"] == ["org_calls"]
    assert data["occurred_at"] == "2026-11-22T12:00:00+00:00"
    assert [c["limit"] for c in data["charges"]] == ["api", "seats", "org_calls"]
    assert data["charges"][0]["window_start"] is None
    assert data["charges"][2]["retry_at"] == from_us(WINDOW_END).isoformat()


def test_a_rejected_decision_to_dict_carries_its_reason(clock: FrozenClock) -> None:
    decision = Decision(
        event_id="job-7",
        outcome="rejected",
        charges=(),
        occurred_at=clock() - timedelta(days=3),
        decided_at=clock(),
        reason="occurred_at: is older than the allowed lateness of 86400 s",
    )
    assert decision.to_dict() == {
        "event_id": "job-7",
        "outcome": "rejected",
        "allowed": False,
        "denied_by": [],
        "reason": "occurred_at: is older than the allowed lateness of 86400 s",
        "occurred_at": "2026-11-19T12:00:00+00:00",
        "decided_at": START_ISO,
        "charges": [],
        "would_deny": [],
    }


def test_charge_decision_round_trips_alone(now_us: int) -> None:
    original = ChargeDecision(
        subject="visitor-1",
        limit="send_message",
        cost=3,
        allowed=False,
        outcome="denied",
        used=4,
        remaining=1,
        maximum=5,
        overage=0,
        window_start_us=WINDOW_START,
        resets_at_us=WINDOW_END,
        retry_at_us=WINDOW_END,
    )
    assert original.resets_at == from_us(WINDOW_END)
    end = "2026-11-22T12:01:00+00:00"
    assert original.to_dict() == charge_json(
        "visitor-1",
        "send_message",
        3,
        allowed=False,
        outcome="denied",
        used=4,
        remaining=1,
        maximum=5,
        window_start="2026-11-22T11:59:00+00:00",
        resets_at=end,
        retry_at=end,
    )
    assert ChargeDecision.from_row(json.loads(json.dumps(original.to_row()))) == original


# ------------------------------------------------------------ shadow limits and grants

SHADOW = Limit("trial", maximum=3, period="2m", enforcement="shadow")


def test_a_shadow_limit_records_what_it_would_deny_and_denies_nothing(now_us: int) -> None:
    verdict = decide_event(
        [charge(USER, CounterState(used=2), 2), charge(SHADOW, CounterState(used=2), 2)], now_us
    )
    assert (verdict.outcome, verdict.denied_by) == ("allowed", ())
    assert verdict.charges[1] == ChargeDecision(
        subject="user-7",
        limit="trial",
        cost=2,
        allowed=True,
        outcome="would_deny",
        used=2,
        remaining=1,
        maximum=3,
        overage=0,
        window_start_us=WINDOW_START,
        resets_at_us=WINDOW_END,
        retry_at_us=WINDOW_END,
    )
    assert verdict.charges[0].outcome == "allowed" and verdict.charges[0].used == 4
    # the hard charge consumed; the shadow one only counted a denial
    assert verdict.new_states == (
        CounterState(used=4),
        CounterState(used=2, denied_count=1, denied_cost=2, first_denied_at_us=now_us),
    )


def test_a_shadow_charge_that_fits_is_consumed_like_a_hard_one(
    clock: FrozenClock, now_us: int
) -> None:
    verdict = decide_event([charge(SHADOW, CounterState(used=1), 2)], now_us)
    assert verdict.outcome == "allowed"
    assert (verdict.charges[0].outcome, verdict.charges[0].used) == ("allowed", 3)
    assert verdict.new_states == (CounterState(used=3),)
    assert as_decision(verdict, clock).would_deny == ()


def test_a_shadow_limit_never_denies_alone_and_a_hard_denial_consumes_nothing(
    now_us: int,
) -> None:
    alone = decide_event([charge(SHADOW, CounterState(used=3), 1)], now_us)
    assert (alone.outcome, alone.denied_by) == ("allowed", ())
    assert alone.charges[0].outcome == "would_deny" and alone.charges[0].allowed is True
    both = decide_event(
        [charge(ORG, CounterState(used=5), 1), charge(SHADOW, CounterState(used=3), 1)], now_us
    )
    assert (both.outcome, both.denied_by) == ("denied", ("org_calls",))
    assert [c.outcome for c in both.charges] == ["denied", "would_deny"]


def test_a_decision_names_the_shadow_limits_that_would_have_denied_it(
    clock: FrozenClock, now_us: int
) -> None:
    verdict = decide_event(
        [
            charge(SHADOW, CounterState(used=3), 1),
            charge(USER, CounterState(), 1),
            charge(Limit("beta", maximum=1, period="2m", enforcement="shadow"), CounterState(), 2),
        ],
        now_us,
    )
    decision = as_decision(verdict, clock)
    assert decision.would_deny == ("trial", "beta")
    assert decision.to_dict()["would_deny"] == ["trial", "beta"]


def grants_pot() -> Pot:
    return Pot([Balance("bonus", 5, 1, 0, None)])


def test_a_charge_paid_by_grants_names_them_and_draws_on_the_pot(now_us: int) -> None:
    pot = grants_pot()
    topped = ChargeInput(
        ORG,
        CounterKey("org_calls", "org-42", WINDOW_START, WINDOW_END),
        CounterState(used=4),
        3,
        pot,
    )
    verdict = decide_event([topped], now_us)
    assert verdict.charges[0] == ChargeDecision(
        subject="org-42",
        limit="org_calls",
        cost=3,
        allowed=True,
        outcome="allowed",
        used=7,
        remaining=2,
        maximum=5,
        overage=0,
        window_start_us=WINDOW_START,
        resets_at_us=WINDOW_END,
        retry_at_us=None,
        grants=(("bonus", 2),),
    )
    assert pot.granted == {WINDOW_START: 2}
    assert pot.balances[0].used == 3


def test_grants_pay_nothing_when_another_charge_denies_the_event(now_us: int) -> None:
    pot = grants_pot()
    topped = ChargeInput(
        ORG,
        CounterKey("org_calls", "org-42", WINDOW_START, WINDOW_END),
        CounterState(used=4),
        3,
        pot,
    )
    verdict = decide_event([charge(USER, CounterState(used=10), 1), topped], now_us)
    assert verdict.outcome == "denied"
    assert verdict.charges[1].grants == ()
    assert (verdict.charges[1].used, verdict.charges[1].remaining) == (4, 5)
    assert pot.granted == {} and pot.balances[0].used == 1


def test_a_charge_decision_with_grants_round_trips() -> None:
    original = ChargeDecision(
        subject="org-42",
        limit="org_calls",
        cost=3,
        allowed=True,
        outcome="overage",
        used=9,
        remaining=0,
        maximum=5,
        overage=1,
        window_start_us=WINDOW_START,
        resets_at_us=WINDOW_END,
        retry_at_us=None,
        grants=(("bonus", 2), ("gift", 1)),
    )
    data = original.to_dict()
    assert data["grants"] == [{"grant_id": "bonus", "amount": 2}, {"grant_id": "gift", "amount": 1}]
    row = original.to_row()
    assert row[12:] == [[["bonus", 2], ["gift", 1]]]
    assert ChargeDecision.from_row(json.loads(json.dumps(row))) == original
    assert ChargeDecision.from_row([*row[:12], [[7, "2"]]]).grants == (("7", 2),)
    assert len(replace(original, grants=()).to_row()) == 12


def test_a_positional_maker_builds_what_the_constructor_builds() -> None:
    row = ["org", "calls", 2, True, "allowed", 5, 10, 15, 0, 1000, 2000, None]
    made = ChargeDecision.from_row(row)
    assert made == ChargeDecision(*row)  # type: ignore[arg-type]
    assert (made.grants, made.price, made.overdraft) == ((), None, 0)
    with pytest.raises(FrozenInstanceError):
        made.used = 6  # type: ignore[misc]
    at = datetime(2026, 11, 29, tzinfo=UTC)
    values = ("e", "allowed", (made,), at, at, (), True, "why", {"a": 1})
    assert make_decision(*values) == Decision(*values)  # type: ignore[arg-type]
    assert make_decision(*values).metadata == {"a": 1}


@dataclass(frozen=True, slots=True)
class _Pair:
    left: int
    right: str


def test_positional_sets_every_field_in_order() -> None:
    make = positional(_Pair)
    made = make(1, "a")
    assert type(made) is _Pair and made == _Pair(1, "a")
    assert make(right="b", left=2) == _Pair(2, "b")  # its parameters are the fields' names
    with pytest.raises(FrozenInstanceError):
        made.left = 3  # type: ignore[misc]
    row = ["org", "calls", 2, True, "allowed", 3, 7, 10, 0, 0, 100, None]
    assert positional(ChargeDecision)(*row, (), None, 0) == ChargeDecision.from_row(row)


def test_positional_refuses_a_dataclass_whose_init_does_more() -> None:
    @dataclass(frozen=True, slots=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class Derived:
        value: int
        twice: int = field(init=False, default=0)

    for cls in (Checked, Derived):
        with pytest.raises(AssertionError):
            positional(cls)


@dataclass(frozen=True, slots=True)
class _Tagged(ChargeDecision):
    """A kind of charge decision: `from_row` makes one of its own class."""


@pytest.mark.parametrize(
    "extra",
    [
        [],
        [[["g", 2]]],
        [[]],
        [[["g", 2], ["h", 1]], ["USD", 40]],
        [[], None, 3],
        [[["g", 2]], ["EUR", 7], 5],
    ],
)
def test_a_row_read_by_a_subclass_is_the_same_decision_of_its_class(extra: list[object]) -> None:
    row = ["org", "calls", 2, True, "allowed", 3, 7, 10, 0, 0, 100, None, *extra]
    tagged, plain = _Tagged.from_row(row), ChargeDecision.from_row(row)
    assert type(tagged) is _Tagged and type(plain) is ChargeDecision
    names = [f.name for f in fields(ChargeDecision)]
    assert [getattr(tagged, n) for n in names] == [getattr(plain, n) for n in names]
