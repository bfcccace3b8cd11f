"""Admin test pings do not starve readers (issue 19, item 14).

45 concurrent ``POST /v1/webhooks/endpoints/{id}/test`` to a slow receiver
used to hold the server's worker threads (the pool every route's blocking
call shares), so a read key's ``GET`` waited for them. Now pings run on a
few threads of their own (`MAX_TEST_PINGS`); beyond that they are answered
429 with ``Retry-After`` at once. The test holds every ping the receiver gets
until a ``GET`` has been answered: ordering, not timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.api.context import MAX_TEST_PINGS
from metering.apikeys import ApiKeys
from metering.settings import Settings
from metering.webhooks import DeliverySettings, Webhooks

Serve = Callable[[Any], str]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PINGS = 45
# Only a guard against a hang: nothing waits this long when the server is right.
GUARD_SECONDS = 60.0


class SlowReceiver:
    """A loopback receiver that holds every request until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.arrived = threading.Semaphore(0)
        self.held = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                with lock:
                    outer.held += 1
                outer.arrived.release()
                outer.release.wait(GUARD_SECONDS)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[SlowReceiver]:
    slow = SlowReceiver()
    try:
        yield slow
    finally:
        slow.close()


def test_many_slow_pings_leave_readers_answered(
    serve_api: Serve, sqlite_url: str, tmp_path: Path, receiver: SlowReceiver
) -> None:
    with Meter(sqlite_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("api_calls", maximum=5, period="1h"))
        keys = ApiKeys(meter)
        _, admin = keys.create("admin", name="ops")
        _, read = keys.create("read", name="dashboard")
        endpoint, _ = Webhooks(meter).add(receiver.url)
        delivery = DeliverySettings(timeout_seconds=GUARD_SECONDS, allow_private=True)
        settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db", delivery=delivery)
        base = serve_api(create_api(settings, meter=meter))
        limits = httpx.Limits(max_connections=PINGS + 5)
        with (
            httpx.Client(base_url=base, timeout=GUARD_SECONDS * 2, limits=limits) as http,
            ThreadPoolExecutor(PINGS) as pool,
        ):
            auth = {"authorization": f"Bearer {admin}"}
            path = f"/v1/webhooks/endpoints/{endpoint.id}/test"
            pings = [pool.submit(http.post, path, headers=auth) for _ in range(PINGS)]
            # The receiver holds the pings that were let through ...
            for _ in range(MAX_TEST_PINGS):
                assert receiver.arrived.acquire(timeout=GUARD_SECONDS), "no ping arrived"
            # ... the others are answered without them, 429 with Retry-After ...
            answered = as_completed(pings, timeout=GUARD_SECONDS)
            refused = [next(answered).result() for _ in range(PINGS - MAX_TEST_PINGS)]
            assert sum(not p.done() for p in pings) == MAX_TEST_PINGS
            for answer in refused:
                assert answer.status_code == 429, answer.text
                assert int(answer.headers["retry-after"]) >= 1
                assert answer.json()["type"] == "urn:metering:problem:rate-limited"
            # ... and a reader is answered while every admitted ping is still held.
            usage = http.get(
                "/v1/subjects/org-1/usage", headers={"authorization": f"Bearer {read}"}
            )
            assert usage.status_code == 200
            assert not receiver.release.is_set() and receiver.held == MAX_TEST_PINGS
            receiver.release.set()
            admitted = [
                answer
                for answer in (p.result(GUARD_SECONDS) for p in pings)
                if answer.status_code != 429
            ]
        assert [a.json()["status"] for a in admitted] == ["delivered"] * MAX_TEST_PINGS
        assert receiver.held == MAX_TEST_PINGS
