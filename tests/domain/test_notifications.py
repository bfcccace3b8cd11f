"""The notification rules (`domain/notifications.py`): each notice in full.

``tests/domain/test_notifications_rules.py`` says which notices a charge
causes; this file pins down what each one carries, the threshold
arithmetic at its edges, the sweeper's steps and the payload's instants.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from metering.domain.decisions import ChargeDecision
from metering.domain.limits import Limit
from metering.domain.notifications import (
    MESSAGE_TYPES,
    SETTLED_STATUSES,
    DeliveryStatus,
    Mark,
    Notice,
    ResetStep,
    Transition,
    bucket_full_at_us,
    grant_low_document,
    notices_for,
    notices_of,
    payload_of,
    reset_due,
)
from metering.domain.state import NO_WINDOW, CounterKey, CounterState

START = 1_800_000_000_000_000  # 2027-01-15T08:00:00Z
END = START + 60_000_000
NOW = START + 1_234_567  # an instant with microseconds
KEY = CounterKey("calls", "s1", START, END)
BUCKET_KEY = CounterKey("api", "s1", NO_WINDOW, NO_WINDOW)
ODD = Limit("calls", maximum=199, period="1m", thresholds=(50,))  # 50 % is 99.5
SOFT = Limit("calls", maximum=10, period="1m", enforcement="soft", thresholds=(100,))
BUCKET = Limit("api", maximum=4, period="4s", algorithm="token_bucket", thresholds=(50,))


def decision(
    used: int,
    cost: int = 1,
    *,
    allowed: bool = True,
    maximum: int = 10,
    window_start_us: int | None = START,
    resets_at_us: int = END,
    retry_at_us: int | None = None,
) -> ChargeDecision:
    return ChargeDecision(
        subject="s1",
        limit="calls",
        cost=cost,
        allowed=allowed,
        outcome="allowed" if allowed else "denied",
        used=used,
        remaining=max(maximum - used, 0),
        maximum=maximum,
        overage=max(used - maximum, 0),
        window_start_us=window_start_us,
        resets_at_us=resets_at_us,
        retry_at_us=retry_at_us,
    )


def consumed(limit: Limit, key: CounterKey, used: int, cost: int = 1, **kw: object) -> list[Notice]:
    before, after = CounterState(used=used - cost), CounterState(used=used)
    charge = decision(used, cost, maximum=limit.maximum, **kw)  # type: ignore[arg-type]
    return notices_for(limit, key, before, after, charge, "ev-1")


# --------------------------------------------------------------------------- notices


def test_a_threshold_is_crossed_at_the_first_whole_unit_past_its_fraction() -> None:
    assert consumed(ODD, KEY, 99) == []  # 99 of 199 is 49.7 %
    assert [n.mark for n in consumed(ODD, KEY, 100)] == ["threshold:50"]
    assert consumed(ODD, KEY, 101) == []


def test_a_threshold_notice_carries_the_charge_and_its_window() -> None:
    [notice] = consumed(ODD, KEY, 100, retry_at_us=END + 5)
    assert notice == Notice(
        type="limit.threshold",
        mark="threshold:50",
        limit="calls",
        subject="s1",
        maximum=199,
        used=100,
        window_start_us=START,
        window_end_us=END,
        resets_at_us=END,
        retry_at_us=END + 5,
        event_id="ev-1",
        threshold=50,
        due_at_us=None,
    )
    assert not notice.is_bucket


def test_a_bucket_threshold_is_due_when_the_bucket_is_full() -> None:
    full_at = NOW + 2_000_000
    [notice] = consumed(BUCKET, BUCKET_KEY, 2, 2, window_start_us=None, resets_at_us=full_at)
    assert notice == Notice(
        type="limit.threshold",
        mark="threshold:50",
        limit="api",
        subject="s1",
        maximum=4,
        used=2,
        window_start_us=NO_WINDOW,
        window_end_us=NO_WINDOW,
        resets_at_us=full_at,
        retry_at_us=None,
        event_id="ev-1",
        threshold=50,
        due_at_us=full_at,
    )
    assert notice.is_bucket


def test_a_soft_limit_past_its_maximum_notifies_exceeded() -> None:
    at_maximum, past = consumed(SOFT, KEY, 10), consumed(SOFT, KEY, 12, 2)
    assert [n.mark for n in at_maximum] == ["threshold:100"]
    assert past == [
        Notice(
            type="limit.exceeded",
            mark="exceeded",
            limit="calls",
            subject="s1",
            maximum=10,
            used=12,
            window_start_us=START,
            window_end_us=END,
            resets_at_us=END,
            retry_at_us=None,
            event_id="ev-1",
        )
    ]


def test_a_denial_notice_is_due_when_the_window_resets() -> None:
    state = CounterState(used=10)
    charge = decision(10, 3, allowed=False, retry_at_us=END)
    [notice] = notices_for(SOFT, KEY, state, state.with_denial(3, NOW), charge, None)
    assert notice == Notice(
        type="limit.denied",
        mark="denied",
        limit="calls",
        subject="s1",
        maximum=10,
        used=10,
        window_start_us=START,
        window_end_us=END,
        resets_at_us=END,
        retry_at_us=END,
        event_id=None,
        due_at_us=END,
    )


def test_notices_of_a_batch_follow_the_events_and_their_charges() -> None:
    other = CounterKey("seats", "s2", START, END)
    limits = {"calls": ODD, "seats": Limit("seats", maximum=2, period="1m", thresholds=(100,))}
    transitions = [
        Transition("e1", [KEY], [CounterState(used=98)], [CounterState(used=99)], [decision(99)]),
        Transition(
            "e2",
            [other, KEY],
            [CounterState(used=1), CounterState(used=99)],
            [CounterState(used=2), CounterState(used=100)],
            [decision(2, maximum=2), decision(100, maximum=199)],
        ),
    ]
    found = notices_of(limits, transitions)
    assert [(n.event_id, n.limit, n.mark) for n in found] == [
        ("e2", "seats", "threshold:100"),
        ("e2", "calls", "threshold:50"),
    ]
    assert notices_of(limits, []) == []


def test_notices_of_refuses_a_transition_whose_parts_do_not_line_up() -> None:
    short = Transition("e1", [KEY], [CounterState(used=98)], [], [decision(99)])
    with pytest.raises(ValueError, match="zip"):
        notices_of({"calls": ODD}, [short])


# --------------------------------------------------------------------------- the sweeper


def test_a_bucket_with_no_arrival_time_is_full() -> None:
    assert bucket_full_at_us(None) == 0
    assert bucket_full_at_us(CounterState(used=3)) == 0


def test_a_bucket_is_full_at_its_exact_arrival_time_rounded_up() -> None:
    assert bucket_full_at_us(CounterState(tat_us=NOW, tat_rem=0, tat_scale=3)) == NOW
    assert bucket_full_at_us(CounterState(tat_us=NOW, tat_rem=1, tat_scale=3)) == NOW + 1
    assert bucket_full_at_us(CounterState(tat_us=NOW, tat_rem=2, tat_scale=3)) == NOW + 1
    assert type(bucket_full_at_us(CounterState(tat_us=NOW, tat_rem=2, tat_scale=3))) is int


def test_a_window_mark_that_is_no_denial_is_kept_quietly() -> None:
    mark = Mark("calls", "s1", START, END, "threshold:50", 199, "e1", END)
    assert reset_due(mark, None, END) == ResetStep(delete=False)


def test_a_bucket_mark_that_is_no_denial_is_deleted_once_the_bucket_is_full() -> None:
    mark = Mark("api", "s1", NO_WINDOW, NO_WINDOW, "threshold:50", 4, "e1", NOW)
    state = CounterState(used=2, tat_us=NOW, tat_rem=1, tat_scale=4)
    assert reset_due(mark, state, NOW) == ResetStep(reschedule_us=NOW + 1)
    assert reset_due(mark, state, NOW + 1) == ResetStep(delete=True)


def test_a_window_denial_resets_at_the_end_of_its_window() -> None:
    mark = Mark("calls", "s1", START, END, "denied", 10, "e1", END)
    assert reset_due(mark, None, END + 7) == ResetStep(
        notice=Notice(
            type="limit.reset",
            mark="reset",
            limit="calls",
            subject="s1",
            maximum=10,
            used=0,
            window_start_us=START,
            window_end_us=END,
            resets_at_us=END,
            retry_at_us=None,
            event_id="e1",
        ),
        delete=False,
    )


def test_a_bucket_denial_resets_when_the_sweeper_finds_it_full() -> None:
    mark = Mark("api", "s1", NO_WINDOW, NO_WINDOW, "denied", 4, "e1", START)
    step = reset_due(mark, CounterState(used=9, tat_us=START, tat_scale=4), NOW)
    assert step.delete and step.reschedule_us is None and step.notice is not None
    assert (step.notice.type, step.notice.resets_at_us) == ("limit.reset", NOW)
    assert (step.notice.window_start_us, step.notice.window_end_us) == (NO_WINDOW, NO_WINDOW)


# --------------------------------------------------------------------------- payloads


def test_a_payload_writes_every_instant_in_utc_to_the_microsecond() -> None:
    [notice] = consumed(ODD, KEY, 100, retry_at_us=END + 1)
    assert payload_of(notice, NOW) == {
        "type": "limit.threshold",
        "timestamp": "2027-01-15T08:00:01.234567Z",
        "data": {
            "subject": "s1",
            "limit": "calls",
            "maximum": 199,
            "used": 100,
            "threshold": 50,
            "threshold_units": None,
            "window_start": "2027-01-15T08:00:00Z",
            "window_end": "2027-01-15T08:01:00Z",
            "resets_at": "2027-01-15T08:01:00Z",
            "retry_at": "2027-01-15T08:01:00.000001Z",
            "event_id": "ev-1",
            "exhausts_at": None,  # told after the write (`metering.engine.forecasts`)
        },
    }


def test_a_bucket_payload_has_no_window() -> None:
    [notice] = consumed(BUCKET, BUCKET_KEY, 2, 2, window_start_us=None, resets_at_us=NOW)
    data = payload_of(notice, NOW)["data"]
    assert (data["window_start"], data["window_end"]) == (None, None)
    assert (data["resets_at"], data["retry_at"]) == ("2027-01-15T08:00:01.234567Z", None)


def test_the_message_types_and_delivery_statuses() -> None:
    assert MESSAGE_TYPES == (
        "limit.denied",
        "limit.threshold",
        "limit.forecast",
        "limit.quarantined",
        "limit.exceeded",
        "limit.reset",
        "limit.would_deny",
        "usage.corrected",
        "grant.low",
        "audit.violation",
    )
    assert str(DeliveryStatus.PENDING) == "pending"
    assert SETTLED_STATUSES == ("delivered", "failed")


# ----------------------------------------------------- absolute thresholds, shadow limits, grants

UNITS = Limit("calls", maximum=10, period="1m", thresholds_units=(4, 6))
UNITS_BUCKET = Limit("api", maximum=4, period="4s", algorithm="token_bucket", thresholds_units=(3,))
TRIAL = Limit("calls", maximum=3, period="1m", enforcement="shadow")


def test_an_absolute_threshold_fires_when_usage_reaches_it() -> None:
    assert consumed(UNITS, KEY, 3) == []
    [notice] = consumed(UNITS, KEY, 4, retry_at_us=END + 5)
    assert notice == Notice(
        type="limit.threshold",
        mark="units:4",
        limit="calls",
        subject="s1",
        maximum=10,
        used=4,
        window_start_us=START,
        window_end_us=END,
        resets_at_us=END,
        retry_at_us=END + 5,
        event_id="ev-1",
        threshold=None,
        due_at_us=None,
        threshold_units=4,
    )
    assert consumed(UNITS, KEY, 5) == []  # from 4 to 5: 4 was reached before


def test_one_charge_past_several_absolute_thresholds_fires_each_in_order() -> None:
    notices = consumed(UNITS, KEY, 7, 4)  # from 3 to 7
    assert [(n.mark, n.threshold_units, n.used) for n in notices] == [
        ("units:4", 4, 7),
        ("units:6", 6, 7),
    ]
    assert [n.mark for n in consumed(UNITS, KEY, 6, 2)] == ["units:6"]  # from 4 to 6


def test_a_buckets_absolute_threshold_is_due_when_the_bucket_is_full() -> None:
    full_at = NOW + 3_000_000
    [notice] = consumed(UNITS_BUCKET, BUCKET_KEY, 3, 2, window_start_us=None, resets_at_us=full_at)
    assert (notice.mark, notice.threshold_units, notice.due_at_us) == ("units:3", 3, full_at)
    assert notice.window_end_us == NO_WINDOW and notice.resets_at_us == full_at


def would_deny(before: CounterState, *, bucket: bool = False) -> list[Notice]:
    charge = ChargeDecision(
        subject="s1",
        limit="calls",
        cost=2,
        allowed=True,
        outcome="would_deny",
        used=2,
        remaining=1,
        maximum=3,
        overage=0,
        window_start_us=None if bucket else START,
        resets_at_us=END,
        retry_at_us=END,
    )
    limit = TRIAL
    key = KEY
    if bucket:
        limit = Limit(
            "calls", maximum=3, period="3s", algorithm="token_bucket", enforcement="shadow"
        )
        key = CounterKey("calls", "s1", NO_WINDOW, NO_WINDOW)
    after = replace(before, denied_count=before.denied_count + 1)
    return notices_for(limit, key, before, after, charge, "ev-9")


def test_a_shadow_limits_first_would_deny_in_a_window_notifies() -> None:
    assert would_deny(CounterState(used=2)) == [
        Notice(
            type="limit.would_deny",
            mark="would_deny",
            limit="calls",
            subject="s1",
            maximum=3,
            used=2,
            window_start_us=START,
            window_end_us=END,
            resets_at_us=END,
            retry_at_us=END,
            event_id="ev-9",
        )
    ]
    assert would_deny(CounterState(used=2, denied_count=1)) == []
    assert would_deny(CounterState(used=2, denied_count=2)) == []


def test_a_shadow_buckets_would_deny_is_a_candidate_every_time() -> None:
    [notice] = would_deny(CounterState(used=2, denied_count=3), bucket=True)
    assert (notice.type, notice.mark, notice.window_end_us) == (
        "limit.would_deny",
        "would_deny",
        NO_WINDOW,
    )
    # Its mark lasts an episode: the sweeper looks at it when the bucket is full.
    assert notice.due_at_us == END


def soft_with_grants(used_before: int, cost: int, grants: tuple[tuple[str, int], ...]) -> list[str]:
    """The marks of a soft charge from ``used_before`` (all own usage), paid in part by grants."""
    own_after = used_before + cost - sum(amount for _, amount in grants)
    charge = ChargeDecision(
        subject="s1",
        limit="calls",
        cost=cost,
        allowed=True,
        outcome="overage" if own_after > 10 else "allowed",
        used=used_before + cost,
        remaining=0,
        maximum=10,
        overage=max(own_after - 10, 0),
        window_start_us=START,
        resets_at_us=END,
        retry_at_us=None,
        grants=grants,
    )
    limit = Limit("calls", maximum=10, period="1m", enforcement="soft")
    before, after = CounterState(used=used_before), CounterState(used=used_before + cost)
    return [n.mark for n in notices_for(limit, KEY, before, after, charge, "ev-1")]


def test_a_soft_limit_topped_up_by_grants_is_exceeded_once_they_run_out() -> None:
    # 8 used, 6 more of which grants pay 3: 11 own, one past the maximum
    assert soft_with_grants(8, 6, (("g", 3),)) == ["exceeded"]
    # grants pay 4: exactly the maximum
    assert soft_with_grants(8, 6, (("g", 3), ("h", 1))) == []
    # all of the overage in the charge's own part: it starts here
    assert soft_with_grants(8, 5, (("g", 1),)) == ["exceeded"]
    # already one past: 3 more of which grants pay 1 is not where the overage started
    assert soft_with_grants(11, 3, (("g", 1),)) == []


def test_a_grant_low_document_says_what_is_left() -> None:
    row = ("g-1", "org-1", "calls", 100, 85, 80, "r-1")
    assert grant_low_document(row, 1_800_000_000_250_000) == {
        "type": "grant.low",
        "timestamp": "2027-01-15T08:00:00.250000Z",
        "data": {
            "grant_id": "g-1",
            "subject": "org-1",
            "limit": "calls",
            "amount": 100,
            "used": 85,
            "left": 15,
            "low_at": 80,
            "recurring_grant_id": "r-1",
        },
    }
