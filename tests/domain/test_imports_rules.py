"""The import file's parsing and the flags' rules (`metering.domain.imports`), pure."""

from __future__ import annotations

import pytest

from metering.domain.events import Charge
from metering.domain.imports import (
    UNLIMITED_LATENESS_SECONDS,
    BadLine,
    ImportPolicy,
    format_of,
    parse_lines,
)
from metering.domain.limits import Limit
from metering.domain.rules import Rule
from metering.errors import InvalidInput

AT = "2026-11-26T10:00:00Z"
AT_US = 1_795_687_200_000_000


def test_json_lines_events_and_bad_lines_with_their_numbers() -> None:
    lines = [
        f'{{"event_id": "e1", "subject": "org-1", "limit": "calls", "occurred_at": "{AT}"}}\n',
        "\n",
        "{not json\n",
        f'{{"event_id": "e2", "subject": "org-1", "limit": "calls", "cost": -1, '
        f'"occurred_at": "{AT}"}}\n',
        f'{{"subject": "org-1", "limit": "calls", "occurred_at": "{AT}"}}\n',
        f'{{"event_id": "e3", "charges": [{{"subject": "u", "limit": "a", "cost": 2}}], '
        f'"occurred_at": "{AT}", "metadata": {{"k": 1}}}}\n',
        '{"event_id": "e4", "subject": "org-1", "limit": "calls"}\n',
        '{"event_id": "e5", "subject": "org-1", "limit": "calls", "occurred_at": "x", "y": 1}\n',
        "[1]\n",
    ]
    found = list(parse_lines(lines, "jsonl"))
    assert [number for number, _ in found] == [1, 3, 4, 5, 6, 7, 8, 9]
    first = found[0][1]
    assert not isinstance(first, BadLine)
    assert (first.event_id, first.charges, first.occurred_at_us) == (
        "e1",
        (Charge("org-1", "calls", 1),),
        AT_US,
    )
    third = found[4][1]
    assert not isinstance(third, BadLine)
    assert (third.charges, third.metadata) == ((Charge("u", "a", 2),), {"k": 1})
    bad = {number: line.reason for number, line in found if isinstance(line, BadLine)}
    assert sorted(bad) == [3, 4, 5, 7, 8, 9]
    assert bad[3].startswith("not JSON")
    assert "cost" in bad[4]
    assert "event_id: is required" in bad[5]
    assert "occurred_at: is required" in bad[7]
    assert bad[8] == "unknown field 'y'"
    assert bad[9] == "not a JSON object"
    assert str(BadLine(3, "why")) == "line 3: why"


def test_csv_metadata_columns_and_line_numbers() -> None:
    text = (
        "event_id,subject,limit,cost,occurred_at,region,plan\n"
        f"c1,org-1,calls,2,{AT},eu,\n"
        f'c2,org-2,calls,1,{AT},"us\neast",pro\n'
        f"c3,org-3,calls,one,{AT},eu,pro\n"
        "\n"
        f"c4,org-4,calls,1,{AT}\n"
    )
    found = list(parse_lines(text.splitlines(keepends=True), "csv"))
    assert [number for number, _ in found] == [2, 3, 5, 7]
    c1, c2 = found[0][1], found[1][1]
    assert not isinstance(c1, BadLine) and not isinstance(c2, BadLine)
    assert (c1.charges, c1.metadata) == ((Charge("org-1", "calls", 2),), {"region": "eu"})
    assert c2.metadata == {"region": "us\neast", "plan": "pro"}
    assert found[2][1] == BadLine(5, "cost: must be a whole number, got 'one'")
    assert found[3][1] == BadLine(7, "has 5 cells, the header 7")


def test_a_csv_header_must_start_with_the_five_columns() -> None:
    with pytest.raises(InvalidInput, match="event_id,subject,limit,cost,occurred_at"):
        list(parse_lines(["id,subject,limit,cost,occurred_at\n"], "csv"))


def test_the_format_by_suffix_else_by_first_line() -> None:
    assert format_of("a.CSV", "{") == "csv"
    assert format_of("a.ndjson", "event_id") == "jsonl"
    assert format_of(None, '  {"event_id": 1}') == "jsonl"
    assert format_of("-", "event_id,subject") == "csv"


def test_the_default_policy_changes_nothing() -> None:
    policy = ImportPolicy()
    assert (policy.changes, policy.marker) == (False, None)


def test_no_enforce_decides_windows_as_soft_and_buckets_as_shadow() -> None:
    policy = ImportPolicy(enforce=False)
    hard = Limit("calls", maximum=5, period="1h", thresholds=(80,))
    bucket = Limit("api", maximum=5, period="5s", algorithm="token_bucket")
    assert policy.limit(hard).enforcement == "soft"
    assert policy.limit(bucket).enforcement == "shadow"
    assert policy.limit(Limit("s", maximum=5, period="1h", enforcement="shadow")).enforcement == (
        "soft"
    )
    rule = policy.rule(Rule.of(hard))
    assert (rule.soft, rule.shadow, rule.notifies, rule.lateness_us) == (
        True,
        False,
        False,
        86_400_000_000,
    )
    assert policy.marker == "imported: not enforced"


def test_allow_late_lifts_the_lateness_only() -> None:
    policy = ImportPolicy(allow_late=True)
    limit = Limit("calls", maximum=5, period="1h")
    changed = policy.limit(limit)
    assert changed.lateness_seconds == UNLIMITED_LATENESS_SECONDS
    assert (changed.enforcement, limit.lateness_seconds) == ("hard", 86_400)
    original = Rule.of(limit)
    rule = policy.rule(original)
    assert policy.rule(original) is rule  # remembered
    assert (rule.soft, rule.lateness_us) == (False, UNLIMITED_LATENESS_SECONDS * 1_000_000)
    assert ImportPolicy(enforce=False, allow_late=True).marker == (
        "imported: not enforced, lateness not checked"
    )


def test_a_csv_line_that_is_no_csv_is_a_bad_line() -> None:
    lines = ["event_id,subject,limit,cost,occurred_at\n", f"c1,org\r-1,calls,1,{AT}\n", "c2\0\n"]
    found = list(parse_lines(lines, "csv"))
    assert [(number, type(item).__name__) for number, item in found] == [
        (2, "BadLine"),
        (3, "BadLine"),
    ]
    with pytest.raises(InvalidInput, match="header: line 1: not CSV"):
        list(parse_lines(["event\rid\n"], "csv"))


def test_each_bad_json_line_says_why_with_its_number() -> None:
    at = f'"occurred_at": "{AT}"'
    lines = [
        f'{{"event_id": "n", "subject": "s", "limit": "l", "cost": NaN, {at}}}',
        f'{{"event_id": "a", "subject": "s", "charges": [], {at}}}',
        f'{{"event_id": "b", "limit": "l", "charges": [], {at}}}',
        f'{{"event_id": "c", "cost": 1, "charges": [], {at}}}',
        f'{{"event_id": "d", "charges": {{"subject": "s"}}, {at}}}',
        f'{{"event_id": "e", "charges": ["s"], {at}}}',
        f'{{"event_id": "f", "charges": [{{"subject": "s", "limit": "l", "x": 1}}], {at}}}',
        f'{{"event_id": "g", "charges": [{{"subject": "s"}}], {at}}}',
        f'{{"event_id": "i", "limit": "l", {at}}}',
        f'{{"event_id": "", "subject": "s", "limit": "l", {at}}}',
        '{"event_id": "j", "subject": "s", "limit": "l", "occurred_at": ""}',
        '{"event_id": "k", "subject": "s", "limit": "l", "occurred_at": "yesterday"}',
        "[1]",
        '{"event_id": "m", "z": 1}',
        "{bad",
    ]
    both = "charges: give subject and limit, or charges, not both"
    assert list(parse_lines(lines, "jsonl")) == [
        (1, BadLine(1, "not JSON: NaN is not a number")),
        (2, BadLine(2, both)),
        (3, BadLine(3, both)),
        (4, BadLine(4, both)),
        (5, BadLine(5, "charges: must be a list of {subject, limit, cost}")),
        (6, BadLine(6, "charges: each charge is an object {subject, limit, cost}")),
        (7, BadLine(7, "charges: each charge is an object {subject, limit, cost}")),
        (8, BadLine(8, "limit: is required")),
        (9, BadLine(9, "subject: is required")),
        (10, BadLine(10, "event_id: is required (an import is exactly once by id)")),
        (11, BadLine(11, "occurred_at: is required")),
        (
            12,
            BadLine(
                12, "occurred_at: 'yesterday' is not an RFC 3339 time like 2026-11-22T12:00:00Z"
            ),
        ),
        (13, BadLine(13, "not a JSON object")),
        (14, BadLine(14, "unknown field 'z'")),
        (
            15,
            BadLine(
                15,
                "not JSON: Expecting property name enclosed in double quotes: "
                "line 1 column 2 (char 1)",
            ),
        ),
    ]


def test_a_charge_without_a_cost_costs_one_and_is_fingerprinted() -> None:
    line = (
        f'{{"event_id": "h", "charges": [{{"subject": "s", "limit": "l"}}], "occurred_at": "{AT}"}}'
    )
    [(number, record)] = list(parse_lines([line], "jsonl"))
    assert not isinstance(record, BadLine)
    assert (number, record.charges) == (1, (Charge("s", "l", 1),))
    assert record.fingerprint == '[["s","l",1]]'


def test_a_bad_csv_record_and_a_bad_header_say_why() -> None:
    lines = ["event_id,subject,limit,cost,occurred_at\n", f"c1,org\r-1,calls,1,{AT}\n"]
    assert list(parse_lines(lines, "csv")) == [
        (
            2,
            BadLine(
                2,
                "not CSV: new-line character seen in unquoted field - "
                "do you need to open the file in universal-newline mode?",
            ),
        )
    ]
    with pytest.raises(InvalidInput) as twice:
        list(parse_lines(["event_id,subject,limit,cost,occurred_at,a,a\n"], "csv"))
    assert twice.value.field == "header"


def test_the_json_suffixes() -> None:
    assert format_of("a.jsonl", "event_id") == "jsonl"
    assert format_of("a.JSON", "event_id") == "jsonl"


def test_no_enforce_leaves_a_license_hard_and_rules_follow_their_limit() -> None:
    policy = ImportPolicy(enforce=False)
    licenses = Limit("cad", maximum=5, algorithm="concurrent")
    assert policy.limit(licenses) == licenses
    bucket = Limit("api", maximum=5, period="5s", algorithm="token_bucket")
    rule = policy.rule(Rule.of(bucket))
    assert rule.limit == policy.limit(bucket)
    assert (rule.soft, rule.shadow) == (False, True)
