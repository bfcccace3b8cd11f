"""Real HTTP servers for the middleware tests: uvicorn (ASGI) and waitress (WSGI).

Each runs in a thread of the test process, listening on a free loopback
port, so the test shares its `Meter` (and frozen clock) with the app while
every request goes through a real server and a real HTTP client.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import uvicorn
from waitress.server import create_server

from metering import FrozenClock, Limit, Meter

# Half a minute into a calendar minute: a denial retries after 30 s.
START = datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC)

Serve = Callable[[Any], str]


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    """Three requests a minute per IP, five per user."""
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("per_ip", maximum=3, period="1m", window="calendar"))
        m.set_limit(Limit("per_user", maximum=5, period="1m", window="calendar"))
        yield m


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise AssertionError(f"nothing listens on port {port}")


@pytest.fixture
def serve_asgi() -> Iterator[Serve]:
    """``serve_asgi(app)`` → base URL of uvicorn serving ``app``."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def serve(app: Any) -> str:
        port = _free_port()
        # proxy_headers=False: uvicorn itself believes X-Forwarded-For from
        # 127.0.0.1 by default, which would hide what the middleware does.
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            proxy_headers=False,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        _wait_listening(port)
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def serve_wsgi() -> Iterator[Serve]:
    """``serve_wsgi(app)`` → base URL of waitress serving ``app``."""
    servers: list[tuple[Any, threading.Thread]] = []

    def serve(app: Any) -> str:
        # Waitress drops X-Forwarded-* from untrusted peers by itself; keep
        # them so the tests see what the middleware does. poll(), not
        # select(): a connection closed at teardown while the loop waits on
        # it is then a hang-up, not EBADF raised in the server's thread.
        server = create_server(
            app,
            host="127.0.0.1",
            port=0,
            threads=8,
            clear_untrusted_proxy_headers=False,
            asyncore_use_poll=True,
        )
        port = int(server.effective_port)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        _wait_listening(port)
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, thread in servers:
        server.close()
        thread.join(10)
