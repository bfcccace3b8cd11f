"""Managing webhooks: endpoints, deliveries, replays, test pings.

`Webhooks(meter)` works on the meter's database and clock (a `Database` will do too)::

    hooks = Webhooks(meter)
    endpoint, secret = hooks.add("https://example.com/hooks", types=["limit.denied"])
    hooks.update(endpoint.id, types=[])  # every message type from now on
    hooks.rotate(endpoint.id)            # old secret still signs for the grace
    hooks.reencrypt()                    # secrets under METERING_SECRET_KEY's newest key
    hooks.deliveries(status="failed")
    hooks.replay([42])
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

from metering.domain.bounds import shown, validate_count, validate_row_id, validate_seconds
from metering.domain.instants import from_us, to_us
from metering.domain.notifications import MESSAGE_TYPES, TEST_TYPE, DeliveryStatus
from metering.errors import ConfigurationError, InvalidInput, SecretKeyError, UnknownWebhookEndpoint
from metering.settings import DeliverySettings, rotation_grace_seconds
from metering.storage.database import DatabaseSource, database_of
from metering.storage.webhooks import (
    AttemptRecord,
    DeliveryJob,
    DeliveryRecord,
    EndpointRecord,
    WebhookStore,
    encode_payload,
)
from metering.webhooks import delivery
from metering.webhooks.destinations import refused_destination, url_error
from metering.webhooks.encryption import SecretBox, is_encrypted
from metering.webhooks.signing import generate_secret, mask_secret, validate_secret

T = TypeVar("T")
MAX_URL_CHARS: Final = 2000
MAX_ENDPOINT_ID_CHARS: Final = 64
# A year: an old secret that signs for longer was never really rotated.
MAX_GRACE_SECONDS: Final = 365 * 86_400
# The statuses a listing filters by, as plain strings (for click choices).
STATUSES: Final = tuple(status.value for status in DeliveryStatus)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An endpoint as shown to operators: the secret and the URL's password masked."""

    id: str
    url: str
    types: tuple[str, ...]
    enabled: bool
    disabled_reason: str | None
    secret_masked: str
    secret_encrypted: bool
    rotating_until: datetime | None
    created_at: datetime

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "url": self.url,
            "types": list(self.types),
            "enabled": self.enabled,
            "disabled_reason": self.disabled_reason,
            "secret": self.secret_masked,
            "secret_encrypted": self.secret_encrypted,
            "rotating_until": self.rotating_until.isoformat() if self.rotating_until else None,
            "created_at": self.created_at.isoformat(),
        }


def validate_url(url: str) -> str:
    """An ``http`` or ``https`` URL with a host that the delivery's HTTP client
    can send to (`url_error`); `InvalidInput` otherwise."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise InvalidInput("url", f"must be an http(s) URL of at most {MAX_URL_CHARS} characters")
    if not url.isprintable() or any(ch.isspace() for ch in url):
        # NUL, escapes, DEL, line breaks: never part of a URL worth sending to.
        raise InvalidInput("url", f"{shown(url)} contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        raise InvalidInput("url", f"{url!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidInput("url", f"{url!r} must start with http:// or https://")
    if not parts.hostname:
        raise InvalidInput("url", f"{url!r} has no host")
    problem = url_error(url)
    if problem is not None:
        raise InvalidInput("url", f"{url!r} cannot be sent to: {problem}")
    return url


def validate_endpoint_id(endpoint_id: object) -> str:
    """An endpoint id as `add` makes them (``ep_`` + hex): printable, no spaces."""
    if (
        not isinstance(endpoint_id, str)
        or not 1 <= len(endpoint_id) <= MAX_ENDPOINT_ID_CHARS
        or not endpoint_id.isprintable()
        or any(ch.isspace() for ch in endpoint_id)
    ):
        raise InvalidInput("endpoint_id", f"{shown(endpoint_id)} is not an endpoint id")
    return endpoint_id


def mask_url(url: str) -> str:
    """``url`` with the password of its userinfo shown as ``***`` (a user name
    alone, often a token, too): ``https://user:***@host/path``."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    user, colon, _password = userinfo.partition(":")
    shown = f"{user}:***" if colon else "***"
    return urlunsplit(parts._replace(netloc=f"{shown}@{host}"))


def validate_types(types: Iterable[str] | None) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(types or ()))
    for message_type in chosen:
        if message_type not in MESSAGE_TYPES:
            known = ", ".join(MESSAGE_TYPES)
            raise InvalidInput("types", f"unknown message type {message_type!r}; use {known}")
    return chosen


def _masked(record: EndpointRecord, box: SecretBox) -> str:
    try:
        return mask_secret(box.open(record.secret, record.id))
    except SecretKeyError:
        return "whsec_… (encrypted; cannot decrypt with METERING_SECRET_KEY)"


def _view(record: EndpointRecord, now_us: int, box: SecretBox) -> Endpoint:
    rotating = record.previous_secret is not None and (record.previous_expires_at_us or 0) > now_us
    return Endpoint(
        id=record.id,
        url=mask_url(record.url),
        types=record.types,
        enabled=record.enabled,
        disabled_reason=record.disabled_reason,
        secret_masked=_masked(record, box),
        secret_encrypted=is_encrypted(record.secret),
        rotating_until=from_us(record.previous_expires_at_us)
        if rotating and record.previous_expires_at_us
        else None,
        created_at=from_us(record.created_at_us),
    )


class Webhooks:
    """The webhook management API over a `Meter`'s database and clock."""

    def __init__(
        self,
        meter: DatabaseSource,
        settings: DeliverySettings | None = None,
        box: SecretBox | None = None,
    ) -> None:
        self.database = database_of(meter)
        self.settings = settings
        self._box = box

    @property
    def box(self) -> SecretBox:
        """How secrets are stored: ``METERING_SECRET_KEY`` unless one was given."""
        if self._box is None:
            self._box = SecretBox.from_env(self.database.clock)
        return self._box

    @property
    def encrypts_secrets(self) -> bool:
        """Whether new secrets are stored encrypted (``METERING_SECRET_KEY`` is set)."""
        return self.box.encrypts

    def _run(self, work: Callable[[WebhookStore], T]) -> T:
        return self.database.run(lambda c: work(WebhookStore(c)))

    def _get(self, store: WebhookStore, endpoint_id: str, *, lock: bool = False) -> EndpointRecord:
        record = store.get_endpoint(endpoint_id, lock=lock)
        if record is None:
            raise UnknownWebhookEndpoint(endpoint_id)
        return record

    def add(
        self, url: str, *, secret: str | None = None, types: Iterable[str] | None = None
    ) -> tuple[Endpoint, str]:
        """Create an enabled endpoint. Returns it and its secret (shown only now).

        The secret is stored encrypted when ``METERING_SECRET_KEY`` is set,
        in plaintext otherwise."""
        plain = validate_secret(secret) if secret else generate_secret()
        record = EndpointRecord(
            id="ep_" + secrets.token_hex(8),
            url=validate_url(url),
            secret=self.box.seal(plain),
            previous_secret=None,
            previous_expires_at_us=None,
            types=validate_types(types),
            enabled=True,
            disabled_reason=None,
            created_at_us=self.database.now_us(),
        )
        self._run(lambda store: store.insert_endpoint(record))
        return _view(record, record.created_at_us, self.box), plain

    def destination_warning(self, url: str) -> str | None:
        """Why deliveries to ``url`` will be refused under these settings
        (default: ``METERING_WEBHOOKS_*`` here), naming the setting that
        allows them; None when its host is public or does not resolve now."""
        settings = self.settings or DeliverySettings.from_env()
        return refused_destination(
            url,
            allow_private=settings.allow_private,
            allowed_networks=settings.allowed_networks,
        )

    def endpoints(self) -> list[Endpoint]:
        """Every endpoint, oldest first, secrets masked."""
        now_us = self.database.now_us()
        records = self._run(lambda store: store.list_endpoints())
        return [_view(r, now_us, self.box) for r in records]

    def get(self, endpoint_id: str) -> Endpoint:
        validate_endpoint_id(endpoint_id)
        now_us = self.database.now_us()
        record = self._run(lambda store: self._get(store, endpoint_id))
        return _view(record, now_us, self.box)

    def remove(self, endpoint_id: str) -> None:
        """Delete an endpoint, its deliveries and their attempts."""
        validate_endpoint_id(endpoint_id)
        if not self._run(lambda store: store.delete_endpoint(endpoint_id)):
            raise UnknownWebhookEndpoint(endpoint_id)

    def set_enabled(self, endpoint_id: str, enabled: bool) -> None:
        """Disable (nothing is sent; deliveries wait) or enable an endpoint."""
        validate_endpoint_id(endpoint_id)
        reason = None if enabled else "disabled by an operator"
        if not self._run(
            lambda store: store.update_endpoint(
                endpoint_id, enabled=enabled, disabled_reason=reason
            )
        ):
            raise UnknownWebhookEndpoint(endpoint_id)

    def update(
        self, endpoint_id: str, *, url: str | None = None, types: Iterable[str] | None = None
    ) -> Endpoint:
        """Send to another URL and/or other message types (``types=()``: every
        type); what is not given stays. Deliveries already queued keep their
        endpoint and go to the new URL. Returns the endpoint as it is now."""
        validate_endpoint_id(endpoint_id)
        values: dict[str, object] = {}
        if url is not None:
            values["url"] = validate_url(url)
        if types is not None:
            values["types"] = validate_types(types)
        now_us = self.database.now_us()

        def work(store: WebhookStore) -> EndpointRecord:
            if values:
                store.update_endpoint(endpoint_id, **values)
            return self._get(store, endpoint_id)

        return _view(self._run(work), now_us, self.box)

    def rotate(
        self, endpoint_id: str, *, secret: str | None = None, grace_seconds: float | None = None
    ) -> str:
        """Give an endpoint a new secret; the old one still signs for ``grace_seconds``
        (default ``METERING_WEBHOOKS_ROTATION_GRACE``, 24 h; at most a year).
        Returns the new secret."""
        validate_endpoint_id(endpoint_id)
        new_secret = validate_secret(secret) if secret else generate_secret()
        grace = rotation_grace_seconds() if grace_seconds is None else grace_seconds
        grace = validate_seconds("grace_seconds", grace, MAX_GRACE_SECONDS)
        expires_us = to_us(self.database.now() + timedelta(seconds=grace))
        box = self.box

        def work(store: WebhookStore) -> None:
            # Locked: a rotation or a re-encryption under way rewrites the
            # secrets it read; this one reads what it wrote.
            old = self._get(store, endpoint_id, lock=True)
            store.update_endpoint(
                endpoint_id,
                secret=box.seal(new_secret),
                previous_secret=box.reseal(old.secret, endpoint_id),
                previous_expires_at_us=expires_us,
            )

        self._run(work)
        return new_secret

    def reencrypt(self) -> int:
        """Store every endpoint's secrets (and a rotation's previous one) encrypted
        under the newest key of ``METERING_SECRET_KEY``: plaintext ones of before
        too. Returns how many endpoints were rewritten; run it after putting a new
        key first, then remove the old key. `SecretKeyError` if a secret is
        encrypted under a key no longer given (nothing is changed then)."""
        box = self.box
        if not box.encrypts:
            raise ConfigurationError("METERING_SECRET_KEY is not set: there is no key to use")

        def work(store: WebhookStore) -> int:
            changed = 0
            for record in store.list_endpoints(lock=True):  # as `rotate` reads its one
                values: dict[str, str] = {}
                secret = box.reseal(record.secret, record.id)
                if secret != record.secret:
                    values["secret"] = secret
                if record.previous_secret is not None:
                    previous = box.reseal(record.previous_secret, record.id)
                    if previous != record.previous_secret:
                        values["previous_secret"] = previous
                if values:
                    store.update_endpoint(record.id, **values)
                    changed += 1
            return changed

        return self._run(work)

    def deliveries(
        self, *, status: str | None = None, endpoint_id: str | None = None, count: int = 50
    ) -> list[DeliveryRecord]:
        """The ``count`` newest deliveries, newest first, optionally of one status
        or endpoint."""
        if status is not None and status not in STATUSES:
            raise InvalidInput("status", f"use one of {', '.join(STATUSES)}")
        if endpoint_id is not None:
            validate_endpoint_id(endpoint_id)
        validate_count("count", count)
        return self._run(
            lambda store: store.list_deliveries(status=status, endpoint_id=endpoint_id, count=count)
        )

    def attempts(self, delivery_id: int) -> list[AttemptRecord]:
        """Every attempt of a delivery, in order."""
        validate_row_id("delivery_id", delivery_id)
        return self._run(lambda store: store.attempts_of(delivery_id))

    def replay(
        self, delivery_ids: Sequence[int] | None = None, *, since: datetime | None = None
    ) -> int:
        """Send deliveries again (by id, or every one created since ``since``), due now
        with a fresh retry schedule. Returns how many were queued."""
        if not delivery_ids and since is None:
            raise InvalidInput("replay", "give delivery ids or a time to replay since")
        for delivery_id in delivery_ids or ():
            validate_row_id("delivery_id", delivery_id)
        since_us = to_us(since, field_name="since") if since is not None else None
        now_us = self.database.now_us()
        ids = list(delivery_ids) if delivery_ids else None
        return self._run(lambda store: store.replay(ids, since_us, now_us))

    def send_test(self, endpoint_id: str) -> tuple[DeliveryRecord, list[AttemptRecord]]:
        """Send a signed ``webhook.test`` ping now (once; it is recorded like any
        delivery). Its endpoint is locked while its delivery is written; one
        removed while the ping is out is `UnknownWebhookEndpoint`."""
        validate_endpoint_id(endpoint_id)
        now_us = self.database.now_us()
        document = {
            "type": TEST_TYPE,
            "timestamp": from_us(now_us).isoformat().replace("+00:00", "Z"),
            "data": {"endpoint_id": endpoint_id},
        }

        box = self.box

        def work(store: WebhookStore) -> DeliveryJob:
            endpoint = self._get(store, endpoint_id, lock=True)
            box.open(endpoint.secret, endpoint.id)  # a key problem is an error, not a ping
            message_id = store.add_message(TEST_TYPE, encode_payload(document), [endpoint], now_us)
            job = store.claim_message(message_id, now_us + 3_600_000_000)
            assert job is not None
            return job

        job = self._run(work)
        # A ping is one attempt: no retries.
        settings = replace(self.settings or DeliverySettings.from_env(), schedule_seconds=())
        delivery.deliver_one(self.database, job, settings, box=box)
        record = self._run(lambda store: store.get_delivery(job.delivery_id))
        if record is None:
            raise UnknownWebhookEndpoint(endpoint_id)
        return record, self.attempts(job.delivery_id)

    def deliver_due(self) -> delivery.DeliveryReport:
        """Deliver what is due now (what the worker's task does)."""
        return delivery.deliver_due(self.database, self.settings, box=self.box)

    def sweep_resets(self) -> int:
        """Write ``limit.reset`` for denied windows that are over (what beat runs)."""
        return delivery.sweep_resets(self.database)

    def messages(self, message_type: str | None = None) -> list[tuple[str, str, str]]:
        """(id, type, JSON payload) of the outbox, oldest first."""
        return self._run(lambda store: store.messages(message_type))
