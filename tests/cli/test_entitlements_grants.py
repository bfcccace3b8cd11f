"""``metering entitlements``, ``grants``, ``void``, ``corrections``, and shadow limits
with absolute thresholds, through click's CliRunner on a SQLite file.

Every bad input is one ``error:`` line on stderr, exit 1, and the database
is as it was (`snapshot`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from metering import Meter
from metering.cli import main

Run = Callable[..., Result]


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite database (a copy of the session's template)."""
    return sqlite_url


@pytest.fixture
def run(url: str) -> Run:
    """``metering --database URL ARGS...``, with limits api_calls (5 an hour) and burst."""
    runner = CliRunner()

    def invoke(*args: str, code: int | None = 0) -> Result:
        result = runner.invoke(main, ["--database", url, *args])
        if code is not None:
            assert result.exit_code == code, (result.output, result.exception)
        return result

    invoke("limits", "set", "api_calls", "--max", "5", "--period", "1h")
    invoke(
        "limits", "set", "burst", "--max", "10", "--period", "10s", "--algorithm", "token_bucket"
    )
    return invoke


def snapshot(url: str) -> tuple[Any, ...]:
    with Meter(url) as meter:
        return (
            meter.list_limits(),
            meter.counters(),
            meter.entitlements(),
            [g.to_dict() for g in meter.grants()],
            [c.to_dict() for c in meter.corrections()],
        )


def assert_one_line_error(result: Result, *words: str) -> None:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""
    for word in words:
        assert word in lines[0], (word, lines[0])


def utc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


# -- shadow limits and absolute thresholds --------------------------------------------


def test_a_shadow_limit_with_threshold_units(run: Run, url: str) -> None:
    args = ["--max", "2", "--period", "1h", "--enforcement", "shadow"]
    out = run("limits", "set", "trial", *args, "--threshold-units", "2", "--threshold-units", "1")
    assert out.output == (
        "trial: max 2 per 1h, fixed_window, first_use window, shadow, threshold units 1/2, "
        "lateness 1d\n"
    )
    listed = {e["name"]: e for e in json.loads(run("limits", "list", "--format", "json").output)}
    assert (listed["trial"]["enforcement"], listed["trial"]["thresholds_units"]) == (
        "shadow",
        [1, 2],
    )
    assert listed["api_calls"]["thresholds_units"] == []
    table = run("limits", "list").output
    # The thresholds cell holds both kinds: percentages (80%) and units.
    assert "thresholds" in table and "1, 2" in table and "shadow" in table
    run("consume", "org-1", "trial", "--cost", "2")
    line = run("consume", "org-1", "trial").output  # exit 0: a shadow limit never denies
    assert line.startswith("allowed  org-1 trial  used 2/2, would be denied (shadow")
    decision = json.loads(run("consume", "org-1", "trial", "--format", "json").output)
    assert decision["would_deny"] == ["trial"]


# -- entitlements ----------------------------------------------------------------------


def test_entitlements_set_list_and_delete(run: Run, url: str) -> None:
    for _ in range(5):
        run("consume", "org-1", "api_calls")
    run("consume", "org-1", "api_calls", code=2)
    out = run("entitlements", "set", "org-1", "api_calls", "8").output
    assert out.startswith("org-1 api_calls: maximum 8 from ")
    # The upgrade applies now; the window's 5 carry over.
    assert "used 8/8, 0 left" in run("consume", "org-1", "api_calls", "--cost", "3").output

    later = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0, tzinfo=None)
    out = run("entitlements", "delete", "org-1", "api_calls", "--from", later.isoformat()).output
    assert out == f"org-1 api_calls: the limit's default from {utc(later)}\n"
    run("entitlements", "set", "org-2", "api_calls", "100", "--from", "2026-01-01T00:00:00+01:00")

    listed = json.loads(run("entitlements", "list", "--format", "json").output)
    assert [(e["subject"], e["maximum"]) for e in listed] == [
        ("org-1", 8),
        ("org-1", None),
        ("org-2", 100),
    ]
    assert listed[1]["effective_from"] == later.replace(tzinfo=UTC).isoformat()
    assert listed[2]["effective_from"] == "2025-12-31T23:00:00+00:00"
    only = run("entitlements", "list", "--subject", "org-2", "--format", "json").output
    assert [e["maximum"] for e in json.loads(only)] == [100]
    table = run("entitlements", "list", "--limit", "api_calls").output
    for text in ("subject", "effective from", "default", "2025-12-31 23:00:00 UTC"):
        assert text in table
    assert run("entitlements", "list", "--limit", "burst").output.startswith("no entitlements")


def test_entitlements_load_yaml_and_toml(run: Run, url: str, tmp_path: Path) -> None:
    yaml_file = tmp_path / "entitlements.yaml"
    yaml_file.write_text(
        "entitlements:\n"
        "  - {subject: org-42, limit: api_calls, maximum: 5000}\n"
        "  - {subject: org-7, limit: api_calls, maximum: 20000, effective_from: 2026-12-01}\n"
        "  - subject: org-7\n    limit: api_calls\n    maximum: 100\n"
        "    effective_from: '2027-01-01T00:00:00Z'\n"
    )
    out = run("entitlements", "load", str(yaml_file)).output
    assert out == f"loaded 3 entitlements from {yaml_file}\n"
    toml_file = tmp_path / "entitlements.toml"
    toml_file.write_text(
        '[[entitlements]]\nsubject = "org-9"\nlimit = "api_calls"\nmaximum = 9\n'
        "effective_from = 2026-12-01T00:00:00Z\n"
    )
    assert run("entitlements", "load", str(toml_file)).output == (
        f"loaded 1 entitlement from {toml_file}\n"
    )
    with Meter(url) as meter:
        found = [(e.subject, e.maximum) for e in meter.entitlements()]
        dated = {e.subject: e.to_dict()["effective_from"] for e in meter.entitlements()}
    assert found == [("org-42", 5000), ("org-7", 20000), ("org-7", 100), ("org-9", 9)]
    assert dated["org-9"] == "2026-12-01T00:00:00+00:00"


GOOD = "  - {subject: org-1, limit: api_calls, maximum: 10}\n"
BAD_FILES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "zero maximum": (
        "yaml",
        GOOD + "  - {subject: org-7, limit: api_calls, maximum: 0}\n",
        ("entry 2", "org-7", "maximum"),
    ),
    "text maximum": (
        "yaml",
        GOOD + "  - {subject: org-7, limit: api_calls, maximum: lots}\n",
        ("entry 2", "maximum"),
    ),
    "unknown limit": (
        "yaml",
        GOOD + "  - {subject: org-7, limit: nope, maximum: 3}\n",
        ("entry 2", "limit", "nope"),
    ),
    "bad limit name": (
        "yaml",
        GOOD + "  - {subject: org-7, limit: Nope, maximum: 3}\n",
        ("entry 2", "limit: "),
    ),
    "token bucket is fine but no subject": (
        "yaml",
        GOOD + "  - {limit: burst, maximum: 3}\n",
        ("entry 2", "subject", "required"),
    ),
    "unknown field": (
        "yaml",
        GOOD + "  - {subject: o, limit: api_calls, maximum: 3, max: 4}\n",
        ("entry 2", "max", "unknown field"),
    ),
    "bad time": (
        "yaml",
        GOOD + "  - {subject: o, limit: api_calls, maximum: 3, effective_from: soon}\n",
        ("entry 2", "effective_from"),
    ),
    "not a mapping": ("yaml", GOOD + "  - org-7\n", ("entry 2", "mapping")),
    "repeated": ("yaml", GOOD + GOOD, ("entry 2 ", "repeats entry 1")),
    "impossible date": (
        "yaml",
        "- {subject: o, limit: api_calls, maximum: 3, effective_from: 2026-13-01}\n",
        ("not valid YAML", "month"),
    ),
    "not a list": ("yaml", "org-1: 5\n", ("a list of entitlements",)),
    "broken yaml": ("yaml", "entitlements: [\n", ("not valid YAML",)),
    "broken toml": ("toml", "[[entitlements]\n", ("not valid TOML",)),
    "toml zero": (
        "toml",
        '[[entitlements]]\nsubject = "o"\nlimit = "api_calls"\nmaximum = 0\n',
        ("entry 1", "maximum"),
    ),
    "another suffix": ("json", "[]", (".yaml, .yml or .toml",)),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_entitlements_file_is_one_error_line_and_loads_nothing(
    run: Run, url: str, tmp_path: Path, case: str
) -> None:
    suffix, text, words = BAD_FILES[case]
    path = tmp_path / f"entitlements.{suffix}"
    listed = suffix == "yaml" and text.startswith("  - ")
    path.write_text(("entitlements:\n" if listed else "") + text, encoding="utf-8")
    before = snapshot(url)
    assert_one_line_error(run("entitlements", "load", str(path), code=None), *words)
    assert snapshot(url) == before


# -- grants ---------------------------------------------------------------------------


def test_grants_add_once_list_and_pay_after_the_window(run: Run, url: str) -> None:
    expires = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)
    args = ["org-1", "api_calls", "3", "--id", "promo-1", "--expires", expires.isoformat()]
    out = run("grants", "add", *args, "--reason", "launch promotion").output
    assert out.startswith("granted promo-1: org-1 api_calls 3 (0 used, 3 left), from ")
    assert out.endswith(f"expires {utc(expires)}, reason: launch promotion\n")
    again = run("grants", "add", *args, "--reason", "launch promotion").output
    assert again.startswith("already granted, nothing changed: promo-1: org-1 api_calls 3")
    conflict = run("grants", "add", *args[:2], "4", *args[3:], code=None)
    assert_one_line_error(conflict, "promo-1", "already exists with other values")

    line = run("consume", "org-1", "api_calls", "--cost", "7").output
    assert "used 7/5 (2 from grants), 1 left" in line
    [grant] = json.loads(run("grants", "list", "--format", "json").output)
    assert (grant["grant_id"], grant["used"], grant["left"]) == ("promo-1", 2, 1)
    table = run("grants", "list", "--subject", "org-1").output
    for text in ("promo-1", "launch promotion", utc(expires)):
        assert text in table
    added = json.loads(run("grants", "add", "org-2", "api_calls", "1", "--format", "json").output)
    assert added["duplicate"] is False and added["grant_id"] and added["expires_at"] is None
    assert run("grants", "list", "--limit", "burst").output == "no grants\n"


# -- corrections ------------------------------------------------------------------------


def test_void_twice_then_a_denied_event_is_refused(run: Run, url: str) -> None:
    run("grants", "add", "org-1", "api_calls", "2", "--id", "g-1")
    run("consume", "org-1", "api_calls", "--cost", "6", "--event-id", "job-1")
    run("consume", "org-1", "api_calls", "--cost", "9", "--event-id", "job-2", code=2)
    out = run("void", "job-1", "--reason", "duplicate upload", "--correction-id", "c-1").output
    lines = out.splitlines()
    assert lines[0] == "voided job-1 (correction c-1)"
    assert lines[1].startswith("  org-1 api_calls: 6 given back in the window from ")
    assert lines[1].endswith(", grants restored: g-1 1")
    with Meter(url) as meter:
        assert sum(c.used for c in meter.counters("org-1", "api_calls")) == 0
        result = meter.result("job-1")
        assert result is not None and result.outcome == "allowed"

    again = run("void", "job-1", "--reason", "again").output
    assert again == "event job-1 was already voided (correction c-1); nothing changed\n"
    document = json.loads(run("void", "job-1", "--reason", "x", "--format", "json").output)
    assert (document["correction_id"], document["duplicate"]) == ("c-1", True)

    before = snapshot(url)
    denied = run("void", "job-2", "--reason", "refund", code=None)
    assert_one_line_error(denied, "job-2", "cannot be voided", "denied")
    assert snapshot(url) == before

    [listed] = json.loads(run("corrections", "list", "--format", "json").output)
    assert (listed["event_id"], listed["reason"]) == ("job-1", "duplicate upload")
    table = run("corrections", "list").output
    assert "c-1" in table and "org-1 api_calls 6" in table


def test_corrections_list_when_there_are_none(run: Run) -> None:
    assert run("corrections", "list").output == "no corrections\n"
    assert json.loads(run("corrections", "list", "--format", "json").output) == []


# -- bad input: one error line, exit 1, nothing stored -------------------------------------

BAD_INPUTS: dict[str, list[str]] = {
    "threshold units 0": [
        "limits",
        "set",
        "x",
        "--max",
        "5",
        "--period",
        "1h",
        "--threshold-units",
        "0",
    ],
    "threshold units text": [
        "limits",
        "set",
        "x",
        "--max",
        "5",
        "--period",
        "1h",
        "--threshold-units",
        "many",
    ],
    "unknown enforcement": [
        "limits",
        "set",
        "x",
        "--max",
        "5",
        "--period",
        "1h",
        "--enforcement",
        "dry-run",
    ],
    "entitlement maximum 0": ["entitlements", "set", "org-1", "api_calls", "0"],
    "entitlement maximum text": ["entitlements", "set", "org-1", "api_calls", "lots"],
    "entitlement huge maximum": ["entitlements", "set", "org-1", "api_calls", "1" + "0" * 16],
    "entitlement unknown limit": ["entitlements", "set", "org-1", "nope", "5"],
    "entitlement bad limit name": ["entitlements", "set", "org-1", "API calls", "5"],
    "entitlement empty subject": ["entitlements", "set", "", "api_calls", "5"],
    "entitlement bad --from": [
        "entitlements",
        "set",
        "org-1",
        "api_calls",
        "5",
        "--from",
        "tomorrow",
    ],
    "entitlement missing maximum": ["entitlements", "set", "org-1", "api_calls"],
    "delete unknown limit": ["entitlements", "delete", "org-1", "nope"],
    "delete bad --from": ["entitlements", "delete", "org-1", "api_calls", "--from", "x"],
    "list bad --limit": ["entitlements", "list", "--limit", "Nope"],
    "list bad --format": ["entitlements", "list", "--format", "xml"],
    "load missing file": ["entitlements", "load", "/nonexistent/entitlements.yaml"],
    "grant amount 0": ["grants", "add", "org-1", "api_calls", "0"],
    "grant amount fraction": ["grants", "add", "org-1", "api_calls", "1.5"],
    "grant token bucket": ["grants", "add", "org-1", "burst", "5"],
    "grant unknown limit": ["grants", "add", "org-1", "nope", "5"],
    "grant bad id": ["grants", "add", "org-1", "api_calls", "5", "--id", "bad id!"],
    "grant bad --expires": ["grants", "add", "org-1", "api_calls", "5", "--expires", "never"],
    "grant expires before start": [
        "grants",
        "add",
        "org-1",
        "api_calls",
        "5",
        "--expires",
        "2020-01-01T00:00:00Z",
    ],
    "grant empty reason": ["grants", "add", "org-1", "api_calls", "5", "--reason", " "],
    "grant control subject": ["grants", "add", "org\n1", "api_calls", "5"],
    "grants list bad subject": ["grants", "list", "--subject", ""],
    "void unknown event": ["void", "never", "--reason", "x"],
    "void no reason": ["void", "job-1"],
    "void empty reason": ["void", "job-1", "--reason", ""],
    "void long reason": ["void", "job-1", "--reason", "x" * 501],
    "void bad event id": ["void", "bad id!", "--reason", "x"],
    "void bad correction id": ["void", "job-1", "--reason", "x", "--correction-id", "a b"],
    "void months horizon": ["void", "job-1", "--reason", "x", "--horizon", "1mo"],
    "void bad horizon": ["void", "job-1", "--reason", "x", "--horizon", "3"],
    "void reused correction id": ["void", "job-1", "--reason", "x", "--correction-id", "c-0"],
    "corrections count 0": ["corrections", "list", "--count", "0"],
}


@pytest.mark.parametrize("args", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_bad_input_gives_one_error_line_and_stores_nothing(
    run: Run, url: str, args: list[str]
) -> None:
    run("consume", "org-1", "api_calls", "--cost", "2", "--event-id", "job-0")
    run("void", "job-0", "--reason", "setup", "--correction-id", "c-0")
    run("consume", "org-1", "api_calls", "--cost", "2", "--event-id", "job-1")
    before = snapshot(url)
    assert_one_line_error(run(*args, code=None))
    assert snapshot(url) == before


def test_an_old_event_is_past_a_short_horizon(run: Run, url: str) -> None:
    at = (datetime.now(UTC) - timedelta(hours=2)).replace(microsecond=0)
    run("consume", "org-1", "api_calls", "--event-id", "old-1", "--at", at.isoformat())
    before = snapshot(url)
    refused = run("void", "old-1", "--reason", "late", "--horizon", "1h", code=None)
    assert_one_line_error(refused, "old-1", "horizon")
    assert snapshot(url) == before
    assert run("void", "old-1", "--reason", "late", "--horizon", "1d").output.startswith("voided")
