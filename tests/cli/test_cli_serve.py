"""``metering serve`` (`metering/cli/serve.py`) with no configuration: SQLite
and the embedded broker in the working directory, a real process on a
loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
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
    env["METERING_API_BODY_TIMEOUT"] = "1"
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


@pytest.mark.server
def test_a_client_that_declares_more_body_than_it_sends_is_let_go(
    served: tuple[str, Path, dict[str, str]],
) -> None:
    base, _, _ = served
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        began = time.monotonic()
        head = "POST /v1/events HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        client.sendall(f'{head}content-length: 500\r\n\r\n{{"event_id"'.encode())
        answer = b""
        while chunk := client.recv(65536):  # until the server closes the connection
            answer += chunk
        waited = time.monotonic() - began
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert b"connection: close" in rest.lower()
    assert b"did not arrive within 1 seconds" in rest
    assert 0.9 < waited < 8  # METERING_API_BODY_TIMEOUT, then the server let go
