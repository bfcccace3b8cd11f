"""The one-pass decoding of queued events (`metering.pipeline.messages._plain_record`)
gives what the general decoding (`_decode_record`) gives, for any input.

The usual event (an id, charges of three values on distinct pairs, no
metadata or an object of it) is decoded by a path of its own; everything else
goes through the general one. Hostile
messages (wrong types, huge integers, NaN, lone surrogates as left by
non-UTF-8 input, quotes and escapes, repeated ids) must decode to the same
records, and be refused with the same reasons, as before that path existed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from budgets import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.domain.events import fingerprint_of, single_fingerprint
from metering.domain.instants import MAX_US, MIN_US
from metering.pipeline import messages

AT = 1_795_000_000_000_000

SUBJECTS = st.one_of(
    st.sampled_from(
        [
            "org-1",
            "a",
            "x" * 200,
            "x" * 201,
            "",
            " edge",
            "edge ",
            'quo"te',
            "back\\slash",
            "tab\there",
            "é-accent",
            "emoji-😀",
            "lone-\ud800",
            "nul-\x00",
            "del-\x7f",
            "slash/ok",
        ]
    ),
    st.text(max_size=8),
    st.integers(),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
)
LIMITS = st.one_of(
    st.sampled_from(["calls", "api_calls", "a.b:c-d", "Calls", "", "x" * 65, 'c"s', "c\\s"]),
    st.text(max_size=4),
    st.integers(),
)
COSTS = st.one_of(
    st.sampled_from([1, 2, 10**12, 10**12 + 1, 0, -1, 10**40, -(10**40), True, False]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.none(),
)
CHARGE = st.one_of(
    st.lists(st.one_of(SUBJECTS, LIMITS, COSTS), min_size=0, max_size=4),
    st.tuples(SUBJECTS, LIMITS, COSTS).map(list),
    st.tuples(SUBJECTS, LIMITS).map(list),
    st.tuples(SUBJECTS, LIMITS, COSTS),
    st.just({"subject": "org-1"}),
    st.just("org-1,calls,1"),
)
CHARGES = st.one_of(
    st.lists(CHARGE, max_size=3),
    st.just([["org-1", "calls", 1], ["org-1", "calls", 2]]),
    st.just([["org-1", "calls", 1], ["org-2", "calls", 2]]),
    st.just("org-1"),
    st.none(),
    st.integers(),
)
IDS = st.one_of(
    st.sampled_from(["e1", "e2", "x" * 128, "x" * 129, "with space", "bad-\ud800", "nul-\x00"]),
    st.text(max_size=6),
    st.none(),
    st.integers(),
    st.booleans(),
)
ATS = st.one_of(
    st.just(AT),
    st.sampled_from([MIN_US, MAX_US, MIN_US - 1, MAX_US + 1, 10**30, -(10**30), 0, True]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.none(),
)
METAS = st.one_of(
    st.none(),
    st.just({"route": "/v1"}),
    st.just({"nan": float("nan")}),
    st.just({"big": 10**40}),
    st.just({"lone": "\udcff"}),
    st.just({"long": "x" * 9000}),
    st.just({"user": "user-3", "n": [1, 2.5, None, True], "deep": {"a": {}}}),
    st.just({"é": "\u00e9", "q": 'a"b'}),
    st.just([1, 2]),
    st.just("text"),
)


@st.composite
def items(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.none(), st.integers(), st.text(max_size=3), st.just([1])))
    item: dict[str, Any] = {}
    for key, values in (("id", IDS), ("charges", CHARGES), ("at", ATS), ("meta", METAS)):
        if draw(st.integers(0, 9)) > 0:  # each key is sometimes missing
            item[key] = draw(values)
    if draw(st.booleans()):
        item["extra"] = draw(st.integers())
    return item


@st.composite
def plain_items(draw: st.DrawFn) -> dict[str, Any]:
    """Well-formed usual events with at most one value made hostile."""
    subject, limit, cost = "org-1", "calls", 1
    item: dict[str, Any] = {"id": draw(st.sampled_from(["e1", "e2", "e3"])), "at": AT}
    kinds = ["none", "id", "at", "subject", "limit", "cost", "meta", "charges", "short"]
    hostile = draw(st.sampled_from(kinds))
    if hostile == "id":
        item["id"] = draw(IDS)
    elif hostile == "at":
        item["at"] = draw(ATS)
    elif hostile == "subject":
        subject = draw(SUBJECTS)
    elif hostile == "limit":
        limit = draw(LIMITS)
    elif hostile == "cost":
        cost = draw(COSTS)
    elif hostile == "meta":
        item["meta"] = draw(METAS)
    item["charges"] = [[subject, limit, cost]]
    if draw(st.booleans()):  # as the mix charges: more charges, and metadata
        item["charges"] += [["org-1", "seats", 1], ["org-2", "calls", 2]][: draw(st.integers(1, 2))]
        if hostile != "meta":
            item["meta"] = {"user": draw(st.sampled_from(["user-1", "u\u00e9", 'q"'])), "n": 1}
    if hostile == "charges":
        item["charges"] = draw(CHARGES)
    elif hostile == "short":  # no cost: 1
        item["charges"] = [[subject, limit]]
    return item


def general_only(payload: object) -> Any:
    """What decoding gave before the one-pass path: the general path for every event."""
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(messages, "_plain_record", lambda item: None)
        return messages.decode_records(payload)


def assert_same_as_general(payload: object) -> None:
    events, rejected = messages.decode_records(payload)
    events_before, rejected_before = general_only(payload)
    # Generated ids (an event without one) differ from run to run.
    assert [e for e in events if e.event_id in json.dumps(payload, default=repr)] == [
        e for e in events_before if e.event_id in json.dumps(payload, default=repr)
    ]
    assert len(events) == len(events_before)
    assert [(e.charges, e.occurred_at_us, e.metadata, e.fingerprint) for e in events] == [
        (e.charges, e.occurred_at_us, e.metadata, e.fingerprint) for e in events_before
    ]
    assert rejected == rejected_before


@settings(max_examples=examples(400), deadline=None)
@given(batch=st.lists(st.one_of(items(), plain_items()), max_size=12))
def test_hostile_batches_decode_as_by_the_general_path(batch: list[Any]) -> None:
    assert_same_as_general({"v": 1, "events": batch})


@settings(max_examples=examples(300), deadline=None)
@given(item=plain_items())
def test_the_one_pass_path_gives_the_general_record_or_declines(item: dict[str, Any]) -> None:
    found = messages._plain_record(item)
    if found is not None:
        assert found == messages._decode_record(item)


def test_the_usual_event_takes_the_one_pass_path() -> None:
    item = {"id": "e1", "charges": [["org-1", "calls", 3]], "at": AT, "meta": None}
    found = messages._plain_record(item)
    assert found == messages._decode_record(item)
    assert found is not None and found.fingerprint == '[["org-1","calls",3]]'


@pytest.mark.parametrize(
    "charges",
    [
        [["org-1", "calls", 1], ["org-1", "seats", 1]],
        [["org-1", "calls", 1], ["org-1", "calls_daily", 1], ["org-1", "calls_weekly", 1]],
    ],
)
@pytest.mark.parametrize("meta", [None, {"user": "user-7"}])
def test_several_charges_and_metadata_take_the_one_pass_path(
    charges: list[list[object]], meta: dict[str, str] | None
) -> None:
    item = {"id": "e1", "charges": charges, "at": AT, "meta": meta}
    found = messages._plain_record(item)
    assert found is not None
    assert found == messages._decode_record(item)


@pytest.mark.parametrize(
    "item",
    [
        {"id": "e1", "charges": [["o", "calls", 1], ["o", "calls", 2]], "at": AT},  # a pair twice
        {"id": "e1", "charges": [["o", f"c{n}", 1] for n in range(33)], "at": AT},  # too many
        {"id": "e1", "charges": [["o", "calls", 1]], "at": AT, "meta": {"x": float("nan")}},
        {"id": "e1", "charges": [["o", "calls", 1], ["o", "seats", 1]], "at": AT, "meta": [1]},
        {"id": "e1", "charges": [["é", "calls", 1], ["o", "seats", 1]], "at": AT},  # escaped
    ],
)
def test_what_the_one_pass_path_does_not_take_decodes_as_before(item: dict[str, Any]) -> None:
    assert messages._plain_record(item) is None
    assert_same_as_general({"v": 1, "events": [item]})


@pytest.mark.parametrize(
    "charge",
    [
        ("org", "calls", True),  # a bool is not a cost
        ("org", "calls", float("nan")),
        ("é", "calls", 1),  # the encoder escapes it
        ('a"b', "calls", 1),
        ("a\\b", "calls", 1),
        ("tab\there", "calls", 1),
        ("lone-\ud800", "calls", 1),
    ],
)
def test_a_fingerprint_the_encoder_must_write_is_not_written_by_hand(
    charge: tuple[object, ...],
) -> None:
    assert single_fingerprint(*charge) is None


@pytest.mark.parametrize(
    "charge",
    [("org-1", "calls", 1), ("a b", "x", 10**40), ("~!@#$%^&*()<>/", "c", 7)],
)
def test_a_fingerprint_written_by_hand_is_the_encoders(charge: tuple[str, str, int]) -> None:
    encoded = json.dumps(sorted([list(charge)]), separators=(",", ":"))
    assert single_fingerprint(*charge) == encoded == fingerprint_of([charge])


@pytest.mark.parametrize(
    "payload",
    [
        None,
        [],
        {"v": 2, "events": []},
        {"v": 1},
        {"v": 1, "events": {"id": "e1"}},
        {"v": True, "events": []},
    ],
)
def test_a_message_that_is_not_a_batch_is_refused_as_before(payload: object) -> None:
    assert_same_as_general(payload)
