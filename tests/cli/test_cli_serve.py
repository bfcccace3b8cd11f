"""``metering serve`` (`metering/cli/serve.py`) with no configuration: SQLite
and the embedded broker in the working directory, a real process on a
loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from loopback import wait_until_serving
from servers import free_port

START_TIMEOUT_SECONDS = 60.0


def _metering(*args: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "metering", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, str]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    _metering("limits", "set", "api_calls", "--max", "5", "--period", "1h", cwd=tmp_path, env=env)
    port = free_port()
    command = [sys.executable, "-m", "metering", "serve", "--port", str(port)]
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(process, base, tmp_path / "serve.log", START_TIMEOUT_SECONDS)
        yield base, tmp_path, env
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
        log.close()


@pytest.mark.server  # `metering serve` under uvicorn, in a subprocess
def test_metering_serve_runs_on_the_embedded_default(
    served: tuple[str, Path, dict[str, str]],
) -> None:
    base, workdir, env = served
    event = {"event_id": "job-1", "subject": "org-1", "limit": "api_calls", "cost": 2}
    with httpx.Client(base_url=base, timeout=30) as client:
        decided = client.post("/v1/events", params={"wait": "decision"}, json=event)
        assert decided.status_code == 200
        assert decided.json()["results"][0]["remaining"] == 3
        queued = client.post("/v1/events", json={**event, "event_id": "job-2"})
        assert queued.status_code == 202
        assert queued.json()["accepted"] == ["job-2"]
        schema = client.get("/openapi.json").json()
        assert schema["openapi"].startswith("3.1")
        assert client.get("/docs").status_code == 200
    # The same database as the command line's.
    assert '"outcome": "allowed"' in _metering(
        "result", "job-1", "--format", "json", cwd=workdir, env=env
    )
    assert (workdir / "metering-broker.db").exists()  # job-2 waits for a worker there
