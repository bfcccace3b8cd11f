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

Serve = Callable[..., str]


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


def _listening_socket(host: str) -> socket.socket:
    """A socket bound to a free port of ``host``. An IPv6 host is dual-stack:
    bound to ``::ffff:127.0.0.1``, it takes IPv4 connections to 127.0.0.1
    and the application sees the peer as that IPv4-mapped address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((host, 0))
    return sock


def _wait_listening(host: str, port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"nothing listens on port {port}")


def _base_url(host: str, port: int) -> str:
    if host.startswith("::ffff:"):  # reached over IPv4
        host = host.removeprefix("::ffff:")
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@pytest.fixture
def serve_asgi() -> Iterator[Serve]:
    """``serve_asgi(app, host="127.0.0.1")`` → base URL of uvicorn serving ``app``.

    ``host="::1"`` serves IPv6 clients; ``host="::ffff:127.0.0.1"`` IPv4
    clients seen as IPv4-mapped IPv6 addresses (a dual-stack listener).
    """
    servers: list[tuple[uvicorn.Server, threading.Thread, socket.socket]] = []

    def serve(app: Any, host: str = "127.0.0.1") -> str:
        sock = _listening_socket(host)
        port = int(sock.getsockname()[1])
        # proxy_headers=False: uvicorn itself believes X-Forwarded-For from
        # 127.0.0.1 by default, which would hide what the middleware does.
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            proxy_headers=False,
            # h11 passes header values httptools refuses (a DEL byte in a
            # key, say), so the middleware itself meets them: that is what
            # these tests are about.
            http="h11",
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        servers.append((server, thread, sock))
        base = _base_url(host, port)
        _wait_listening(host.removeprefix("::ffff:"), port)
        return base

    yield serve
    # All told to stop before any is waited for: each notices within its
    # tick (a tenth of a second), together rather than one after another.
    for server, _thread, _sock in servers:
        server.should_exit = True
    for _server, thread, sock in servers:
        thread.join(10)
        sock.close()


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
        _wait_listening("127.0.0.1", port)
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, _thread in servers:
        # Closed in its own loop's thread, woken by waitress's trigger: closed
        # from here, the loop would notice only at its poll's timeout (1 s).
        try:
            server.trigger.pull_trigger(server.close)
        except OSError:  # its trigger already closed (seen once: EBADF): close from here
            server.close()
    for _server, thread in servers:
        thread.join(10)
