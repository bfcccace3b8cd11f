"""The demo's parts (`metering/demo.py`) without a worker: fresh files (an old
demo's and SQLite's side files removed), the same three minutes of usage on
every run, results waited for until a stopped worker or the deadline says
where to look, and the receiver on loopback that takes the webhook waited for
(one that never comes, and the signature: tests/cli/test_cli_demo.py).
(The whole demo, with its worker: tests/cli/test_cli_demo.py.)"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from metering import Limit, Meter
from metering.demo import DemoFiles, WebhookReceiver, demo_events, wait_for_results
from metering.errors import MeteringError

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def idle() -> Iterator[subprocess.Popen[bytes]]:
    """A process that waits for its stdin, as a running worker would."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        yield process
    finally:
        process.communicate()


def test_fresh_files_leave_nothing_of_an_old_demo(tmp_path: Path) -> None:
    for name in (
        "metering-demo.db",
        "metering-demo.db-wal",
        "metering-demo-broker.db-shm",
        "metering-demo-overage.png",
    ):
        (tmp_path / name).write_text("old")
    (tmp_path / "keep.txt").write_text("mine")
    files = DemoFiles.fresh(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    assert files.database_url == f"sqlite:///{tmp_path / 'metering-demo.db'}"
    assert files.broker_url == f"sqla+sqlite:///{tmp_path / 'metering-demo-broker.db'}"


def test_the_demos_usage_is_the_same_three_minutes_each_run() -> None:
    events = demo_events(START)
    assert events == demo_events(START)
    times = [when for when, _ in events]
    assert times == sorted(times) and times[0] >= START and times[-1] < START + timedelta(minutes=3)
    visitor = [c for _, charges in events for c in charges if c[0] == "visitor-1"]
    assert len(visitor) == 12 and {c[1] for c in visitor} == {"send_message"}


def test_waiting_for_results_says_where_to_look(
    tmp_path: Path, idle: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    files = DemoFiles.fresh(tmp_path)
    seen: list[int] = []
    with Meter(files.database_url) as meter:
        meter.set_limit(Limit("calls", maximum=5, period="1h"))
        meter.consume("org", "calls")
        wait_for_results(meter, 1, idle, files, seen.append)
        assert seen == [1]
        monkeypatch.setattr("metering.demo.RESULTS_TIMEOUT_SECONDS", 0.0)
        with pytest.raises(
            MeteringError, match=r"results did not arrive in time; see .*worker\.log"
        ):
            wait_for_results(meter, 2, idle, files, seen.append)
        stopped = subprocess.Popen([sys.executable, "-c", "pass"])
        stopped.wait()
        with pytest.raises(MeteringError, match="the demo worker stopped"):
            wait_for_results(meter, 2, stopped, files, seen.append)


def test_the_receiver_takes_the_webhook_it_is_waiting_for(
    tmp_path: Path, idle: subprocess.Popen[bytes]
) -> None:
    files = DemoFiles.fresh(tmp_path)
    with WebhookReceiver() as receiver:
        assert receiver.url.startswith("http://127.0.0.1:")
        for kind in ("limit.threshold", "limit.denied"):
            httpx.post(
                receiver.url, content=f'{{"type": "{kind}"}}', headers={"webhook-id": kind}
            ).raise_for_status()
        webhook = receiver.wait(lambda hook: b"limit.denied" in hook.body, idle, files)
    assert webhook.headers["webhook-id"] == "limit.denied"
