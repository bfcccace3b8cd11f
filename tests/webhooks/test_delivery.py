"""Delivery over real HTTP to a loopback receiver: retries, 410, timeouts,
Retry-After, refusal of private addresses, replay, concurrent claims."""

from __future__ import annotations

import json
import re
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from fresh import run_fresh
from pytest_httpserver import HTTPServer
from waiting import wait_for
from werkzeug import Request, Response

from metering import FrozenClock, Limit, Meter
from metering.errors import ConfigurationError
from metering.settings import DEFAULT_SCHEDULE, parse_schedule
from metering.webhooks import DeliverySettings, Webhooks, verify
from metering.webhooks.delivery import retry_unanswered

FAST = DeliverySettings(timeout_seconds=2.0, schedule_seconds=(0.2, 0.2), allow_private=True)


def scripted(
    *answers: int | Callable[[], Response],
) -> tuple[Callable[[Request], Response], list[Request]]:
    """A handler answering with the given status codes (or callables) in turn, then 200."""
    seen: list[Request] = []
    lock = threading.Lock()

    def handle(request: Request) -> Response:
        with lock:
            seen.append(request)
            index = len(seen) - 1
        answer = answers[index] if index < len(answers) else 200
        return answer() if callable(answer) else Response("", status=answer)

    return handle, seen


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        yield meter


def one_denial(meter: Meter, subject: str = "visitor-1") -> None:
    meter.consume(subject, "send")
    assert not meter.consume(subject, "send").allowed


def deliver_until(hooks: Webhooks, done: Callable[[], bool], what: Callable[[], str]) -> None:
    def step() -> bool:
        hooks.deliver_due()
        return done()

    wait_for(step, what)


def only_delivery(hooks: Webhooks) -> Any:
    [delivery] = hooks.deliveries()
    return delivery


def test_500_twice_then_200_is_delivered_on_the_third_attempt(
    db_url: str, receiver: HTTPServer
) -> None:
    handle, seen = scripted(500, 500)
    receiver.expect_request("/hook", method="POST").respond_with_handler(handle)
    with Meter(db_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter, FAST)
        _, secret = hooks.add(receiver.url_for("/hook"), types=["limit.denied"])
        one_denial(meter)
        deliver_until(
            hooks,
            lambda: only_delivery(hooks).status == "delivered",
            lambda: str(hooks.deliveries()),
        )
        delivery = only_delivery(hooks)
        attempts = hooks.attempts(delivery.id)
    assert delivery.attempts == 3 and len(seen) == 3
    assert [a.status_code for a in attempts] == [500, 500, 200]
    assert [a.error for a in attempts] == ["HTTP 500", "HTTP 500", None]
    assert attempts[0].next_attempt_at_us is not None and attempts[2].next_attempt_at_us is None
    assert len({r.headers["webhook-id"] for r in seen}) == 1  # the same message each time
    last = seen[-1]
    verify(last.get_data(), dict(last.headers), secret)
    assert last.json["type"] == "limit.denied" and last.json["data"]["subject"] == "visitor-1"
    assert last.headers["content-type"] == "application/json"


def test_410_disables_the_endpoint_and_fails_the_delivery(
    meter: Meter, receiver: HTTPServer
) -> None:
    handle, seen = scripted(410)
    receiver.expect_request("/hook").respond_with_handler(handle)
    hooks = Webhooks(meter, FAST)
    hooks.add(receiver.url_for("/hook"))
    one_denial(meter)
    deliver_until(
        hooks, lambda: only_delivery(hooks).status != "pending", lambda: str(hooks.deliveries())
    )
    assert only_delivery(hooks).status == "failed" and only_delivery(hooks).last_status_code == 410
    [listed] = hooks.endpoints()
    assert not listed.enabled and "410" in (listed.disabled_reason or "")
    one_denial(meter, "visitor-2")  # a disabled endpoint gets no new deliveries
    hooks.deliver_due()
    assert len(seen) == 1 and len(hooks.deliveries()) == 1


def test_a_receiver_that_hangs_times_out_and_is_retried(meter: Meter, receiver: HTTPServer) -> None:
    release = threading.Event()

    def hang() -> Response:
        release.wait(10)
        return Response("late", status=200)

    handle, seen = scripted(hang)
    receiver.expect_request("/hook").respond_with_handler(handle)
    hooks = Webhooks(
        meter, DeliverySettings(timeout_seconds=0.5, schedule_seconds=(0.2,), allow_private=True)
    )
    hooks.add(receiver.url_for("/hook"))
    try:
        one_denial(meter)
        deliver_until(
            hooks, lambda: only_delivery(hooks).status != "pending", lambda: str(hooks.deliveries())
        )
    finally:
        release.set()
    delivery = only_delivery(hooks)
    first, second = hooks.attempts(delivery.id)
    assert first.status_code is None and first.error == "timeout after 0.5 s"
    assert first.next_attempt_at_us is not None
    assert second.status_code == 200 and delivery.status == "delivered" and len(seen) == 2


def test_retry_after_is_a_floor_for_the_next_attempt(meter: Meter, receiver: HTTPServer) -> None:
    handle, _ = scripted(lambda: Response("", status=503, headers={"Retry-After": "120"}))
    receiver.expect_request("/hook").respond_with_handler(handle)
    hooks = Webhooks(meter, FAST)
    hooks.add(receiver.url_for("/hook"))
    one_denial(meter)
    hooks.deliver_due()
    [attempt] = hooks.attempts(only_delivery(hooks).id)
    assert attempt.status_code == 503 and attempt.next_attempt_at_us is not None
    assert attempt.next_attempt_at_us - attempt.attempted_at_us >= 120_000_000
    assert hooks.deliver_due().delivered == 0  # not due yet


def test_after_the_last_attempt_the_delivery_fails_and_replay_sends_it_again(
    meter: Meter, receiver: HTTPServer
) -> None:
    handle, seen = scripted(500, 500)
    receiver.expect_request("/hook").respond_with_handler(handle)
    hooks = Webhooks(
        meter, DeliverySettings(timeout_seconds=2, schedule_seconds=(0.1,), allow_private=True)
    )
    hooks.add(receiver.url_for("/hook"))
    one_denial(meter)
    deliver_until(
        hooks, lambda: only_delivery(hooks).status != "pending", lambda: str(hooks.deliveries())
    )
    assert only_delivery(hooks).status == "failed" and len(seen) == 2
    assert hooks.replay([only_delivery(hooks).id]) == 1
    deliver_until(
        hooks, lambda: only_delivery(hooks).status == "delivered", lambda: str(hooks.deliveries())
    )
    assert len(seen) == 3 and len(hooks.attempts(only_delivery(hooks).id)) == 3


def test_private_addresses_are_refused_without_the_variable(
    meter: Meter, receiver: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("METERING_WEBHOOKS_ALLOW_PRIVATE", raising=False)
    receiver.expect_request("/hook").respond_with_data("ok")
    hooks = Webhooks(meter)  # settings from the environment
    hooks.add(receiver.url_for("/hook"))
    hooks.add("http://[::1]:9/hook")
    one_denial(meter)
    hooks.deliver_due()
    for delivery in hooks.deliveries():
        [attempt] = hooks.attempts(delivery.id)
        assert attempt.status_code is None and (attempt.error or "").startswith("refused:")
        assert "METERING_WEBHOOKS_ALLOW_PRIVATE" in (attempt.error or "")
    assert receiver.log == []


def test_several_workers_deliver_each_message_once(db_url: str, receiver: HTTPServer) -> None:
    handle, seen = scripted()
    receiver.expect_request("/hook").respond_with_handler(handle)
    with Meter(db_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter, FAST)
        hooks.add(receiver.url_for("/hook"))
        for n in range(20):
            one_denial(meter, f"s-{n}")
        threads = [threading.Thread(target=hooks.deliver_due) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        statuses = Counter(d.status for d in hooks.deliveries())
    assert statuses == {"delivered": 20}
    ids = Counter(r.headers["webhook-id"] for r in seen)
    assert len(ids) == 20 and set(ids.values()) == {1}


def test_the_schedule_and_timeouts_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert DeliverySettings.from_env().schedule_seconds == DEFAULT_SCHEDULE
    monkeypatch.setenv("METERING_WEBHOOKS_SCHEDULE", "1,1,2")
    monkeypatch.setenv("METERING_WEBHOOKS_TIMEOUT", "3")
    settings = DeliverySettings.from_env()
    assert settings.schedule_seconds == (1, 1, 2) and settings.timeout_seconds == 3
    for bad in ("", "x", "1,-1"):
        with pytest.raises(ConfigurationError):
            parse_schedule(bad)


def test_rotation_signs_with_both_secrets_during_the_grace(
    meter: Meter, receiver: HTTPServer
) -> None:
    handle, seen = scripted()
    receiver.expect_request("/hook").respond_with_handler(handle)
    hooks = Webhooks(meter, FAST)
    endpoint, old = hooks.add(receiver.url_for("/hook"))
    new = hooks.rotate(endpoint.id, grace_seconds=3600)
    one_denial(meter)
    hooks.deliver_due()
    [request] = seen
    assert len(request.headers["webhook-signature"].split()) == 2
    for secret in (old, new):
        verify(request.get_data(), dict(request.headers), secret)


def test_a_start_makes_unanswered_retries_due_and_keeps_answered_ones(
    meter: Meter, receiver: HTTPServer
) -> None:
    receiver.expect_request("/busy").respond_with_data("busy", status=503)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: the connection is refused
    settings = DeliverySettings(timeout_seconds=2, schedule_seconds=(3600.0,), allow_private=True)
    hooks = Webhooks(meter, settings)
    hooks.add(receiver.url_for("/busy"), types=["limit.denied"])
    hooks.add(f"http://127.0.0.1:{closed.getsockname()[1]}/x", types=["limit.denied"])
    try:
        one_denial(meter)
        hooks.deliver_due()
    finally:
        closed.close()
    later = {d.last_status_code: d.next_attempt_at_us for d in hooks.deliveries()}
    now_us = meter.database.now_us()
    assert set(later) == {503, None} and all(t > now_us + 3000e6 for t in later.values())

    assert retry_unanswered(meter) == 1
    after = {d.last_status_code: d.next_attempt_at_us for d in hooks.deliveries()}
    assert after[503] == later[503]  # the receiver answered: its schedule stands
    assert after[None] is not None and after[None] <= meter.database.now_us()
    assert retry_unanswered(meter) == 0


@pytest.mark.parametrize("public_url", [None, "https://metering.example.com/"])
def test_a_release_link_goes_absolute_under_the_public_url(
    db_url: str, receiver: HTTPServer, public_url: str | None
) -> None:
    """The stored message keeps the path; what is sent, and signed, adds the URL."""
    handle, seen = scripted()
    receiver.expect_request("/hook", method="POST").respond_with_handler(handle)
    clock = FrozenClock(datetime(2026, 11, 2, tzinfo=UTC))
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("api", maximum=10**6, period="1d", breaker="10x", breaker_floor=0.1))
        hooks = Webhooks(meter, replace(FAST, public_url=public_url))
        _, secret = hooks.add(receiver.url_for("/hook"), types=["limit.quarantined"])
        for _ in range(62):  # a minute at 60 a second trips the breaker
            meter.consume("org-1", "api", 60)
            clock.advance(seconds=1)
        [(_, _, stored)] = hooks.messages("limit.quarantined")
        deliver_until(hooks, lambda: len(seen) == 1, lambda: str(hooks.deliveries()))
    [sent] = seen
    verify(sent.get_data(), dict(sent.headers), secret, now=clock())
    data, kept = sent.json["data"], json.loads(stored)["data"]
    assert data["release_path"] == kept["release_path"]
    assert data["release_path"].startswith("/quarantine/release?token=")
    assert "release_url" not in kept
    if public_url is None:
        assert "release_url" not in data
    else:
        assert data["release_url"] == "https://metering.example.com" + data["release_path"]


def test_delivery_settings_refuse_a_public_url_that_is_not_one() -> None:
    with pytest.raises(
        ConfigurationError, match=re.escape("public_url='https://x.example/?a=1' must")
    ):
        DeliverySettings(public_url="https://x.example/?a=1")
    assert DeliverySettings(public_url="http://x.example/").public_url == "http://x.example"


def test_looks_that_find_nothing_due_load_no_http_client(sqlite_url: str) -> None:
    """A worker's delivery thread and the task make their httpx client for
    the first due delivery only (a fresh interpreter: this one has httpx)."""
    code = (
        "import threading\n"
        "from metering import Meter\n"
        "from metering.webhooks.delivery import deliver_due, serve\n"
        f"meter = Meter({sqlite_url!r})\n"
        "print(deliver_due(meter))\n"
        "stop = threading.Event()\n"
        "threading.Timer(0.2, stop.set).start()\n"
        "serve(meter, stop, poll_seconds=0.01)\n"
    )
    assert run_fresh(code, {"httpx", "httpcore"}) == (
        ["DeliveryReport(delivered=0, retrying=0, failed=0)"],
        [],
    )
