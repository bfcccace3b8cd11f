"""Request bodies into events, without a server: the mapping and the pointers."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from budgets import examples

from metering.api.parsing import body_kind, decode_json, parse_check, parse_events
from metering.api.problems import ApiProblem
from metering.domain.events import Charge

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


def parse(value: Any, kind: str = "json", max_events: int = 100) -> list[Any]:
    return parse_events(json.dumps(value).encode(), kind, NOW, max_events)  # type: ignore[arg-type]


def refused(value: Any, kind: str = "json") -> ApiProblem:
    with pytest.raises(ApiProblem) as caught:
        parse(value, kind)
    return caught.value


def test_a_plain_event_in_the_python_names() -> None:
    [parsed] = parse(
        {
            "event_id": "job-1",
            "subject": "org-1",
            "limit": "api_calls",
            "cost": 3,
            "occurred_at": "2026-11-22T10:00:00+01:00",
            "metadata": {"route": "/x"},
        }
    )
    event = parsed.event
    assert event.event_id == "job-1"
    assert event.charges == (Charge("org-1", "api_calls", 3),)
    assert event.occurred_at == datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
    assert event.metadata == {"route": "/x"}


def test_defaults_an_id_now_and_a_cost_of_one() -> None:
    [parsed] = parse({"subject": "org-1", "limit": "api_calls"})
    assert len(parsed.event.event_id) == 32
    assert parsed.event.occurred_at == NOW
    assert parsed.event.charges[0].cost == 1


def test_a_cloudevent_maps_id_subject_time_and_data() -> None:
    [parsed] = parse(
        {
            "specversion": "1.0",
            "id": "ce-1",
            "source": "/svc",
            "type": "usage",
            "subject": "org-1",
            "time": "2026-11-22T09:29:00Z",
            "data": {"limit": "api_calls", "cost": 2, "route": "/x"},
        },
        "cloudevent",
    )
    event = parsed.event
    # The identity is (source, id): the id, "@" and 16 hex digits of SHA-256(source).
    digest = hashlib.sha256(b"/svc").hexdigest()[:16]
    assert (event.event_id, event.charges, event.metadata) == (
        f"ce-1@{digest}",
        (Charge("org-1", "api_calls", 2),),
        {"route": "/x"},
    )
    assert event.occurred_at == datetime(2026, 11, 22, 9, 29, tzinfo=UTC)


def test_cloudevent_charges_take_the_event_subject_when_they_name_none() -> None:
    [parsed] = parse(
        {
            "specversion": "1.0",
            "id": "ce-2",
            "source": "/svc",
            "type": "usage",
            "subject": "user-7",
            "data": {"charges": [{"limit": "user_calls"}, {"subject": "org-1", "limit": "o"}]},
        },
        "cloudevent",
    )
    assert parsed.event.charges == (Charge("user-7", "user_calls", 1), Charge("org-1", "o", 1))
    assert parsed.event.metadata is None


@pytest.mark.parametrize(
    ("value", "kind", "pointer"),
    [
        ({"subject": "a", "limit": "l", "cost": -2}, "json", "cost"),
        (
            [{"subject": "a", "limit": "l"}, {"subject": "a", "limit": "L"}],
            "json",
            "events[1].limit",
        ),
        (
            {"charges": [{"subject": "a", "limit": "l"}, {"subject": " a", "limit": "l"}]},
            "json",
            "charges[1].subject",
        ),
        ({"charges": [{"subject": "a", "limit": "l"}] * 2}, "json", "charges"),
        ({"subject": "a", "limit": "l", "event_id": "a b"}, "json", "event_id"),
        (
            {"subject": "a", "limit": "l", "occurred_at": "2026-11-22T09:40:00Z"},
            "json",
            "occurred_at",
        ),
        ({"subject": "a", "limit": "l", "metadata": {"x": float("inf")}}, "json", "body"),
        (
            {
                "specversion": "1.0",
                "id": "x",
                "source": "s",
                "type": "t",
                "subject": "a",
                "data": {"limit": "l", "cost": -1},
            },
            "cloudevent",
            "data.cost",
        ),
        (
            {
                "specversion": "1.0",
                "id": "x",
                "source": "s",
                "type": "t",
                "subject": "",
                "data": {"limit": "l"},
            },
            "cloudevent",
            "subject",
        ),
        (
            {
                "specversion": "1.0",
                "id": "x y",
                "source": "s",
                "type": "t",
                "subject": "a",
                "data": {"limit": "l"},
            },
            "cloudevent",
            "id",
        ),
        (
            {
                "specversion": "1.0",
                "id": "x",
                "source": "s",
                "type": "t",
                "subject": "a",
                "time": "2026-11-23T00:00:00Z",
                "data": {"limit": "l"},
            },
            "cloudevent",
            "time",
        ),
        (
            {
                "specversion": "1.0",
                "id": "x" * 112,
                "source": "s",
                "type": "t",
                "subject": "a",
                "data": {"limit": "l"},
            },
            "cloudevent",
            "id",
        ),
        (
            [
                {
                    "specversion": "1.0",
                    "id": "x",
                    "source": "s",
                    "type": "t",
                    "data": {"charges": [{"limit": "l", "cost": 1.5}]},
                }
            ],
            "cloudevents-batch",
            "events[0].data.charges[0].subject",
        ),
    ],
)
def test_a_refused_event_names_its_field(value: Any, kind: str, pointer: str) -> None:
    problem = refused(value, kind)
    assert problem.slug == "invalid-input"
    assert pointer in [field for field, _ in problem.errors]


def test_every_bad_event_is_named_and_none_is_kept() -> None:
    problem = refused([{"subject": "a", "limit": "l", "cost": c} for c in (1, -2, 2, -1)])
    assert [field for field, _ in problem.errors] == ["events[1].cost", "events[3].cost"]
    assert problem.detail.startswith("2 of 4 events are not valid; nothing was accepted.")


def test_more_events_than_the_bound_is_413() -> None:
    with pytest.raises(ApiProblem) as caught:
        parse([{"subject": "a", "limit": "l"}] * 3, max_events=2)
    assert caught.value.slug == "body-too-large"


@pytest.mark.parametrize("cost", ["2.0", "2e0", "20E-1"])
def test_a_json_number_without_a_fraction_is_a_whole_cost(cost: str) -> None:
    body = b'{"subject": "a", "limit": "l", "cost": ' + cost.encode() + b"}"
    [parsed] = parse_events(body, "json", NOW, 10)
    assert parsed.event.charges[0].cost == 2


@pytest.mark.parametrize(
    "text", [b"NaN", b"-Infinity", b"1e400", b"9" * 5000, b"[" * 5000, b"{", b"\xff"]
)
def test_not_json_this_api_reads(text: bytes) -> None:
    with pytest.raises(ApiProblem) as caught:
        decode_json(text)
    assert caught.value.errors[0][0] == "body"


@pytest.mark.parametrize(
    ("header", "kind"),
    [
        ("application/json", "json"),
        ("application/json; charset=utf-8", "json"),
        ("Application/CloudEvents+JSON", "cloudevent"),
        ("application/cloudevents-batch+json", "cloudevents-batch"),
    ],
)
def test_content_types(header: str, kind: str) -> None:
    assert body_kind(header) == kind


@pytest.mark.parametrize("header", [None, "", "text/plain", "application/cloudevents"])
def test_other_content_types_are_415(header: str | None) -> None:
    with pytest.raises(ApiProblem) as caught:
        body_kind(header)
    assert caught.value.status == 415


def test_check_bodies_point_at_stacked_charges() -> None:
    parsed = parse_check(b'{"charges": [{"subject": "a", "limit": "l"}]}', NOW)
    assert parsed.charge_pointer(0, "limit") == "charges[0].limit"
    with pytest.raises(ApiProblem) as caught:
        parse_check(b'{"subject": "a", "limit": "l", "event_id": "x"}', NOW)
    assert caught.value.errors[0][0] == "event_id"


# -- the queued path's one-pass parser ---------------------------------------------

QUEUED_NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
MISSING = object()
FIELDS: dict[str, list[Any]] = {
    "event_id": ["e-1", "e-2", "bad id", 7, "x" * 129, MISSING],
    "subject": ["org-1", "", " x", "é", 'a"b', "a\\b", 5, None, "x" * 201, "\x00", MISSING],
    "limit": ["api_calls", "API", 3, None, "a" * 65, MISSING],
    "cost": [1, 0, 2.0, 2.5, True, 10**12, 10**12 + 1, "1", None, MISSING],
    "occurred_at": [
        "2026-11-26T08:59:00Z",
        "2026-11-26T10:04:00+01:00",
        "2026-11-26T09:06:00Z",  # more than 5 minutes ahead
        "2026-11-26T09:00:00",
        "2026-11-26",
        "2026-11-26T09:00:00.1234567+05:30",
        "0001-01-01T00:00:00+01:00",
        5,
        None,
        MISSING,
    ],
    "metadata": [
        {"route": "/v1/things"},
        {"n": [1, 2.5, None, True], "s": 'é"\\'},
        {"a": "\ud800"},
        {"a": "\ud83d\ude00"},
        {"big": "x" * 9000},
        [1],
        "s",
        None,
        MISSING,
    ],
    "charges": [[{"subject": "org-2", "limit": "api_calls"}], MISSING, MISSING, MISSING],
    "nope": [1, MISSING, MISSING, MISSING, MISSING],
}


# Values every field may take in a valid event (the first of FIELDS' own,
# which hold valid and invalid ones).
VALID: dict[str, list[Any]] = {
    "event_id": ["e-1", "e-2", MISSING],
    "subject": ["org-1", "é", 'a"b', "a\\b", "x" * 200],
    "limit": ["api_calls"],
    "cost": [1, 2.0, 10**12, MISSING],
    "occurred_at": ["2026-11-26T08:59:00Z", "2026-11-26T10:04:00+01:00", None, MISSING],
    "metadata": [{"route": "/v1/things"}, {"n": [1, 2.5, None, True], "s": 'é"\\'}, None, MISSING],
    "charges": [MISSING],
    "nope": [MISSING],
}


def plain_events() -> Any:
    """A valid event with at most one field changed to any value of FIELDS."""
    from hypothesis import strategies as st

    valid = st.fixed_dictionaries({name: st.sampled_from(v) for name, v in VALID.items()})
    changed = st.sampled_from([None, *FIELDS])

    @st.composite
    def event(draw: Any) -> dict[str, Any]:
        values = draw(valid)
        name = draw(changed)
        if name is not None:
            values[name] = draw(st.sampled_from(FIELDS[name]))
        return {k: v for k, v in values.items() if v is not MISSING}

    return event()


def outcome(parse: Any, body: bytes) -> Any:
    try:
        return parse(body)
    except ApiProblem as problem:
        return (problem.slug, problem.detail, list(problem.errors), problem.extra)


def test_the_queued_parser_gives_what_parse_events_gives() -> None:
    """`queued_events` (one pass for the usual event) is `parse_events` made
    `QueuedEvent`s: the same events and message text, or the same problem."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from metering.api.parsing import queued_events, queued_of

    @settings(max_examples=examples(400), deadline=None)
    @given(st.lists(plain_events(), min_size=1, max_size=4), st.booleans())
    def check(items: list[dict[str, Any]], single: bool) -> None:
        sent = items[:1] if single else items
        body = json.dumps(items[0] if single else items).encode()
        ours = outcome(lambda b: queued_events(b, "json", QUEUED_NOW, 100), body)
        theirs = outcome(
            lambda b: [queued_of(p.event) for p in parse_events(b, "json", QUEUED_NOW, 100)], body
        )
        if isinstance(ours, list) and isinstance(theirs, list):
            # A missing id is a new random one in each.
            for mine, reference, item in zip(ours, theirs, sent, strict=True):
                if "event_id" not in item:
                    assert len(mine.event_id) == 32
                    mine = mine._replace(event_id="-", text=mine.text.replace(mine.event_id, "-"))
                    reference = reference._replace(
                        event_id="-", text=reference.text.replace(reference.event_id, "-")
                    )
                assert mine == reference
                assert json.loads(mine.text) == json.loads(reference.text)
        else:
            assert ours == theirs

    check()


def test_the_usual_event_takes_the_one_pass_parser() -> None:
    from metering.api.parsing import _queued_plain

    item = {
        "event_id": "u-1",
        "subject": "org-1",
        "limit": "api_calls",
        "cost": 3,
        "occurred_at": "2026-11-26T08:00:00Z",
        "metadata": {"route": "/x"},
    }
    found = _queued_plain(item, 1795683600000000)
    assert found is not None
    assert found.charges == (Charge("org-1", "api_calls", 3),)
    assert json.loads(found.text) == {
        "id": "u-1",
        "charges": [["org-1", "api_calls", 3]],
        "at": 1795680000000000,
        "meta": {"route": "/x"},
    }
