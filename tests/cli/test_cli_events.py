"""``metering consume|check|result|counters|reset`` (`metering/cli/events.py`),
through click's CliRunner on a SQLite file: decisions printed one line per
charge with the exit code of the verdict (2: denied), stacked charges and
repeated ids, JSON, a stored result, counters, and a reset of some of them."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner, Result

from metering import Meter
from metering.cli import main
from metering.domain.events import make_event

Run = Callable[..., Result]


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite file (a copy of the session's template)."""
    return sqlite_url


@pytest.fixture
def run(url: str) -> Run:
    """Run ``metering --database URL ARGS...``; check the exit code when told."""
    runner = CliRunner()

    def invoke(*args: str, code: int | None = 0) -> Result:
        result = runner.invoke(main, ["--database", url, *args])
        if code is not None:
            assert result.exit_code == code, (result.output, result.exception)
        return result

    return invoke


@pytest.fixture
def with_limits(run: Run) -> Run:
    run("limits", "set", "send_message", "--max", "5", "--period", "2m")
    run("limits", "set", "org_calls", "--max", "3", "--period", "1h", "--window", "calendar")
    return run


def utc_text(iso: str) -> str:
    """How the CLI prints a reset time: whole seconds, rounded up."""
    moment = datetime.fromisoformat(iso)
    if moment.microsecond:
        moment = moment.replace(microsecond=0) + timedelta(seconds=1)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def snapshot(url: str) -> tuple[list[Any], list[Any]]:
    with Meter(url) as meter:
        return meter.list_limits(), meter.counters()


def assert_one_line_error(result: Result) -> None:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""


def test_readme_scenario_five_allowed_then_denied_with_reset_time(run: Run) -> None:
    result = run("limits", "set", "send_message", "--max", "5", "--period", "2m")
    assert result.output.startswith("send_message: max 5 per 2m, fixed_window")
    first = json.loads(run("consume", "visitor-1", "send_message", "--format", "json").output)
    resets = utc_text(first["charges"][0]["resets_at"])
    for used in range(2, 6):
        line = run("consume", "visitor-1", "send_message").output
        assert line == f"allowed  visitor-1 send_message  used {used}/5, {5 - used} left, " + (
            f"resets {resets}\n"
        )
    denied = run("consume", "visitor-1", "send_message", code=2).output
    assert denied == f"denied  visitor-1 send_message  used 5/5, retry at {resets}\n"


def test_check_consumes_nothing_and_uses_the_same_exit_codes(with_limits: Run, url: str) -> None:
    out = with_limits("check", "visitor-1", "send_message", "--cost", "5").output
    assert out.startswith("allowed  visitor-1 send_message  used 5/5, 0 left")
    with_limits("check", "visitor-1", "send_message", "--cost", "6", code=2)
    assert snapshot(url)[1] == []


def test_consume_at_a_naive_time_is_utc(with_limits: Run) -> None:
    at = (datetime.now(UTC) - timedelta(minutes=10)).replace(tzinfo=None, microsecond=0)
    out = with_limits("consume", "v", "send_message", "--at", at.isoformat(), "--format", "json")
    decision = json.loads(out.output)
    assert decision["occurred_at"] == at.replace(tzinfo=UTC).isoformat()
    assert decision["charges"][0]["window_start"] == at.replace(tzinfo=UTC).isoformat()


def test_cost_larger_than_the_maximum_never_fits(with_limits: Run) -> None:
    out = with_limits("consume", "v", "send_message", "--cost", "6", code=2).output
    assert "used 0/5, cost 6 is more than the maximum: never fits" in out


def test_soft_limit_reports_overage_and_exits_zero(run: Run) -> None:
    options = "--max 3 --period 1mo --window calendar --enforcement soft --threshold 80"
    run("limits", "set", "api_calls", *options.split(), "--threshold", "100")
    out = run("consume", "org-42", "api_calls", "--cost", "5").output
    assert out.startswith("overage  org-42 api_calls  used 5/3, 2 over, resets ")


def test_stacked_consume_allowed_then_denied_by_the_org_limit(with_limits: Run, url: str) -> None:
    charges = ["--charge", "user:7:send_message:1", "--charge", "org:42:org_calls:2"]
    out = with_limits("consume", *charges, "--event-id", "job-1").output.splitlines()
    assert out[0].startswith("allowed  user:7 send_message  used 1/5, 4 left")
    assert out[1].startswith("allowed  org:42 org_calls  used 2/3, 1 left")
    assert out[2] == "allowed  2 charges consumed"

    again = with_limits("consume", *charges, "--event-id", "job-1").output.splitlines()
    assert again[-1] == "allowed  2 charges consumed  (duplicate)"

    other = ["--charge", "user:8:send_message:1", "--charge", "org:42:org_calls:2"]
    denied = with_limits("consume", *other, "--event-id", "job-2", code=2).output.splitlines()
    assert denied[0].startswith("fits  user:8 send_message  used 0/5, 5 left")
    assert denied[1].startswith("denied  org:42 org_calls  used 2/3, retry at ")
    assert denied[2].startswith("denied by org_calls  nothing consumed, retry at ")
    used = {(c.subject, c.limit): c.used for c in snapshot(url)[1]}
    assert used == {
        ("user:7", "send_message"): 1,
        ("org:42", "org_calls"): 2,
        ("user:8", "send_message"): 0,
    }


def test_json_output_is_the_decision_plus_duplicate(with_limits: Run) -> None:
    args = ("consume", "v", "send_message", "--event-id", "e-1", "--format", "json")
    first = json.loads(with_limits(*args).output)
    assert first["event_id"] == "e-1" and first["outcome"] == "allowed"
    assert first["duplicate"] is False and first["charges"][0]["used"] == 1
    second = json.loads(with_limits(*args).output)
    assert second["duplicate"] is True and second["charges"] == first["charges"]
    stacked = ["--charge", "a:send_message:5", "--charge", "b:org_calls:4"]
    denied = json.loads(with_limits("consume", *stacked, "--format", "json", code=2).output)
    assert denied["outcome"] == "denied" and denied["denied_by"] == ["org_calls"]


def test_result_of_a_known_and_an_unknown_event(with_limits: Run) -> None:
    with_limits("consume", "v", "send_message", "--cost", "2", "--event-id", "known-1")
    out = with_limits("result", "known-1").output
    assert out.startswith("allowed  v send_message  used 2/5, 3 left")
    data = json.loads(with_limits("result", "known-1", "--format", "json").output)
    assert data["event_id"] == "known-1" and data["duplicate"] is False
    missing = with_limits("result", "unknown-1", code=1)
    assert_one_line_error(missing)
    assert missing.stderr == "error: no result for event unknown-1\n"


def test_result_of_a_denied_and_a_rejected_event_exits_2(with_limits: Run, url: str) -> None:
    with_limits("consume", "v", "send_message", "--cost", "9", "--event-id", "big-1", code=2)
    assert with_limits("result", "big-1", code=2).output.startswith("denied  v send_message")
    event = make_event([("v", "no_such_limit", 1)], datetime.now(UTC), "rej-1")
    with Meter(url) as meter:
        meter.apply([event])
    out = with_limits("result", "rej-1", code=2).output
    assert out.startswith("rejected  event rej-1: unknown limit 'no_such_limit'")


def test_reset_clears_counters_of_a_subject(with_limits: Run, url: str) -> None:
    with_limits("consume", "v", "send_message", "--cost", "5")
    with_limits("consume", "w", "send_message")
    assert with_limits("reset", "--subject", "v").output == "cleared 1 counter\n"
    assert [c.subject for c in snapshot(url)[1]] == ["w"]
    assert with_limits("reset", "--limit", "send_message").output == "cleared 1 counter\n"
    assert with_limits("reset", "--limit", "org_calls").output == "cleared 0 counters\n"
    assert with_limits("consume", "v", "send_message").output.startswith("allowed  v")


def test_reset_needs_a_subject_or_a_limit(with_limits: Run) -> None:
    assert_one_line_error(with_limits("reset", code=None))


def test_counters_table_and_json(with_limits: Run) -> None:
    assert with_limits("counters").output == "no counters\n"
    with_limits("consume", "visitor-1", "send_message", "--cost", "4")
    with_limits("consume", "visitor-1", "send_message", "--cost", "2", code=2)
    table = with_limits("counters", "--subject", "visitor-1").output
    for word in ("subject", "window", "(UTC)", "denied", "events", "first", "denial"):
        assert word in table.split()  # a header wraps between its words
    assert "visitor-1" in table and "send_message" in table
    [row] = json.loads(with_limits("counters", "--format", "json").output)
    assert (row["used"], row["denied_count"], row["denied_cost"]) == (4, 1, 2)
    assert (
        json.loads(with_limits("counters", "--limit", "org_calls", "--format", "json").output) == []
    )


def test_help_documents_the_exit_codes() -> None:
    out = CliRunner().invoke(main, ["consume", "--help"]).output
    assert "Exit codes" in out and "2  denied" in out
