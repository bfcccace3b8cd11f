"""``metering serve`` stopped while it keeps events (issue 19, item 12).

Events accepted while the broker is down are kept by the server's producer,
to be queued when it is back (the 503 says so, ``kept``). Stopping the
server then used to take 13 s, print a 155-line "Application shutdown
failed" traceback and exit 0; ``GET /v1/events/{id}`` of a kept event
answered 503 with ``"kept": []``. Now that GET says the event is kept, and
the shutdown prints one line naming the ids not sent and exits non-zero.
A real ``metering serve`` process, on a Redis of its own that the test stops.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from servers import RedisServer, find_redis_server, free_port

from metering import Limit, Meter

pytestmark = [pytest.mark.slow, pytest.mark.redis]
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 60.0


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


def test_stopping_serve_with_kept_events_names_them_and_fails(
    tmp_path: Path, redis: RedisServer
) -> None:
    database_url = f"sqlite:///{tmp_path}/metering.db"
    with Meter(database_url) as meter:
        meter.set_limit(Limit("api_calls", maximum=100, period="1h"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(METERING_DATABASE_URL=database_url, METERING_BROKER_URL=redis.url())
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    command = [sys.executable, "-m", "metering", "serve", "--port", str(port), "--no-access-log"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        _wait_ready(process, base, log_path)
        with httpx.Client(base_url=base, timeout=60) as http:
            event = {"subject": "org-1", "limit": "api_calls", "event_id": "sent-1"}
            assert http.post("/v1/events", json=event).status_code == 202
            redis.stop()
            for event_id in ("kept-1", "kept-2"):
                answer = http.post("/v1/events", json={**event, "event_id": event_id})
                assert answer.status_code == 503, answer.text
                assert answer.json()["kept"] == [event_id]
            looked_up = http.get("/v1/events/kept-1")
            assert looked_up.status_code == 200, looked_up.text
            assert looked_up.json()["status"] == "kept"
            assert looked_up.json()["event_id"] == "kept-1"
        process.send_signal(signal.SIGINT)
        code = process.wait(STOP_TIMEOUT_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log_path.read_text(errors="replace")
    assert code == 1, output
    assert "Traceback" not in output and "shutdown failed" not in output, output
    unsent = [line for line in output.splitlines() if "not sent" in line]
    assert len(unsent) == 1, output
    assert "kept-1" in unsent[0] and "kept-2" in unsent[0] and "sent-1" not in unsent[0]


def _wait_ready(process: subprocess.Popen[bytes], base: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        try:
            httpx.get(f"{base}/openapi.json")
            return
        except httpx.TransportError:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "metering serve did not start"
            time.sleep(0.1)
