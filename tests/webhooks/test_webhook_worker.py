"""The outbox survives a worker killed between the counter change and delivery.

Real Celery workers (with beat) on Redis and PostgreSQL, a loopback receiver.
(Prompt delivery and a hanging receiver: ``test_webhook_prompt.py``.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery_worker import WORKER
from pytest_httpserver import HTTPServer
from waiting import wait_for

from metering import Limit, Meter, UsageProducer
from metering.webhooks import Webhooks, verify

pytestmark = pytest.mark.slow

StartWorker = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def start_worker(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[StartWorker]:
    """``celery -A workers worker --beat`` in its own process group; all killed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, **overrides: str) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
        env.update(
            METERING_DATABASE_URL=pg_url,
            METERING_BROKER_URL=redis_url,
            METERING_WEBHOOKS_ALLOW_PRIVATE="1",
            METERING_WEBHOOKS_SCHEDULE="1,1,1",
            PYTHONUNBUFFERED="1",
        )
        env.update(overrides)
        log = tmp_path / f"{name}.log"
        command = [*WORKER, "--beat"]
        command += ["--schedule", str(tmp_path / f"{name}-beat"), "--concurrency", "1"]
        command += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
        command += ["-Q", "metering", "-n", f"{name}@%h", "--loglevel", "INFO"]
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        started.append(process)
        wait_for(lambda: "ready." in log.read_text(errors="replace"), lambda: log.read_text(), 60)
        return process

    try:
        yield start
    finally:
        for process in started:
            kill(process)


def kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)
    time.sleep(0.2)  # let pool children of the group go too
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def test_a_notification_written_before_a_sigkill_is_delivered_by_the_next_worker(
    pg_url: str, redis_url: str, receiver: HTTPServer, start_worker: StartWorker
) -> None:
    receiver.expect_request("/hook").respond_with_data("ok")
    with Meter(pg_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter)
        _, secret = hooks.add(receiver.url_for("/hook"), types=["limit.denied"])
        # The first worker applies events, but delivers nothing: no delivery
        # thread, and its beat would deliver only in an hour.
        first = start_worker(
            "first", METERING_WEBHOOKS_INTERVAL="3600", METERING_WEBHOOKS_DISPATCH="0"
        )
        with UsageProducer(redis_url) as producer:
            producer.emit("visitor-1", "send", event_id="e-1")
            producer.emit("visitor-1", "send", event_id="e-2")
        wait_for(lambda: meter.count_results() == 2, lambda: f"{meter.count_results()} results")
        [pending] = hooks.deliveries()
        assert pending.status == "pending" and receiver.log == []
        kill(first)

        # The second one's delivery thread finds it (beat's tick is an hour away).
        start_worker("second", METERING_WEBHOOKS_INTERVAL="3600")
        wait_for(lambda: len(receiver.log) >= 1, lambda: str(hooks.deliveries()), 60)
        wait_for(
            lambda: hooks.deliveries()[0].status == "delivered", lambda: str(hooks.deliveries())
        )
    request, _ = receiver.log[0]
    verify(request.get_data(), dict(request.headers), secret)
    assert request.json["type"] == "limit.denied"
    assert request.json["data"]["event_id"] == "e-2"
    assert len({r.headers["webhook-id"] for r, _ in receiver.log}) == 1


def test_the_worker_logs_no_password_or_query_secret_of_a_webhook_url(
    pg_url: str, redis_url: str, receiver: HTTPServer, start_worker: StartWorker, tmp_path: Path
) -> None:
    receiver.expect_request("/hook").respond_with_data("ok")
    port = receiver.port
    url = f"http://hook-user:hook-pass-s3cret@127.0.0.1:{port}/hook?token=query-s3cret"
    with Meter(pg_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter)
        hooks.add(url, types=["limit.denied"])
        start_worker("logs", METERING_WEBHOOKS_INTERVAL="3600")
        with UsageProducer(redis_url) as producer:
            producer.emit("visitor-1", "send", event_id="e-1")
            producer.emit("visitor-1", "send", event_id="e-2")
        wait_for(
            lambda: [d.status for d in hooks.deliveries()] == ["delivered"],
            lambda: str(hooks.deliveries()),
            60,
        )
    request, _ = receiver.log[0]
    # The receiver got the URL's credentials and query: only the log must not.
    assert request.authorization is not None
    assert request.authorization.password == "hook-pass-s3cret"
    assert request.args["token"] == "query-s3cret"
    log = (tmp_path / "logs.log").read_text(errors="replace")
    assert "HTTP Request: POST" in log  # httpx's line is there, without the secrets
    assert "hook-pass-s3cret" not in log
    assert "query-s3cret" not in log


def test_a_retry_that_got_no_answer_is_delivered_when_a_worker_starts(
    pg_url: str, receiver: HTTPServer, start_worker: StartWorker
) -> None:
    receiver.expect_request("/hook").respond_with_data("ok")
    with Meter(pg_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter)
        hooks.add(receiver.url_for("/hook"), types=["limit.denied"])
        # A worker that refuses loopback destinations: two refused attempts,
        # the next an hour away.
        first = start_worker(
            "first", METERING_WEBHOOKS_ALLOW_PRIVATE="0", METERING_WEBHOOKS_SCHEDULE="0.5,3600"
        )
        meter.consume("visitor-1", "send", event_id="e-1")
        meter.consume("visitor-1", "send", event_id="e-2")  # denied: a notification
        wait_for(lambda: hooks.deliveries()[0].attempts == 2, lambda: str(hooks.deliveries()), 60)
        [waiting] = hooks.deliveries()
        assert waiting.status == "pending" and receiver.log == []
        kill(first)

        # Restarted allowing them: delivered at once, not in an hour.
        start_worker("second", METERING_WEBHOOKS_SCHEDULE="0.5,3600")
        wait_for(
            lambda: hooks.deliveries()[0].status == "delivered", lambda: str(hooks.deliveries()), 60
        )
    assert len(receiver.log) == 1
