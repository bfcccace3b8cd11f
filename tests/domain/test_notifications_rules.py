"""The pure rules: (limit, before, after, charge decision) -> candidate notices."""

from __future__ import annotations

from dataclasses import replace

from metering.domain.decisions import ChargeDecision
from metering.domain.limits import Limit
from metering.domain.notifications import (
    Mark,
    Notice,
    Transition,
    bucket_full_at_us,
    notices_for,
    notices_of,
    payload_of,
    reset_due,
)
from metering.domain.state import NO_WINDOW, CounterKey, CounterState

START = 1_800_000_000_000_000
END = START + 60_000_000
KEY = CounterKey("calls", "s1", START, END)
HARD = Limit("calls", maximum=10, period="1m", thresholds=(80, 100))
SOFT = Limit("calls", maximum=10, period="1m", enforcement="soft")


def charge(used: int, cost: int = 1, *, allowed: bool = True, maximum: int = 10) -> ChargeDecision:
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
        window_start_us=START,
        resets_at_us=END,
        retry_at_us=None if allowed else END,
    )


def kinds(notices: list) -> list[str]:  # type: ignore[type-arg]
    return [n.mark for n in notices]


def test_crossing_a_threshold_is_a_candidate_once_reaching_it() -> None:
    assert (
        kinds(notices_for(HARD, KEY, CounterState(used=6), CounterState(used=7), charge(7), "e"))
        == []
    )
    found = notices_for(HARD, KEY, CounterState(used=7), CounterState(used=8), charge(8), "e")
    assert kinds(found) == ["threshold:80"]
    assert found[0].threshold == 80 and found[0].used == 8 and found[0].due_at_us is None
    assert (
        kinds(notices_for(HARD, KEY, CounterState(used=8), CounterState(used=9), charge(9), "e"))
        == []
    )


def test_one_big_charge_crosses_every_threshold_it_jumps() -> None:
    found = notices_for(HARD, KEY, CounterState(used=0), CounterState(used=10), charge(10, 10), "e")
    assert kinds(found) == ["threshold:80", "threshold:100"]


def test_only_the_first_denial_of_a_window_is_a_candidate() -> None:
    before, after = CounterState(used=10), CounterState(used=10, denied_count=1, denied_cost=1)
    first = notices_for(HARD, KEY, before, after, charge(10, allowed=False), "e1")
    assert kinds(first) == ["denied"]
    assert first[0].due_at_us == END and first[0].event_id == "e1"
    again = CounterState(used=10, denied_count=2, denied_cost=2)
    assert notices_for(HARD, KEY, after, again, charge(10, allowed=False), "e2") == []


def test_a_soft_limit_exceeds_once_when_usage_passes_the_maximum() -> None:
    found = notices_for(SOFT, KEY, CounterState(used=10), CounterState(used=11), charge(11), "e")
    assert kinds(found) == ["exceeded"]
    at_max = notices_for(SOFT, KEY, CounterState(used=9), CounterState(used=10), charge(10), "e")
    assert at_max == []


def test_a_soft_gauge_exceeds_once_when_its_level_passes_the_maximum() -> None:
    gauge = Limit("calls", maximum=10, period="1m", enforcement="soft", aggregation="max")

    def level(before: int, after: int) -> list[str]:
        found = notices_for(
            gauge,
            KEY,
            CounterState(used=before),
            CounterState(used=after),
            charge(after, after),
            "e",
        )
        return kinds(found)

    assert level(10, 12) == ["exceeded"]  # from the maximum itself
    assert level(3, 11) == ["exceeded"]
    assert level(11, 12) == []  # past it already
    assert level(5, 8) == []  # within it
    assert level(8, 10) == []  # at it


def test_a_charge_that_fit_in_a_denied_stacked_event_consumed_nothing() -> None:
    same = CounterState(used=7)
    assert notices_for(HARD, KEY, same, same, charge(7, allowed=True), "e") == []


def test_a_buckets_threshold_is_of_the_tokens_in_use_not_of_all_ever_taken() -> None:
    bucket = Limit("api", maximum=10, period="10s", algorithm="token_bucket", thresholds=(80,))
    key = CounterKey("api", "s1", NO_WINDOW, NO_WINDOW)
    taken, more = CounterState(used=100), CounterState(used=101)  # tokens taken, ever
    [crossed] = notices_for(bucket, key, taken, more, charge(8), "e")  # 7 in use, then 8
    assert (crossed.mark, crossed.used, crossed.due_at_us) == ("threshold:80", 8, END)
    assert notices_for(bucket, key, taken, more, charge(7), "e") == []
    assert notices_for(bucket, key, taken, more, charge(9), "e") == []


def test_buckets_denial_is_due_when_the_bucket_is_full_and_reset_waits_for_it() -> None:
    bucket = Limit("api", maximum=10, period="10s", algorithm="token_bucket")
    key = CounterKey("api", "s1", NO_WINDOW, NO_WINDOW)
    state = CounterState(used=11, denied_count=5, tat_us=START + 10_000_000, tat_scale=1)
    found = notices_for(bucket, key, state, state, charge(10, allowed=False), "e")
    assert kinds(found) == ["denied"]  # buckets: the mark decides "once per episode"
    mark = Mark("api", "s1", NO_WINDOW, NO_WINDOW, "denied", 10, "e", END)
    assert bucket_full_at_us(state) == START + 10_000_000
    assert reset_due(mark, state, START).reschedule_us == START + 10_000_000
    step = reset_due(mark, state, START + 10_000_000)
    assert step.delete and step.notice is not None and step.notice.type == "limit.reset"


def test_a_window_reset_keeps_the_mark_and_describes_the_window_that_ended() -> None:
    mark = Mark("calls", "s1", START, END, "denied", 10, "e1", END)
    step = reset_due(mark, None, END)
    assert not step.delete and step.notice is not None
    data = payload_of(step.notice, END)["data"]
    assert data["used"] == 0 and data["event_id"] == "e1"
    assert data["window_end"] == data["resets_at"]
    threshold = Mark("calls", "s1", START, END, "threshold:80", 10, "e1", END)
    assert reset_due(threshold, None, END).notice is None


def test_payload_carries_the_fields_receivers_need() -> None:
    [notice] = notices_for(
        HARD,
        KEY,
        CounterState(used=10),
        CounterState(used=10, denied_count=1),
        charge(10, allowed=False),
        "e9",
    )
    document = payload_of(notice, START)
    assert document["type"] == "limit.denied"
    assert document["timestamp"].endswith("Z")
    assert set(document["data"]) == {
        "subject",
        "limit",
        "maximum",
        "used",
        "threshold",
        "threshold_units",
        "window_start",
        "window_end",
        "resets_at",
        "retry_at",
        "event_id",
    }


def test_a_hard_limits_overdraft_is_exceeded_once_it_starts() -> None:
    plain = Limit("calls", maximum=10, period="1m")
    over = replace(charge(12, 3), overdraft=2)
    found = notices_for(plain, KEY, CounterState(used=9), CounterState(used=12), over, "e")
    assert found == [
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
            event_id="e",
        )
    ]
    one = replace(charge(11, 2), overdraft=1)
    assert kinds(
        notices_for(plain, KEY, CounterState(used=9), CounterState(used=11), one, "e")
    ) == ["exceeded"]
    # A shadow limit's excess is no overdraft; a soft one's is overage, notified as such.
    shadow = Limit("calls", maximum=10, period="1m", enforcement="shadow")
    assert notices_for(shadow, KEY, CounterState(used=9), CounterState(used=12), over, "e") == []


def test_a_subjects_own_thresholds_replace_the_limits() -> None:
    own = {("calls", "s1"): Limit("calls", maximum=10, period="1m", thresholds=(50,))}
    step = Transition("e", [KEY], [CounterState(used=4)], [CounterState(used=5)], [charge(5)])
    assert kinds(notices_of({"calls": HARD}, [step], own)) == ["threshold:50"]
    assert kinds(notices_of({"calls": HARD}, [step], {})) == []
    other = {("calls", "s2"): own[("calls", "s1")]}
    assert kinds(notices_of({"calls": HARD}, [step], other)) == []
