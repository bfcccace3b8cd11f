"""Admin test pings do not starve readers (issue 19, item 14), and meet the
removal of their endpoint with a 404 or before it, never a 500.

45 concurrent ``POST /v1/webhooks/endpoints/{id}/test`` to a slow receiver
used to hold the server's worker threads (the pool every route's blocking
call shares), so a read key's ``GET`` waited for them. Now pings run on a
few threads of their own (`MAX_TEST_PINGS`); beyond that they are answered
429 with ``Retry-After`` at once. The test holds every ping the receiver gets
until a ``GET`` has been answered: ordering, not timing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from lock_waits import WAIT_SECONDS, wait_until_blocked
from sqlalchemy import Connection, text

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


def _admin_api(
    serve_api: Serve, meter: Meter, tmp_path: Path
) -> tuple[httpx.Client, dict[str, str]]:
    _, admin = ApiKeys(meter).create("admin", name="ops")
    delivery = DeliverySettings(timeout_seconds=GUARD_SECONDS, allow_private=True)
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db", delivery=delivery)
    http = httpx.Client(
        base_url=serve_api(create_api(settings, meter=meter)), timeout=GUARD_SECONDS
    )
    return http, {"authorization": f"Bearer {admin}"}


def test_a_ping_whose_endpoint_is_removed_meanwhile_is_404(
    serve_api: Serve, db_url: str, tmp_path: Path, receiver: SlowReceiver
) -> None:
    """The endpoint is deleted while its ping is at the receiver: the ping
    answers 404 (no such endpoint any more), never a 500."""
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        endpoint, _ = Webhooks(meter).add(receiver.url)
        http, auth = _admin_api(serve_api, meter, tmp_path)
        path = f"/v1/webhooks/endpoints/{endpoint.id}"
        with http, ThreadPoolExecutor(1) as pool:
            ping = pool.submit(http.post, f"{path}/test", headers=auth)
            assert receiver.arrived.acquire(timeout=GUARD_SECONDS), "no ping arrived"
            assert http.delete(path, headers=auth).status_code == 204
            receiver.release.set()
            answer = ping.result(GUARD_SECONDS)
        assert answer.status_code == 404, answer.text
        assert answer.json()["type"] == "urn:metering:problem:not-found"
        assert Webhooks(meter).deliveries() == []


@pytest.mark.postgres
def test_a_ping_and_a_removal_of_its_endpoint_at_once_leave_nothing(
    serve_api: Serve, pg_url: str, tmp_path: Path, receiver: SlowReceiver
) -> None:
    """The ping has read its endpoint and waits to write its delivery (the
    outbox locked meanwhile) while the endpoint is deleted: the removal waits
    for the ping's transaction, then takes its delivery too; the ping, held
    at the receiver until then, answers 404. No 500, nothing left behind."""
    with Meter(pg_url, clock=FrozenClock(NOW), connections=20) as meter:
        endpoint, _ = Webhooks(meter).add(receiver.url)
        http, auth = _admin_api(serve_api, meter, tmp_path)
        path = f"/v1/webhooks/endpoints/{endpoint.id}"
        with http, ThreadPoolExecutor(2) as pool, meter.sql_engine.connect() as outbox:
            outbox.execute(text("LOCK TABLE webhook_messages IN EXCLUSIVE MODE"))
            blocker = outbox.execute(text("SELECT pg_backend_pid()")).scalar_one()
            ping = pool.submit(http.post, f"{path}/test", headers=auth)
            with meter.sql_engine.connect() as watcher:
                wait_until_blocked(watcher, blocker, "the ping")
                removal = pool.submit(http.delete, path, headers=auth)
                _until_done_or_waiting(removal, watcher)
            outbox.rollback()
            removed = removal.result(GUARD_SECONDS)
            receiver.release.set()
            answers = (ping.result(GUARD_SECONDS), removed)
        assert [a.status_code for a in answers] == [404, 204], [a.text for a in answers]
        assert Webhooks(meter).deliveries() == []


def _until_done_or_waiting(removal: Future[httpx.Response], watcher: Connection) -> None:
    """Until the removal is answered or waits for a lock (the ping's or the outbox's)."""
    waiting = text(
        "SELECT count(*) FROM pg_stat_activity WHERE cardinality(pg_blocking_pids(pid)) > 0"
    )
    deadline = time.monotonic() + WAIT_SECONDS
    while not removal.done() and watcher.execute(waiting).scalar_one() < 2:
        watcher.rollback()  # the statistics are a snapshot per transaction
        assert time.monotonic() < deadline, "the removal neither ended nor waited"
        time.sleep(0.002)
