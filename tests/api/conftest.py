"""The HTTP API under a real uvicorn on a loopback port, for real HTTP clients.

`serve_api(app)` runs uvicorn in a thread of the test process (lifespan on,
so the app opens and closes what it owns) on a free port of 127.0.0.1 and
returns the base URL; the test may share its `Meter` (and frozen clock)
with the app. The default app here runs on SQLite and the embedded broker
in the test's directory, as ``metering serve`` does with no configuration.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

Serve = Callable[[Any], str]


def wait_started(server: uvicorn.Server, thread: threading.Thread, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive():
            raise AssertionError("uvicorn stopped before it started (see the log above)")
        if time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start")
        time.sleep(0.01)


@pytest.fixture
def serve_api() -> Iterator[Serve]:
    """``serve_api(app)`` → the base URL of uvicorn serving ``app``; stopped after the test."""
    running: list[tuple[uvicorn.Server, threading.Thread, socket.socket]] = []

    def serve(app: Any) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        running.append((server, thread, sock))
        wait_started(server, thread)
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, thread, sock in running:
        server.should_exit = True
        thread.join(15)
        sock.close()


@pytest.fixture
def embedded(tmp_path: Path) -> dict[str, str]:
    """URLs of the embedded default in the test's directory: SQLite and the SQLite broker."""
    return {
        "database_url": f"sqlite:///{tmp_path}/metering.db",
        "broker_url": f"sqla+sqlite:///{tmp_path}/metering-broker.db",
    }
