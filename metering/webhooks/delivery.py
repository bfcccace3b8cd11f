"""Delivering the outbox: claim a due delivery, POST it signed, record the attempt.

One attempt is three steps, none holding a transaction open over HTTP:

1. claim (a short transaction): the most overdue pending delivery of an
   enabled endpoint gets a claim token and a lease (timeout + 30 s); a worker
   that dies mid-attempt lets the lease expire and another worker retries;
2. the HTTP POST with the Standard Webhooks headers, over a connection
   opened to an address that was checked not to be loopback, private or
   link-local, from a single lookup (`metering.webhooks.destinations`);
3. record (a short transaction): the attempt, and the delivery's new state:
   delivered on 2xx; on 410, or a URL the client cannot send to (stored
   before `validate_url` refused such URLs), failed and the endpoint
   disabled; otherwise due
   again after the schedule's next delay (with jitter, and never before the
   receiver's ``Retry-After``), or failed after the last attempt.

Attempts run side by side on a `Dispatcher` (at most ``max_in_flight``, and
``max_in_flight_per_endpoint`` to one endpoint): `deliver_due` for what is
due now, `serve` for a worker's delivery thread. A worker starting calls
`retry_unanswered` first: a retry whose last attempt got no answer (what a
restart with other settings may fix) is due at once, not after its backoff.

Delivery is at least once: a worker that dies after the POST and before the
record sends the message again. Receivers deduplicate on ``webhook-id``.
With a public URL (``METERING_PUBLIC_URL``, `DeliverySettings.public_url`)
a payload's signed path is also sent as an absolute URL (`with_public_links`).
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from sqlalchemy import Connection

from metering.domain.instants import from_us, to_us
from metering.domain.notifications import DeliveryStatus, Mark, payload_of, reset_due
from metering.errors import SecretKeyError
from metering.settings import DeliverySettings
from metering.storage.database import Database, DatabaseSource, database_of
from metering.storage.webhooks import (
    AttemptRecord,
    DeliveryJob,
    WebhookStore,
    encode_payload,
)
from metering.telemetry.logs import redact
from metering.telemetry.metrics import count_delivery
from metering.webhooks.destinations import DestinationRefused, delivery_client, url_error
from metering.webhooks.dispatch import Claim, Dispatcher
from metering.webhooks.encryption import SecretBox
from metering.webhooks.signing import sign

if TYPE_CHECKING:
    import httpx  # imported when delivering: `import metering` stays light

log = logging.getLogger(__name__)
USER_AGENT = "metering-webhooks/1"
MAX_ERROR_CHARS = 500
MAX_RETRY_AFTER_SECONDS = 86_400.0


def parse_retry_after(value: str | None, now_us: int) -> float | None:
    """A ``Retry-After`` header in seconds (delta-seconds or an HTTP date), if usable."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return min(float(text), MAX_RETRY_AFTER_SECONDS)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return min(max((to_us(when) - now_us) / 1e6, 0.0), MAX_RETRY_AFTER_SECONDS)


def next_delay_seconds(
    settings: DeliverySettings, attempt: int, retry_after: float | None, rng: random.Random
) -> float | None:
    """Seconds until the attempt after ``attempt`` (1-based), or None when none is left.

    Jitter of ±10% spreads receivers' recoveries; ``Retry-After`` is a floor.
    """
    if attempt > len(settings.schedule_seconds):
        return None
    delay = settings.schedule_seconds[attempt - 1] * rng.uniform(0.9, 1.1)
    return max(delay, retry_after or 0.0)


@dataclass(frozen=True, slots=True)
class Response:
    status_code: int | None
    retry_after: str | None
    error: str | None
    duration_ms: int
    # The endpoint's URL cannot be sent to at all: no retry helps.
    unsendable: bool = False


def signing_secrets(job: DeliveryJob, now_us: int, box: SecretBox) -> list[str]:
    """The endpoint's secret, and during a rotation's grace the previous one,
    decrypted; `SecretKeyError` when the key to decrypt them is missing."""
    endpoint = job.endpoint
    keys = [box.open(endpoint.secret, endpoint.id)]
    if endpoint.previous_secret and (endpoint.previous_expires_at_us or 0) > now_us:
        keys.append(box.open(endpoint.previous_secret, endpoint.id))
    return keys


def with_public_links(payload: str, public_url: str | None) -> str:
    """``payload`` as sent: under a public URL (``METERING_PUBLIC_URL``), a
    ``release_path`` (``limit.quarantined``) gets its absolute ``release_url``
    beside it. The stored message keeps the path; the signature covers what is sent."""
    if public_url is None or '"release_path"' not in payload:
        return payload
    document = json.loads(payload)
    data = document.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("release_path"), str):
        return payload
    data["release_url"] = public_url + data["release_path"]
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def post(
    job: DeliveryJob,
    client: httpx.Client,
    now_us: int,
    settings: DeliverySettings,
    box: SecretBox,
) -> Response:
    """One signed POST; network errors, refusals and key problems become ``error``."""
    import httpx

    endpoint = job.endpoint
    problem = url_error(endpoint.url)
    if problem is not None:
        error = f"not sent: the URL cannot be sent to: {problem}"[:MAX_ERROR_CHARS]
        return Response(None, None, error, 0, unsendable=True)
    try:
        keys = signing_secrets(job, now_us, box)
    except SecretKeyError as exc:
        log.error("webhook delivery %s not sent: %s", job.delivery_id, exc)
        return Response(None, None, f"not sent: {exc}"[:MAX_ERROR_CHARS], 0)
    timestamp = now_us // 1_000_000
    body = with_public_links(job.payload, settings.public_url).encode()
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": job.message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(body, job.message_id, timestamp, keys),
    }
    began = time.monotonic()
    try:
        # The address check runs as the client connects (`delivery_client`).
        answer = client.post(endpoint.url, content=body, headers=headers)
    except DestinationRefused as exc:
        return Response(None, None, f"refused: {exc}"[:MAX_ERROR_CHARS], 0)
    except httpx.TimeoutException:
        elapsed = int((time.monotonic() - began) * 1000)
        error = f"timeout after {settings.timeout_seconds:g} s"
        return Response(None, None, error, elapsed)
    except httpx.HTTPError as exc:
        elapsed = int((time.monotonic() - began) * 1000)
        # Kept and shown: without the URL's password, should the error name it.
        error = redact(f"{type(exc).__name__}: {exc}")
        return Response(None, None, error[:MAX_ERROR_CHARS], elapsed)
    elapsed = int((time.monotonic() - began) * 1000)
    failure = None if answer.is_success else f"HTTP {answer.status_code}"
    return Response(answer.status_code, answer.headers.get("retry-after"), failure, elapsed)


def _outcome(
    job: DeliveryJob,
    response: Response,
    now_us: int,
    settings: DeliverySettings,
    rng: random.Random,
) -> tuple[DeliveryStatus, AttemptRecord]:
    attempt = job.attempts + 1
    status, next_us = DeliveryStatus.FAILED, None
    if response.status_code is not None and 200 <= response.status_code < 300:
        status = DeliveryStatus.DELIVERED
    elif response.status_code != 410 and not response.unsendable:
        wait = parse_retry_after(response.retry_after, now_us)
        delay = next_delay_seconds(settings, attempt, wait, rng)
        if delay is not None:
            status, next_us = DeliveryStatus.PENDING, now_us + int(delay * 1_000_000)
    record = AttemptRecord(
        job.delivery_id,
        attempt,
        now_us,
        response.status_code,
        response.duration_ms,
        response.error,
        next_us,
    )
    return status, record


# `metering_webhook_deliveries_total{outcome}`: the delivery's state after an attempt.
_OUTCOME_LABELS: Final = {
    DeliveryStatus.DELIVERED: "delivered",
    DeliveryStatus.PENDING: "retrying",
    DeliveryStatus.FAILED: "failed",
}


def _client(settings: DeliverySettings) -> httpx.Client:
    return delivery_client(settings)


class _ClientOnFirstUse:
    """The delivery client, made when the first attempt asks for it and
    closed by `close` if it was: a look that finds nothing due imports no
    httpx and loads no CA bundle (about a third of a second of CPU, a
    worker's start)."""

    def __init__(self, settings: DeliverySettings) -> None:
        self._settings = settings
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def __call__(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = _client(self._settings)
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """What one `deliver_due` run did."""

    delivered: int = 0
    retrying: int = 0
    failed: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"delivered": self.delivered, "retrying": self.retrying, "failed": self.failed}


def deliver_one(
    source: DatabaseSource,
    job: DeliveryJob,
    settings: DeliverySettings,
    client: httpx.Client | None = None,
    rng: random.Random | None = None,
    *,
    box: SecretBox | None = None,
) -> DeliveryStatus:
    """Attempt a claimed delivery and record it; returns its new status."""
    database = database_of(source)
    rng = rng or random.Random()
    box = box or SecretBox.from_env(database.clock)
    if client is None:
        with _client(settings) as own:
            return deliver_one(database, job, settings, own, rng, box=box)
    response = post(job, client, to_us(database.now()), settings, box)
    now_us = to_us(database.now())
    status, attempt = _outcome(job, response, now_us, settings, rng)

    def record(connection: Connection) -> None:
        store = WebhookStore(connection)
        store.finish_attempt(job, attempt, status, now_us)
        at = f"at {from_us(now_us).isoformat()} (delivery {job.delivery_id})"
        if response.status_code == 410:
            reason = f"410 Gone {at}"
            store.update_endpoint(job.endpoint.id, enabled=False, disabled_reason=reason)
        elif response.unsendable:
            reason = f"{response.error} {at}"
            store.update_endpoint(job.endpoint.id, enabled=False, disabled_reason=reason)

    database.run(record)
    count_delivery(_OUTCOME_LABELS[status])
    log.info(
        "webhook delivery %s to endpoint %s: attempt %s, %s, %s",
        job.delivery_id,
        job.endpoint.id,
        attempt.attempt,
        response.error or f"HTTP {response.status_code}",
        status,
    )
    return status


def deliver_due(
    source: DatabaseSource,
    settings: DeliverySettings | None = None,
    *,
    client: httpx.Client | None = None,
    box: SecretBox | None = None,
) -> DeliveryReport:
    """Deliver every delivery due now (at most ``max_per_run``), and return
    once each has been attempted.

    Attempts run side by side (``max_in_flight``, at most
    ``max_in_flight_per_endpoint`` per endpoint: `Dispatcher`), so a hanging
    receiver delays only its own deliveries. A delivery retried during the
    run waits for the next one. Safe to run in any number of workers at once:
    deliveries are claimed. This is what the ``metering.deliver_webhooks``
    task calls. A ``client`` given must come from `delivery_client`: the
    address check is in its connections. Secrets are decrypted with ``box``
    (default: the keys of ``METERING_SECRET_KEY``); one that cannot be is a
    failed attempt, retried like any other.
    """
    database = database_of(source)
    settings = settings or DeliverySettings.from_env()
    box = box or SecretBox.from_env(database.clock)
    own = _ClientOnFirstUse(settings)
    due_by_us = to_us(database.now())
    dispatcher = _dispatcher(database, settings, own if client is None else lambda: client, box)
    try:
        tally = dispatcher.drain(_claimer(database, settings, due_by_us), settings.max_per_run)
    finally:
        dispatcher.close()
        own.close()
    return DeliveryReport(
        tally[DeliveryStatus.DELIVERED], tally[DeliveryStatus.PENDING], tally[DeliveryStatus.FAILED]
    )


def retry_unanswered(source: DatabaseSource) -> int:
    """Make every pending delivery whose last attempt got no HTTP answer
    (its destination refused, no connection, a timeout) due now; deliveries
    a receiver answered keep their schedule and its ``Retry-After``. Returns
    how many were brought forward."""
    database = database_of(source)
    now_us = database.now_us()
    return database.run(lambda c: WebhookStore(c).retry_unanswered(now_us))


def serve(
    source: DatabaseSource,
    stop: threading.Event,
    *,
    poll_seconds: float,
    settings: DeliverySettings | None = None,
    box: SecretBox | None = None,
) -> None:
    """Deliver webhooks as they fall due, until ``stop`` is set: what a
    worker's delivery thread runs (`workers.webhooks`).

    Looks for due deliveries every ``poll_seconds`` and at once when an
    attempt ends; one idle look is one claim that finds nothing (an indexed
    statement). Bounds and claims as in `deliver_due`. Running attempts are
    finished and recorded before it returns.
    """
    database = database_of(source)
    settings = settings or DeliverySettings.from_env()
    box = box or SecretBox.from_env(database.clock)
    http = _ClientOnFirstUse(settings)
    dispatcher = _dispatcher(database, settings, http, box)
    try:
        dispatcher.serve(_claimer(database, settings), stop, poll_seconds)
    finally:
        dispatcher.close()
        http.close()


def _dispatcher(
    database: Database,
    settings: DeliverySettings,
    client: Callable[[], httpx.Client],
    box: SecretBox,
) -> Dispatcher:
    rng = random.Random()
    return Dispatcher(
        lambda job: deliver_one(database, job, settings, client(), rng, box=box),
        max_in_flight=settings.max_in_flight,
        max_in_flight_per_endpoint=settings.max_in_flight_per_endpoint,
    )


def _claimer(database: Database, settings: DeliverySettings, due_by_us: int | None = None) -> Claim:
    """Claims one delivery due by ``due_by_us`` (default: the clock's now at
    each claim), leaving the dispatcher's busy endpoints."""

    def claim(busy: Collection[str]) -> DeliveryJob | None:
        now = database.now()
        lease_us = to_us(now + timedelta(seconds=settings.lease_seconds))
        now_us = to_us(now) if due_by_us is None else due_by_us
        return database.run(
            lambda c: WebhookStore(c).claim_due(now_us, lease_us, skip_endpoints=busy)
        )

    return claim


def sweep_resets(source: DatabaseSource, batch: int = 500) -> int:
    """Announce ``limit.reset`` for denied windows (and buckets) that are over.

    Runs from beat (``metering.sweep_webhook_resets``); marks are locked
    (``SKIP LOCKED``) so concurrent sweeps do not announce twice. Returns how
    many resets were written.
    """
    database = database_of(source)
    now_us = to_us(database.now())

    def work(connection: Connection) -> int:
        store = WebhookStore(connection)
        written = 0
        endpoints = None
        for mark in store.lock_due_marks(now_us, batch):
            state = store.bucket_state(mark.limit, mark.subject) if _is_bucket(mark) else None
            step = reset_due(mark, state, now_us)
            if step.reschedule_us is not None:
                store.settle_mark(mark, delete_it=False, due_at_us=step.reschedule_us)
                continue
            if step.notice is not None:
                if endpoints is None:
                    endpoints = store.list_endpoints(enabled_only=True)
                payload = encode_payload(payload_of(step.notice, now_us))
                store.add_message(step.notice.type, payload, endpoints, now_us)
                written += 1
            store.settle_mark(mark, delete_it=step.delete, due_at_us=None)
        return written

    return database.run(work)


def _is_bucket(mark: Mark) -> bool:
    return mark.window_end_us == 0
