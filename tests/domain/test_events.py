"""Usage events: validation of what callers pass in, event time, fingerprints."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from metering.clock import FrozenClock
from metering.domain.events import (
    MAX_CHARGES,
    MAX_CLOUDEVENT_ID,
    Charge,
    check_event_time,
    cloudevent_event_id,
    fingerprint_of,
    make_event,
    single_fingerprint,
    validate_charges,
    validate_cost,
    validate_event_id,
    validate_filters,
    validate_metadata,
    validate_subject,
)
from metering.domain.instants import to_us
from metering.errors import InvalidInput, InvalidLimit, OccurredAtOutOfRange

DAY_S = 86_400
UUID = uuid.UUID("0b6f2a4e-4c1d-4d1e-9a3b-5f0e8c7d6a21")


# --------------------------------------------------------------------------- subject


@pytest.mark.parametrize(
    "subject",
    ["a", "visitor-1", "org 42", "10.0.0.7", "user@example.com", "ünïcødé-用户", "x" * 200],
)
def test_validate_subject_accepts_1_to_200_printable_characters(subject: str) -> None:
    assert validate_subject(subject) == subject


@pytest.mark.parametrize(
    "subject",
    [
        "",
        "x" * 201,
        "tab\there",
        "new\nline",
        "nul\x00",
        "bell\x07",
        "del\x7f",
        " leading",
        "trailing ",
        " ",
    ],
)
def test_validate_subject_rejects_empty_overlong_control_chars_and_edge_spaces(
    subject: str,
) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_subject(subject)
    assert caught.value.field == "subject"


@pytest.mark.parametrize("subject", [None, 42, b"visitor-1", ["visitor-1"], 1.0])
def test_validate_subject_rejects_non_strings(subject: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_subject(subject)
    assert caught.value.field == "subject"


# --------------------------------------------------------------------------- cost


@pytest.mark.parametrize("cost", [1, 2, 1000, 10**12])
def test_validate_cost_accepts_whole_numbers_from_one(cost: int) -> None:
    assert validate_cost(cost) == cost


@pytest.mark.parametrize(
    "cost", [0, -1, 1.5, 1.0, True, False, 10**13, 10**12 + 1, "3", None, float("nan")]
)
def test_validate_cost_rejects_zero_negative_fractional_bool_huge_and_strings(
    cost: object,
) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_cost(cost)
    assert caught.value.field == "cost"


# --------------------------------------------------------------------------- event id


@pytest.mark.parametrize(
    "event_id",
    [UUID.hex, str(UUID), "job-991", "a", "x" * 128, "tenant:job/7+retry=2@q_1.x"],
)
def test_validate_event_id_accepts_ids_of_the_documented_charset(event_id: str) -> None:
    assert validate_event_id(event_id) == event_id


@pytest.mark.parametrize(
    "event_id", ["", "x" * 129, "job 991", " job", "job\n", "job#1", "jöb", "job\t1"]
)
def test_validate_event_id_rejects_empty_overlong_spaces_and_other_chars(event_id: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_event_id(event_id)
    assert caught.value.field == "event_id"


@pytest.mark.parametrize("event_id", [None, 991, UUID, b"job-991"])
def test_validate_event_id_rejects_non_strings(event_id: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_event_id(event_id)
    assert caught.value.field == "event_id"


# --------------------------------------------------------------------------- charges


def test_validate_charges_builds_charges_with_a_default_cost_of_one() -> None:
    charges = validate_charges([("org-42", "api_calls", 2), ["user-7", "user_calls"]])
    assert charges == (Charge("org-42", "api_calls", 2), Charge("user-7", "user_calls", 1))
    assert all(isinstance(c, Charge) for c in charges)


def test_validate_charges_accepts_the_maximum_number_of_charges() -> None:
    charges = [(f"user-{i}", "api_calls", 1) for i in range(MAX_CHARGES)]
    assert len(validate_charges(charges)) == 32


def test_validate_charges_allows_one_subject_on_several_limits() -> None:
    charges = validate_charges([("user-7", "a"), ("user-7", "b"), ("user-8", "a")])
    assert len(charges) == 3


def test_validate_charges_rejects_the_same_subject_and_limit_twice() -> None:
    with pytest.raises(InvalidInput, match="once per event") as caught:
        validate_charges([("user-7", "api_calls", 1), ("user-7", "api_calls", 2)])
    assert caught.value.field == "charges"


def test_validate_charges_rejects_an_empty_list() -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_charges([])
    assert caught.value.field == "charges"


def test_validate_charges_rejects_more_than_32_charges() -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_charges([(f"user-{i}", "api_calls", 1) for i in range(MAX_CHARGES + 1)])
    assert caught.value.field == "charges"


@pytest.mark.parametrize(
    "item",
    [
        ("user-7",),
        ("user-7", "api_calls", 1, "extra"),
        (),
        "user-7",
        {"subject": "user-7", "limit": "api_calls"},
        None,
        42,
    ],
)
def test_validate_charges_rejects_items_that_are_not_subject_limit_cost(item: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_charges([item])
    assert caught.value.field == "charges"


@pytest.mark.parametrize("charges", ["user-7", b"user-7"])
def test_validate_charges_rejects_a_string_instead_of_a_list(charges: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_charges(charges)  # type: ignore[arg-type]
    assert caught.value.field == "charges"


@pytest.mark.parametrize(
    ("item", "field"),
    [
        (("", "api_calls", 1), "subject"),
        (("user-7", "API calls", 1), "name"),
        (("user-7", "api_calls", -1), "cost"),
        (("user-7", "api_calls", 1.5), "cost"),
        (("user-7", "api_calls", 0.0), "cost"),
        (("user-7", "api_calls", False), "cost"),
    ],
)
def test_validate_charges_validates_each_part(item: tuple[object, ...], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_charges([item])
    assert caught.value.field == field


def test_a_charge_of_0_is_an_event_the_limit_judges() -> None:
    """A gauge reports a level of 0; a sum refuses 0 once its limit is known (`refuse_free`)."""
    assert validate_charges([("user-7", "api_calls", 0)])[0].cost == 0


def test_a_malformed_limit_name_in_a_charge_is_an_invalid_limit() -> None:
    with pytest.raises(InvalidLimit):
        validate_charges([("user-7", "API")])


@pytest.mark.parametrize("charges", [5, None])
def test_validate_charges_rejects_a_non_iterable_as_invalid_input(charges: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_charges(charges)  # type: ignore[arg-type]
    assert caught.value.field == "charges"


# --------------------------------------------------------------------------- metadata


def test_validate_metadata_accepts_none_and_json_mappings() -> None:
    assert validate_metadata(None) is None
    metadata = {"job": 991, "tags": ["a", "b"], "nested": {"ok": True, "x": None, "f": 1.5}}
    assert validate_metadata(metadata) == metadata


def test_validate_metadata_returns_a_copy() -> None:
    original = {"job": 991}
    copy = validate_metadata(original)
    original["job"] = 992
    assert copy == {"job": 991}


@pytest.mark.parametrize("metadata", [["job", 991], "job=991", 991, b"{}", ("a", 1)])
def test_validate_metadata_rejects_non_mappings(metadata: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_metadata(metadata)
    assert caught.value.field == "metadata"


@pytest.mark.parametrize(
    "metadata",
    [
        {"when": datetime(2026, 1, 1, tzinfo=UTC)},
        {"tags": {"a", "b"}},
        {"raw": b"bytes"},
        {"obj": object()},
        {(1, 2): "tuple key"},
    ],
)
def test_validate_metadata_rejects_values_that_are_not_json(metadata: object) -> None:
    with pytest.raises(InvalidInput, match="JSON") as caught:
        validate_metadata(metadata)
    assert caught.value.field == "metadata"


def test_validate_metadata_rejects_a_circular_mapping() -> None:
    looped: dict[str, object] = {}
    looped["self"] = looped
    with pytest.raises(InvalidInput) as caught:
        validate_metadata(looped)
    assert caught.value.field == "metadata"


def test_validate_metadata_accepts_8192_bytes_and_rejects_more() -> None:
    overhead = len('{"k":""}')
    fits = {"k": "x" * (8192 - overhead)}
    assert validate_metadata(fits) == fits
    with pytest.raises(InvalidInput, match="larger") as caught:
        validate_metadata({"k": "x" * (8193 - overhead)})
    assert caught.value.field == "metadata"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_validate_metadata_rejects_nan_and_infinity(value: float) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_metadata({"ratio": value})
    assert caught.value.field == "metadata"


def test_validate_metadata_rejects_deeply_nested_metadata_as_invalid_input() -> None:
    nested: dict[str, object] = {}
    inner = nested
    for _ in range(100_000):
        inner["a"] = {}
        inner = inner["a"]  # type: ignore[assignment]
    with pytest.raises(InvalidInput) as caught:
        validate_metadata(nested)
    assert caught.value.field == "metadata"


# --------------------------------------------------------------------------- make_event


def test_make_event_validates_and_keeps_its_parts(clock: FrozenClock) -> None:
    event = make_event(
        [("org-42", "api_calls", 2), ("user-7", "user_calls", 2)],
        clock(),
        event_id="job-991",
        metadata={"job": 991},
    )
    assert event.event_id == "job-991"
    assert event.charges == (
        Charge("org-42", "api_calls", 2),
        Charge("user-7", "user_calls", 2),
    )
    assert event.occurred_at == clock()
    assert event.occurred_at_us == to_us(clock())
    assert event.metadata == {"job": 991}


def test_make_event_generates_a_fresh_event_id_when_none_is_given(clock: FrozenClock) -> None:
    first = make_event([("user-7", "api")], clock())
    second = make_event([("user-7", "api")], clock())
    assert re.fullmatch(r"[0-9a-f]{32}", first.event_id)
    assert validate_event_id(first.event_id) == first.event_id
    assert first.event_id != second.event_id


def test_make_event_rejects_a_naive_datetime() -> None:
    with pytest.raises(InvalidInput) as caught:
        make_event([("user-7", "api")], datetime(2026, 11, 22, 12, 0))
    assert caught.value.field == "occurred_at"


@pytest.mark.parametrize("occurred_at", ["2026-11-22T12:00:00Z", 1_795_000_000, None])
def test_make_event_rejects_an_occurred_at_that_is_not_a_datetime(occurred_at: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        make_event([("user-7", "api")], occurred_at)  # type: ignore[arg-type]
    assert caught.value.field == "occurred_at"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"event_id": "job 991"}, "event_id"),
        ({"metadata": ["x"]}, "metadata"),
        ({"charges": []}, "charges"),
        ({"charges": [("", "api")]}, "subject"),
    ],
)
def test_make_event_rejects_any_bad_part(
    clock: FrozenClock, kwargs: dict[str, object], field: str
) -> None:
    arguments: dict[str, object] = {"charges": [("user-7", "api")], "occurred_at": clock()}
    arguments.update(kwargs)
    with pytest.raises(InvalidInput) as caught:
        make_event(**arguments)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_make_event_accepts_an_aware_non_utc_datetime(clock: FrozenClock) -> None:
    local = clock().astimezone(timezone(timedelta(hours=-5)))
    event = make_event([("user-7", "api")], local)
    assert event.occurred_at_us == to_us(clock())


# --------------------------------------------------------------------------- event time


def test_an_event_up_to_five_minutes_in_the_future_is_accepted(clock: FrozenClock) -> None:
    now_us = to_us(clock())
    check_event_time(clock() + timedelta(minutes=5), now_us, DAY_S)
    check_event_time(clock() + timedelta(minutes=1), now_us, DAY_S)
    check_event_time(clock(), now_us, DAY_S)


def test_an_event_more_than_five_minutes_in_the_future_is_rejected(clock: FrozenClock) -> None:
    too_soon = clock() + timedelta(minutes=5, microseconds=1)
    with pytest.raises(OccurredAtOutOfRange, match="future") as caught:
        check_event_time(too_soon, to_us(clock()), DAY_S)
    assert caught.value.field == "occurred_at"
    assert caught.value.occurred_at == too_soon
    assert isinstance(caught.value, InvalidInput)


def test_an_event_exactly_as_old_as_the_lateness_is_accepted(clock: FrozenClock) -> None:
    check_event_time(clock() - timedelta(days=1), to_us(clock()), DAY_S)
    check_event_time(clock() - timedelta(seconds=30), to_us(clock()), 30)


def test_an_event_older_than_the_lateness_is_rejected(clock: FrozenClock) -> None:
    too_late = clock() - timedelta(days=1, microseconds=1)
    with pytest.raises(OccurredAtOutOfRange, match="lateness") as caught:
        check_event_time(too_late, to_us(clock()), DAY_S)
    assert caught.value.occurred_at == too_late


def test_lateness_is_the_limit_own_allowance(clock: FrozenClock) -> None:
    two_hours_ago = clock() - timedelta(hours=2)
    check_event_time(two_hours_ago, to_us(clock()), DAY_S)
    with pytest.raises(OccurredAtOutOfRange):
        check_event_time(two_hours_ago, to_us(clock()), 3600)


def test_event_time_follows_the_clock(clock: FrozenClock) -> None:
    occurred_at = clock() + timedelta(minutes=10)
    with pytest.raises(OccurredAtOutOfRange):
        check_event_time(occurred_at, to_us(clock()), DAY_S)
    clock.advance(minutes=5)
    check_event_time(occurred_at, to_us(clock()), DAY_S)


def test_check_event_time_rejects_a_naive_datetime(clock: FrozenClock) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_event_time(datetime(2026, 11, 22, 12, 0), to_us(clock()), DAY_S)
    assert caught.value.field == "occurred_at"


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_does_not_depend_on_charge_order(clock: FrozenClock) -> None:
    charges = [("org-42", "api_calls", 2), ("user-7", "user_calls", 2), ("user-7", "a", 1)]
    first = make_event(charges, clock(), event_id="job-991")
    second = make_event(list(reversed(charges)), clock(), event_id="job-991")
    assert first.charges != second.charges
    assert first.fingerprint() == second.fingerprint()


def test_fingerprint_differs_when_a_cost_differs(clock: FrozenClock) -> None:
    first = make_event([("org-42", "api_calls", 2), ("user-7", "u", 2)], clock(), "job-991")
    second = make_event([("org-42", "api_calls", 3), ("user-7", "u", 2)], clock(), "job-991")
    assert first.fingerprint() != second.fingerprint()


def test_fingerprint_differs_when_a_subject_or_limit_differs(clock: FrozenClock) -> None:
    base = make_event([("user-7", "api")], clock()).fingerprint()
    assert make_event([("user-8", "api")], clock()).fingerprint() != base
    assert make_event([("user-7", "api2")], clock()).fingerprint() != base


def test_fingerprint_treats_the_default_cost_as_an_explicit_one(clock: FrozenClock) -> None:
    implicit = make_event([("user-7", "api")], clock())
    explicit = make_event([("user-7", "api", 1)], clock())
    assert implicit.fingerprint() == explicit.fingerprint()


def test_fingerprint_ignores_event_time_and_metadata(clock: FrozenClock) -> None:
    first = make_event([("user-7", "api")], clock(), "e1", {"a": 1})
    second = make_event([("user-7", "api")], clock() - timedelta(minutes=1), "e1", {"a": 2})
    assert first.fingerprint() == second.fingerprint()


@pytest.mark.parametrize(
    "metadata", [{"note": "\udc80"}, {"\ud800": 1}, {"deep": [{"x": "a\ud83d"}]}]
)
def test_validate_metadata_rejects_lone_surrogates(metadata: object) -> None:
    """Not text: no database stores it, and it used to fail a whole queued batch."""
    with pytest.raises(InvalidInput, match="Unicode") as caught:
        validate_metadata(metadata)
    assert caught.value.field == "metadata"


def test_validate_metadata_accepts_characters_outside_the_basic_plane() -> None:
    assert validate_metadata({"emoji": "😀", "accent": "é"}) == {"emoji": "😀", "accent": "é"}


@pytest.mark.parametrize("bad_id", ["bad-\ud800", "bad-\x00", "x" * 129, "with space"])
def test_a_malformed_queued_event_keeps_its_id_only_when_the_id_is_valid(bad_id: str) -> None:
    from metering.pipeline.messages import decode_records

    item = {"id": bad_id, "charges": [["s", "calls", 1]], "at": 1_795_000_000_000_000}
    events, rejected = decode_records({"v": 1, "events": [item]})
    assert events == []
    [row] = rejected
    assert row.event_id is None
    row.raw.encode()  # storable text
    row.reason.encode()


def test_a_fingerprint_is_computed_on_first_use_and_kept() -> None:
    """The queued path never asks for it: it is not computed until asked."""
    event = make_event([("org-1", "api", 2), ("org-0", "api", 1)], datetime(2026, 1, 1, tzinfo=UTC))
    assert event._fingerprint is None
    assert event.fingerprint() == '[["org-0","api",1],["org-1","api",2]]'
    assert event._fingerprint == event.fingerprint()
    assert event.record().fingerprint == event.fingerprint()


def test_two_charges_of_one_pair_are_refused_and_two_pairs_are_not() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(InvalidInput, match="once per event"):
        make_event([("org-1", "api", 1), ("org-1", "api", 2)], at)
    assert len(make_event([("org-1", "api", 1), ("org-2", "api", 2)], at).charges) == 2


def test_a_fingerprint_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from metering.domain import events

    calls: list[object] = []
    encode = events.fingerprint_of

    def counted(charges: object) -> str:
        calls.append(charges)
        return encode(charges)  # type: ignore[arg-type]

    monkeypatch.setattr(events, "fingerprint_of", counted)
    event = make_event([("org-1", "api", 2)], datetime(2026, 1, 1, tzinfo=UTC))
    assert event.fingerprint() == event.fingerprint() == event.record().fingerprint
    assert len(calls) == 1


def test_validate_filters_checks_each_filter_given_and_skips_none() -> None:
    validate_filters(None, None)
    validate_filters("org-1", None)
    validate_filters(None, "api_calls")
    with pytest.raises(InvalidInput) as subject:
        validate_filters(" org", None)
    assert subject.value.field == "subject"
    with pytest.raises(InvalidInput) as subject_first:
        validate_filters("", "no spaces allowed")
    assert subject_first.value.field == "subject"
    with pytest.raises(InvalidLimit) as limit:
        validate_filters("org-1", "no spaces allowed")
    assert limit.value.field == "name"


def test_a_cloudevent_id_is_its_id_and_a_digest_of_its_source() -> None:
    digest = hashlib.sha256("https://a.example/é".encode()).hexdigest()[:16]
    assert cloudevent_event_id("https://a.example/é", "a@b") == f"a@b@{digest}"
    # A lone surrogate in the source is hashed, not an error.
    lone = hashlib.sha256("s\ud800".encode("utf-8", "surrogatepass")).hexdigest()[:16]
    assert cloudevent_event_id("s\ud800", "x") == f"x@{lone}"
    longest = "i" * MAX_CLOUDEVENT_ID
    assert len(cloudevent_event_id("s", longest)) == 128
    with pytest.raises(InvalidInput) as too_long:
        cloudevent_event_id("s", longest + "i")
    assert str(too_long.value) == f"id: must be at most {MAX_CLOUDEVENT_ID} characters"
    with pytest.raises(InvalidInput) as bad:
        cloudevent_event_id("s", "no spaces")
    assert str(bad.value).startswith("id: ")


@pytest.mark.parametrize(
    "charge",
    [
        (5, "calls", 1),
        ("org", 5, 1),
        ("org", "calls", "1"),
        ("org", "calls", True),
        ("orgé", "calls", 1),
        ("org\n", "calls", 1),
        ('or"g', "calls", 1),
        ("or\\g", "calls", 1),
        ("org", "callé", 1),
        ("org", "calls\t", 1),
        ("org", 'ca"lls', 1),
        ("org", "ca\\lls", 1),
    ],
)
def test_a_charge_needing_escapes_is_fingerprinted_by_the_encoder(
    charge: tuple[object, ...],
) -> None:
    assert single_fingerprint(*charge) is None
    assert fingerprint_of([charge]) == json.dumps([list(charge)], separators=(",", ":"))


def test_a_plain_charge_is_fingerprinted_without_the_encoder() -> None:
    assert single_fingerprint("org-1 x", "calls", 3) == '[["org-1 x","calls",3]]'
    assert fingerprint_of([("org-1 x", "calls", 3)]) == '[["org-1 x","calls",3]]'
    # Rows of another length take the encoder's way too.
    assert fingerprint_of([("org", "calls")]) == '[["org","calls"]]'
    assert fingerprint_of([("org", "calls", 1, "x")]) == '[["org","calls",1,"x"]]'


@pytest.mark.parametrize("cost", [True, 1.0])
def test_a_remembered_fingerprint_is_never_that_of_an_equal_cost_of_another_type(
    cost: object,
) -> None:
    # 1, True and 1.0 are equal keys of a dict: each is still fingerprinted as it is written.
    assert fingerprint_of([("org-remembered", "calls", 1)]) == '[["org-remembered","calls",1]]'
    found = fingerprint_of([("org-remembered", "calls", cost)])
    assert found == json.dumps([["org-remembered", "calls", cost]], separators=(",", ":"))
    assert fingerprint_of((("org-remembered", "calls", 1), ("org-remembered", "calls", cost))) == (
        json.dumps(
            sorted([["org-remembered", "calls", 1], ["org-remembered", "calls", cost]]),
            separators=(",", ":"),
        )
    )


def test_fingerprints_are_remembered_up_to_a_bound() -> None:
    from metering.domain import events

    for n in range(events._SINGLES_KEPT + 10):
        assert fingerprint_of([(f"org-{n}", "calls", 2)]) == f'[["org-{n}","calls",2]]'
    assert len(events._SINGLES) <= events._SINGLES_KEPT
    assert fingerprint_of([("org-1", "calls", 2)]) == '[["org-1","calls",2]]'


def test_a_fingerprint_sorts_its_charges_by_subject_then_limit_then_cost() -> None:
    assert fingerprint_of([("s", "b", 1), ("s", "a", 2)]) == '[["s","a",2],["s","b",1]]'
    assert fingerprint_of([("s", "a", 2), ("s", "a", 1)]) == '[["s","a",1],["s","a",2]]'


def test_a_fingerprint_of_unvalidated_values_is_the_encoders() -> None:
    """What no charge holds (a list for a subject, a limit or a cost) is
    written as JSON, never looked up among the remembered ones."""
    assert fingerprint_of([[["a"], "l", 1]]) == '[[["a"],"l",1]]'
    assert fingerprint_of([["a", ["l"], 1]]) == '[["a",["l"],1]]'
    assert fingerprint_of([["a", "l", [1]]]) == '[["a","l",[1]]]'
