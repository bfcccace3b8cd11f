"""``metering demo`` (`metering/cli/demo.py`): the pipeline in fresh files, the
hint it prints runnable as printed, the webhook line verified (or a forged one
refused), and the chart's line without matplotlib."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from metering import Meter
from metering.cli import main
from metering.cli.demo import chart_line, metering_command, webhook_line
from metering.demo import DemoFiles, WebhookReceiver
from metering.errors import MeteringError
from metering.webhooks import generate_secret, sign


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
