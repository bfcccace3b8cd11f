"""``metering serve`` (`metering/cli/serve.py`) stopped by SIGINT or SIGTERM,
with and without kept events.

Events accepted while the broker is down are kept by the server's producer,
to be queued when it is back (the 503 says so, ``kept``). Stopped by either
signal (SIGTERM is how Docker and systemd stop a service), the server exits
0 after a clean drain; when kept events are dropped it prints one line
naming their ids and exits 1. ``GET /v1/events/{id}`` of a kept event says
it is kept. A real ``metering serve`` process, on a Redis of its own that
the test stops.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from loopback import wait_until_serving
from servers import RedisServer, find_redis_server, free_port

from metering import Limit, Meter

# `sqlite_url`: the migrated template's copy at tmp_path/metering.db, the
# database `_serve` gives the server.
pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.usefixtures("sqlite_url")]
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 60.0
STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM]
RETRY_BACKOFF_SECONDS = 0.01
EVENT = {"subject": "org-1", "limit": "api_calls", "event_id": "sent-1"}


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    if find_redis_server() is None:
        pytest.skip("redis-server not found on PATH")
    server = RedisServer(tmp_path / "redis", appendonly=False)
    server.start()
    try:
        yield server
    finally:
        server.destroy()
        shutil.rmtree(tmp_path / "redis", ignore_errors=True)


@pytest.mark.parametrize("stop_signal", STOP_SIGNALS, ids=lambda s: s.name)
def test_stopping_serve_with_kept_events_names_them_and_fails(
    tmp_path: Path, redis: RedisServer, stop_signal: signal.Signals
) -> None:
    with _serve(tmp_path, redis) as (process, base):
        with httpx.Client(base_url=base, timeout=60) as http:
            assert http.post("/v1/events", json=EVENT).status_code == 202
            redis.stop()
            for event_id in ("kept-1", "kept-2"):
                answer = http.post("/v1/events", json={**EVENT, "event_id": event_id})
                assert answer.status_code == 503, answer.text
                assert answer.json()["kept"] == [event_id]
            looked_up = http.get("/v1/events/kept-1")
            assert looked_up.status_code == 200, looked_up.text
            assert looked_up.json()["status"] == "kept"
            assert looked_up.json()["event_id"] == "kept-1"
        code = _stop(process, stop_signal)
    output = (tmp_path / "serve.log").read_text(errors="replace")
    assert code == 1, output
    assert "Traceback" not in output and "shutdown failed" not in output, output
    unsent = [line for line in output.splitlines() if "not sent" in line]
    assert len(unsent) == 1, output
    assert "kept-1" in unsent[0] and "kept-2" in unsent[0] and "sent-1" not in unsent[0]


@pytest.mark.parametrize("stop_signal", STOP_SIGNALS, ids=lambda s: s.name)
def test_stopping_serve_after_a_clean_drain_succeeds(
    tmp_path: Path, redis: RedisServer, stop_signal: signal.Signals
) -> None:
    with _serve(tmp_path, redis) as (process, base):
        assert httpx.post(f"{base}/v1/events", json=EVENT, timeout=60).status_code == 202
        code = _stop(process, stop_signal)
    output = (tmp_path / "serve.log").read_text(errors="replace")
    assert code == 0, output
    assert "Traceback" not in output and "Aborted" not in output, output
    assert "not sent" not in output, output


class _serve:
    """A ``metering serve`` process on a SQLite database and ``redis``, killed
    at the end if the test did not stop it; its output in ``serve.log``."""

    def __init__(self, tmp_path: Path, redis: RedisServer) -> None:
        self.tmp_path, self.redis = tmp_path, redis

    def __enter__(self) -> tuple[subprocess.Popen[bytes], str]:
        database_url = f"sqlite:///{self.tmp_path}/metering.db"
        with Meter(database_url) as meter:
            meter.set_limit(Limit("api_calls", maximum=100, period="1h"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
        env.update(METERING_DATABASE_URL=database_url, METERING_BROKER_URL=self.redis.url())
        # The retries before a 503 and at shutdown still run, five each, only
        # without the default's 3 s of waiting between them.
        env["METERING_API_RETRY_BACKOFF"] = str(RETRY_BACKOFF_SECONDS)
        port = free_port()
        command = [sys.executable, "-m", "metering", "serve", "--port", str(port)]
        log_path = self.tmp_path / "serve.log"
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [*command, "--no-access-log"], cwd=self.tmp_path, env=env, stdout=log, stderr=log
            )
        base = f"http://127.0.0.1:{port}"
        _wait_ready(self.process, base, log_path)
        return self.process, base

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _stop(process: subprocess.Popen[bytes], stop_signal: signal.Signals) -> int:
    process.send_signal(stop_signal)
    return process.wait(STOP_TIMEOUT_SECONDS)


def _wait_ready(process: subprocess.Popen[bytes], base: str, log_path: Path) -> None:
    wait_until_serving(process, base, log_path, START_TIMEOUT_SECONDS)
