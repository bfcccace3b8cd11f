"""The `metering` command line, through click's CliRunner on a SQLite file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from metering import Limit, Meter
from metering.cli import main
from metering.cli.demo import chart_line, metering_command, webhook_line
from metering.demo import DemoFiles, WebhookReceiver
from metering.domain.events import make_event
from metering.errors import MeteringError
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event
from metering.storage.connections import SCHEMA_REVISION
from metering.webhooks import generate_secret, sign

Run = Callable[..., Result]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/cli.db"


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


# -- the README scenario ---------------------------------------------------------


def test_the_readme_s_block_without_docker_starts_the_one_beat() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("**Without Docker**", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    [worker] = [line for line in block.splitlines() if line.startswith("metering worker")]
    assert " --beat " in worker + " "


@pytest.mark.slow
def test_the_readme_s_python_snippet_runs_twice(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    snippet = readme.split("## Python API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for _ in range(2):  # the second run starts from a fresh database too
        done = subprocess.run(
            [sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing left in the working directory


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


# -- stacked events, idempotency, JSON, results ------------------------------------


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


# -- operator commands ---------------------------------------------------------------


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


def test_limits_list_and_delete(with_limits: Run, url: str) -> None:
    table = with_limits("limits", "list").output
    for text in ("name", "maximum", "thresholds", "lateness", "send_message", "org_calls"):
        assert text in table
    listed = json.loads(with_limits("limits", "list", "--format", "json").output)
    assert [entry["name"] for entry in listed] == ["org_calls", "send_message"]
    assert listed[0]["window"] == "calendar" and listed[1]["period"] == "2m"
    assert with_limits("limits", "delete", "org_calls").output == "deleted limit org_calls\n"
    assert [limit.name for limit in snapshot(url)[0]] == ["send_message"]
    assert_one_line_error(with_limits("limits", "delete", "org_calls", code=None))


def test_limits_set_with_every_option(run: Run, url: str) -> None:
    args = ["--max", "10", "--period", "10s", "--algorithm", "token_bucket", "--lateness", "1h"]
    out = run("limits", "set", "search", *args).output
    assert out == "search: max 10 per 10s, token_bucket, hard, lateness 1h\n"
    [limit] = snapshot(url)[0]
    assert (limit.algorithm, limit.lateness, limit.maximum) == ("token_bucket", "1h", 10)


def test_limits_load_yaml_and_toml(run: Run, url: str, tmp_path: Path) -> None:
    yaml_file = tmp_path / "limits.yaml"
    yaml_file.write_text(
        "limits:\n"
        "  send_message: {maximum: 5, period: 2m}\n"
        "  api_calls: {maximum: 1000, period: 1mo, window: calendar, enforcement: soft,"
        " thresholds: [80, 100]}\n"
    )
    assert run("limits", "load", str(yaml_file)).output == f"loaded 2 limits from {yaml_file}\n"
    toml_file = tmp_path / "limits.toml"
    toml_file.write_text(
        '[[limits]]\nname = "search"\nmaximum = 10\nperiod = "10s"\nalgorithm = "token_bucket"\n'
    )
    assert run("limits", "load", str(toml_file)).output == f"loaded 1 limit from {toml_file}\n"
    limits = {limit.name: limit for limit in snapshot(url)[0]}
    assert sorted(limits) == ["api_calls", "search", "send_message"]
    assert limits["api_calls"].thresholds == (80, 100)


def test_db_upgrade_on_sqlite(run: Run, url: str) -> None:
    out = run("db", "upgrade").output
    assert out == f"schema at revision {SCHEMA_REVISION} ({url})\n"
    assert run("db", "upgrade").output == out  # idempotent
    assert snapshot(url) == ([], [])


def test_db_upgrade_on_postgresql(postgres_server: Any) -> None:
    postgres_server.create_database("cli_upgrade")
    try:
        url = postgres_server.url("cli_upgrade")
        runner = CliRunner()
        before = runner.invoke(main, ["--database", url, "limits", "list"])
        assert_one_line_error(before)
        assert "metering db upgrade" in before.stderr
        upgraded = runner.invoke(main, ["--database", url, "db", "upgrade"])
        assert upgraded.exit_code == 0, upgraded.output
        assert f"schema at revision {SCHEMA_REVISION}" in upgraded.output
        args = ["--database", url, "limits", "set", "a", "--max", "1", "--period", "1m"]
        result = runner.invoke(main, args)
        assert result.exit_code == 0, result.output
    finally:
        postgres_server.drop_database("cli_upgrade")


def test_database_url_from_the_environment(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METERING_DATABASE_URL", url)
    result = CliRunner().invoke(main, ["limits", "set", "x", "--max", "1", "--period", "1m"])
    assert result.exit_code == 0, result.output
    assert [limit.name for limit in snapshot(url)[0]] == ["x"]


# -- bad input: one error line, exit 1, nothing changed ----------------------------------

BAD_INPUTS = {
    "unknown limit": ["consume", "visitor-1", "nope"],
    "cost 0": ["consume", "visitor-1", "send_message", "--cost", "0"],
    "cost -1": ["consume", "visitor-1", "send_message", "--cost", "-1"],
    "cost 1.5": ["consume", "visitor-1", "send_message", "--cost", "1.5"],
    "huge cost": ["consume", "visitor-1", "send_message", "--cost", "1" + "0" * 30],
    "empty subject": ["consume", "", "send_message"],
    "control character subject": ["consume", "bad\nsubject", "send_message"],
    "overlong subject": ["consume", "s" * 201, "send_message"],
    "malformed event id": ["consume", "visitor-1", "send_message", "--event-id", "bad id!"],
    "malformed result id": ["result", "bad id!"],
    "bad period": ["limits", "set", "send_message", "--max", "9", "--period", "2 fortnights"],
    "bad maximum": ["limits", "set", "send_message", "--max", "0", "--period", "1m"],
    "bad limit name": ["limits", "set", "Send Message", "--max", "1", "--period", "1m"],
    "soft bucket": [
        "limits",
        "set",
        "send_message",
        "--max",
        "9",
        "--period",
        "1m",
        "--algorithm",
        "token_bucket",
        "--enforcement",
        "soft",
    ],
    "bad algorithm": ["limits", "set", "x", "--max", "1", "--period", "1m", "--algorithm", "y"],
    "missing limits file": ["limits", "load", "/nonexistent/limits.yaml"],
    "unknown option": ["consume", "visitor-1", "send_message", "--bogus"],
    "unknown command": ["frobnicate"],
    "no charge": ["consume"],
    "charge and subject": ["consume", "v", "send_message", "--charge", "v:org_calls:1"],
    "malformed charge": ["consume", "--charge", "visitor-1"],
    "fractional charge cost": ["consume", "--charge", "visitor-1:send_message:1.5"],
    "repeated charge": ["consume", "--charge", "v:send_message:1", "--charge", "v:send_message:2"],
    "bad --at": ["consume", "visitor-1", "send_message", "--at", "yesterday"],
    "--at too old": ["consume", "visitor-1", "send_message", "--at", "2001-01-01T00:00:00"],
    "--at in the future": ["consume", "visitor-1", "send_message", "--at", "2999-01-01"],
    "conflicting event id": [
        "consume",
        "visitor-1",
        "send_message",
        "--cost",
        "2",
        "--event-id",
        "seen-1",
    ],
    "reset bad subject": ["reset", "--subject", ""],
    "unknown limit check": ["check", "visitor-1", "nope"],
}


@pytest.mark.parametrize("args", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_bad_input_gives_one_error_line_and_changes_nothing(
    with_limits: Run, url: str, args: list[str]
) -> None:
    with_limits("consume", "visitor-1", "send_message", "--event-id", "seen-1")
    before = snapshot(url)
    assert_one_line_error(with_limits(*args, code=None))
    assert snapshot(url) == before


def test_unreachable_database_gives_one_error_line() -> None:
    runner = CliRunner()
    for args in (["limits", "list"], ["consume", "v", "x"], ["db", "upgrade"]):
        result = runner.invoke(main, ["--database", "postgresql://nobody@127.0.0.1:1/x", *args])
        assert_one_line_error(result)
        assert "database unavailable" in result.stderr


def test_unsupported_database_url_gives_one_error_line() -> None:
    result = CliRunner().invoke(main, ["--database", "mysql://localhost/x", "limits", "list"])
    assert_one_line_error(result)


@pytest.mark.slow
def test_python_dash_m_prints_errors_without_traceback(url: str) -> None:
    command = [sys.executable, "-m", "metering", "--database", url, "consume", "v", "nope"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == "error: unknown limit 'nope': define it with `metering limits set`\n"


def test_help_documents_the_exit_codes() -> None:
    out = CliRunner().invoke(main, ["consume", "--help"]).output
    assert "Exit codes" in out and "2  denied" in out


# -- demo ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_runs_the_pipeline_in_fresh_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's first command: a real worker process, the producer, results,
    a webhook delivered by the worker and verified, the month's overage report
    and its chart; its closing hint runs as printed, with `metering` not on PATH."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("METERING_HOME", raising=False)
    monkeypatch.setenv("PATH", os.defpath)
    (tmp_path / ".metering").mkdir()
    (tmp_path / ".metering" / "metering-demo.db").write_text("an old demo database")
    (tmp_path / ".metering" / "metering-demo-overage.png").write_text("an old chart")
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 0, (result.output, result.exception)
    path = tmp_path / ".metering" / "metering-demo.db"
    assert f"data: {path}" in result.output
    assert "denied" in result.output and "overage" in result.output
    assert (
        "webhook limit.denied for visitor-1 (send_message) delivered by the worker: "
        "signature verified" in result.output
    )
    assert f"Overage, {datetime.now(UTC):%Y-%m}" in result.output
    chart = tmp_path / ".metering" / "metering-demo-overage.png"
    assert f"chart of the overage report: {chart}" in result.output
    assert chart.read_bytes().startswith(b"\x89PNG")
    [hint] = [line for line in result.output.splitlines() if line.startswith("explore: ")]
    explored = subprocess.run(
        hint.removeprefix("explore: "), shell=True, capture_output=True, text=True, check=False
    )
    assert explored.returncode == 0, (hint, explored.stderr)
    assert "demo-0001" in explored.stdout or "allowed" in explored.stdout
    with Meter(f"sqlite:///{path}") as meter:
        assert {limit.name for limit in meter.list_limits()} == {
            "api_calls",
            "search",
            "send_message",
        }
        counters = meter.counters(subject="visitor-1")
        assert counters and counters[0].denied_count > 0
        emitted = int(result.output.split(" events, each with exactly one result")[0].split()[-1])
        assert meter.count_results() == emitted
        assert meter.result("demo-0001") is not None
    assert not (tmp_path / "metering.db").exists()
    # Nothing left in the working directory but the data directory.
    assert [p.name for p in tmp_path.iterdir()] == [".metering"]


def test_the_printed_metering_command_runs_from_the_project_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`make demo` leaves `metering` in .venv/bin, not on PATH: the hint names it so."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    monkeypatch.setenv("PATH", os.defpath)
    command = metering_command()
    if Path(sys.executable).parent.is_relative_to(root):
        assert command.startswith(".venv"), command
    ran = subprocess.run(
        f"{command} --version", shell=True, capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, (command, ran.stderr)
    assert ran.stdout.startswith("metering, version"), ran.stdout
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.defpath}")
    assert metering_command() == "metering"


def test_the_demos_receiver_verifies_a_signed_webhook_and_refuses_a_forged_one(
    tmp_path: Path,
) -> None:
    secret = generate_secret()
    body = json.dumps({"type": "limit.denied", "data": {"subject": "s", "limit": "calls"}})
    now = datetime.now(UTC)
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": sign(body, "msg_1", now, secret),
        "content-type": "application/json",
    }
    files = DemoFiles.fresh(tmp_path)
    idle = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        with WebhookReceiver() as receiver:
            with pytest.raises(MeteringError, match="no webhook reached the demo's receiver"):
                receiver.wait(lambda _: True, idle, files, timeout=0.3)
            httpx.post(receiver.url, content=body, headers=headers).raise_for_status()
            webhook = receiver.wait(lambda _: True, idle, files)
    finally:
        idle.communicate()
    assert webhook_line(webhook, secret) == (
        "webhook limit.denied for s (calls) delivered by the worker: signature verified"
    )
    with pytest.raises(MeteringError, match="failed verification: no matching signature"):
        webhook_line(webhook, generate_secret())


def test_the_demo_says_how_to_get_charts_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    line = chart_line([], tmp_path / "chart.png", "2026-11")
    assert "matplotlib (the charts extra) is missing" in line
    assert "-m pip install 'matplotlib>=3.8'" in line
    assert not (tmp_path / "chart.png").exists()


# -- queue -----------------------------------------------------------------------------------


def test_emit_queues_an_event_and_prints_its_id(tmp_path: Path) -> None:
    broker = f"sqla+sqlite:///{tmp_path}/broker.db"
    result = CliRunner().invoke(
        main,
        ["emit", "org-42", "api_calls", "--cost", "3", "--event-id", "e-1", "--broker", broker],
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.output.strip() == "e-1"
    as_json = CliRunner().invoke(
        main, ["emit", "--charge", "u:calls:1", "--format", "json", "--broker", broker]
    )
    assert as_json.exit_code == 0, (as_json.output, as_json.exception)
    assert len(json.loads(as_json.output)["event_id"]) == 32
    with sqlite3.connect(tmp_path / "broker.db") as connection:
        assert connection.execute("SELECT count(*) FROM kombu_message").fetchone() == (2,)


def test_emit_refuses_an_unknown_limit_of_its_database_in_one_line(tmp_path: Path) -> None:
    broker = f"sqla+sqlite:///{tmp_path}/broker.db"
    database = f"sqlite:///{tmp_path}/metering.db"
    with Meter(database) as meter:
        meter.set_limit(Limit("api_calls", maximum=10, period="1h"))
    result = CliRunner().invoke(
        main, ["--database", database, "emit", "org-42", "api_cals", "--broker", broker]
    )
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        "error: unknown limit 'api_cals': define it with `metering limits set`"
    ]
    assert not (tmp_path / "broker.db").exists()


def test_emit_rejects_bad_input_in_one_line(tmp_path: Path) -> None:
    broker = f"sqla+sqlite:///{tmp_path}/broker.db"
    result = CliRunner().invoke(main, ["emit", "s", "calls", "--cost", "-1", "--broker", broker])
    assert result.exit_code == 1
    assert result.output.strip().startswith("error: cost")
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_rejected_lists_what_could_not_be_applied(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    empty = CliRunner().invoke(main, ["--database", url, "rejected"])
    assert empty.exit_code == 0 and "no rejected messages" in empty.output
    with Meter(url) as meter:
        apply_batch(meter, {"nope": 1})
    listed = CliRunner().invoke(main, ["--database", url, "rejected", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.output)
    assert row["event_id"] is None and "not a metering batch" in row["reason"]


def test_rejected_lists_rejected_events_and_replay_applies_them_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    event = make_event([("org-42", "api_cals", 3)], datetime.now(UTC), "typo-1")
    with Meter(url) as meter:
        apply_batch(meter, encode_batch([encode_event(event)]))  # as a worker does
    listed = CliRunner().invoke(main, ["--database", url, "rejected"])
    assert listed.exit_code == 0, listed.output
    assert "typo-1" in listed.output and "unknown limit 'api_cals'" in listed.output
    waiting = CliRunner().invoke(main, ["--database", url, "rejected", "replay"])
    assert waiting.exit_code == 0, waiting.output
    assert waiting.output.startswith("replayed 0 events; 1 still rejected")
    with Meter(url) as meter:
        meter.set_limit(Limit("api_cals", maximum=10, period="1h"))
    for expected in ("replayed 1 event (1 allowed); 0 still rejected", "replayed 0 events"):
        done = CliRunner().invoke(main, ["--database", url, "rejected", "replay"])
        assert done.exit_code == 0, done.output
        assert done.output.startswith(expected)
    with Meter(url) as meter:
        assert sum(c.used for c in meter.counters("org-42", "api_cals")) == 3
    empty = CliRunner().invoke(main, ["--database", url, "rejected"])
    assert "no rejected messages" in empty.output


@pytest.mark.parametrize(
    "args", [[], ["limits"], ["webhooks"], ["report"], ["reservations"], ["db"]], ids=str
)
def test_a_bare_group_prints_its_help_and_exits_0(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.startswith(f"Usage: {' '.join(['metering', *args])} [OPTIONS] COMMAND")
    listed = "Commands:" in result.stdout or "Limits and customers:" in result.stdout  # the root
    assert listed and "error" not in result.output


def test_the_embedded_worker_says_it_runs_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's banner showed 'concurrency: 2 (solo)': a solo pool is one process."""
    started: list[list[str]] = []
    monkeypatch.setattr("os.execve", lambda _path, argv, _env: started.append(argv))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("METERING_BROKER_URL", raising=False)
    result = CliRunner().invoke(main, ["worker"])
    assert result.exit_code == 0, (result.output, result.exception)
    [argv] = started
    assert argv[argv.index("--pool") + 1] == "solo"
    assert argv[argv.index("--concurrency") + 1] == "1"
    asked = CliRunner().invoke(main, ["worker", "--concurrency", "4"])
    assert asked.exit_code == 0, (asked.output, asked.exception)
    assert started[1][started[1].index("--concurrency") + 1] == "1"
    assert asked.stderr == (
        "warning: the embedded broker runs one worker process: --concurrency 4 is ignored"
        " (use Redis for more)\n"
    )


def test_a_redis_worker_gets_the_concurrency_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr("os.execve", lambda _path, argv, _env: started.append(argv))
    broker = "redis://127.0.0.1:1/0"
    result = CliRunner().invoke(main, ["worker", "--concurrency", "3", "--broker", broker])
    assert result.exit_code == 0, (result.output, result.exception)
    [argv] = started
    assert argv[argv.index("--concurrency") + 1] == "3" and "--pool" not in argv


def test_the_embedded_worker_keeps_beat_s_schedule_in_the_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr("os.execve", lambda _path, argv, _env: started.append(argv))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("METERING_BROKER_URL", raising=False)
    monkeypatch.delenv("METERING_HOME", raising=False)
    assert CliRunner().invoke(main, ["worker"]).exit_code == 0
    monkeypatch.setenv("METERING_HOME", str(tmp_path / "home"))
    assert CliRunner().invoke(main, ["worker", "--beat"]).exit_code == 0
    schedules = [Path(argv[argv.index("--schedule") + 1]) for argv in started]
    assert schedules == [
        tmp_path / ".metering" / "beat-schedule",
        tmp_path / "home" / "beat-schedule",
    ]
    assert all(schedule.parent.is_dir() for schedule in schedules)


@pytest.mark.parametrize(
    ("args", "environ", "queues"),
    [
        ([], {}, "metering"),
        (["--queues", "2"], {}, "metering,metering.0,metering.1"),
        ([], {"METERING_QUEUES": "3"}, "metering,metering.0,metering.1,metering.2"),
    ],
)
def test_a_worker_consumes_the_default_queue_beside_the_routed_ones(
    args: list[str], environ: dict[str, str], queues: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--queues 2` consumed metering.0 and .1 but never `metering`, where beat,
    `metering emit` and one-queue producers publish; METERING_QUEUES was ignored."""
    started: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr("os.execve", lambda _path, argv, env: started.append((argv, env)))
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(main, ["worker", "--broker", "redis://127.0.0.1:1/0", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    [(argv, env)] = started
    assert argv[argv.index("--queues") + 1] == queues
    assert env["METERING_QUEUES"] == str(queues.count(",") or 1)
