"""The exceptions `metering` raises.

Every error a caller can provoke is a `MeteringError`. Subclasses carry the
data a caller needs to react (the limit, the subject, the event id) rather
than only a message. Driver errors are translated at the storage edge and
chained with ``raise ... from exc``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime


class MeteringError(Exception):
    """Base class of every error `metering` raises on purpose."""


class InvalidInput(MeteringError, ValueError):
    """A value given to a public entry point is malformed.

    ``field`` names the argument (``subject``, ``cost``, ``event_id`` ...).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InvalidLimit(InvalidInput):
    """A limit definition is broken (bad period, maximum, algorithm ...)."""


class PeriodPruned(InvalidInput):
    """A backtest asked for a period the results ledger no longer holds:
    results older than ``kept_from`` may have been pruned (retention)."""

    def __init__(self, since: datetime, kept_from: datetime) -> None:
        super().__init__(
            "since",
            f"the ledger no longer holds {since.isoformat()}: results are kept from "
            f"{kept_from.isoformat()} on (METERING_RETAIN_RESULTS_DAYS); choose a later --since",
        )
        self.since = since
        self.kept_from = kept_from


class UnknownLimit(MeteringError, LookupError):
    """A charge names a limit that is not defined."""

    def __init__(self, limit: str) -> None:
        super().__init__(f"unknown limit {limit!r}: define it with `metering limits set`")
        self.limit = limit


class NotQuarantined(MeteringError, LookupError):
    """A release of a subject that its limit's breaker does not hold."""

    def __init__(self, subject: str, limit: str) -> None:
        super().__init__(
            f"{subject!r} is not quarantined on {limit!r} (`metering quarantine list`)"
        )
        self.subject = subject
        self.limit = limit


class ReservedLimit(MeteringError):
    """A limit named ``metering.*`` belongs to the product (the API's own rate
    limit): users cannot create, change or delete it."""

    def __init__(self, limit: str, action: str = "change") -> None:
        super().__init__(
            f"limit {limit!r} is reserved: names starting with 'metering.' belong to "
            f"the product; you cannot {action} it"
        )
        self.limit = limit


class OccurredAtOutOfRange(InvalidInput):
    """An event's time is older than its limit's allowed lateness, or in the future."""

    def __init__(self, occurred_at: datetime, message: str) -> None:
        super().__init__("occurred_at", message)
        self.occurred_at = occurred_at


class EventConflict(MeteringError):
    """An event id was used again with different charges; nothing was applied."""

    def __init__(self, event_id: str) -> None:
        super().__init__(
            f"event {event_id!r} was already recorded with different charges; "
            "the new charges were not applied"
        )
        self.event_id = event_id


class UnknownReservation(MeteringError, LookupError):
    """No reservation has this id."""

    def __init__(self, reservation_id: str) -> None:
        super().__init__(f"no reservation {reservation_id!r}")
        self.reservation_id = reservation_id


class ReservationSettled(MeteringError):
    """A reservation was already committed (or cancelled) and cannot change any more."""

    def __init__(self, reservation_id: str, state: str, action: str) -> None:
        super().__init__(f"cannot {action} reservation {reservation_id!r}: it is {state}")
        self.reservation_id = reservation_id
        self.state: str = state


class ReservationExpired(ReservationSettled):
    """A cancel came after the reservation's time to live: it was committed instead."""

    def __init__(
        self, reservation_id: str, state: str = "committed", action: str = "cancel"
    ) -> None:
        MeteringError.__init__(
            self,
            f"cannot {action} reservation {reservation_id!r}: its time to live had passed, "
            "so it is committed in full",
        )
        self.reservation_id = reservation_id
        # A `ReservationState` (a str) when raised by the library; errors sit
        # below the domain, so the type is not imported here.
        self.state: str = state


class StorageError(MeteringError):
    """The database failed or could not be reached."""


class InputRefused(StorageError):
    """The database refused the data itself (a constraint, a value it cannot
    store): the same statement would fail again, so it is never retried."""


class DatabaseUnavailable(StorageError):
    """The database cannot be reached (refused, timed out, wrong URL)."""


class SchemaOutdated(StorageError):
    """The database schema is missing or older than this version of `metering`."""


class ConfigurationError(MeteringError):
    """A configuration value (environment variable, file) is invalid."""


class BrokerUnavailable(MeteringError):
    """The broker could not be reached, or the producer's buffer is full.

    ``kept`` names every event the producer holds and will still send (its
    background thread retries, and `UsageProducer.flush` or ``close`` try
    again): never emit those again under new ids. ``event_id`` is the event
    of the failed `UsageProducer.emit` call, if any; ``accepted`` says
    whether it is among the kept ones (False when the buffer was full or the
    producer closed: that event is not held and will not be sent).
    """

    def __init__(
        self,
        reason: str,
        kept: Sequence[str] = (),
        *,
        event_id: str | None = None,
        accepted: bool = True,
    ) -> None:
        self.reason = reason
        self.kept = tuple(kept)
        self.pending = len(self.kept)
        self.event_id = event_id
        self.accepted = accepted
        parts = [reason]
        if event_id is not None and not accepted:
            parts.append(f"event {event_id!r} was not accepted")
        if self.kept:
            shown = ", ".join(repr(i) for i in self.kept[:3])
            more = f" and {len(self.kept) - 3} more" if len(self.kept) > 3 else ""
            parts.append(f"{len(self.kept)} kept, sent once the broker is back: {shown}{more}")
        super().__init__("; ".join(parts))


class WebhookVerificationError(MeteringError):
    """A webhook's signature does not match, or its timestamp is too old or in the future."""


class UnknownWebhookEndpoint(MeteringError, LookupError):
    """No webhook endpoint has this id."""

    def __init__(self, endpoint_id: str) -> None:
        super().__init__(f"unknown webhook endpoint {endpoint_id!r}: see `metering webhooks list`")
        self.endpoint_id = endpoint_id


class UnknownApiKey(MeteringError, LookupError):
    """No API key has this id."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"unknown API key {key_id!r}: see `metering apikeys list`")
        self.key_id = key_id


class SecretKeyError(ConfigurationError):
    """A stored webhook secret is encrypted and ``METERING_SECRET_KEY`` holds no key
    that decrypts it (unset, or the key it was encrypted with was removed)."""

    def __init__(self, message: str, endpoint_id: str | None = None) -> None:
        super().__init__(message)
        self.endpoint_id = endpoint_id


class GrantConflict(MeteringError):
    """A grant id was used again with a different grant; nothing was changed."""

    def __init__(self, grant_id: str) -> None:
        super().__init__(f"grant {grant_id!r} already exists with other values; use a new grant id")
        self.grant_id = grant_id


class UnknownEvent(MeteringError, LookupError):
    """No result is stored for this event id."""

    def __init__(self, event_id: str) -> None:
        super().__init__(f"no result for event {event_id!r}")
        self.event_id = event_id


class CorrectionRefused(MeteringError):
    """An event cannot be voided (denied, rejected, or older than the horizon)."""

    def __init__(self, event_id: str, reason: str) -> None:
        super().__init__(f"event {event_id!r} cannot be voided: {reason}")
        self.event_id = event_id
        self.reason = reason


class CorrectionConflict(MeteringError):
    """A correction id was used again for another event; nothing was changed."""

    def __init__(self, correction_id: str, event_id: str) -> None:
        super().__init__(
            f"correction {correction_id!r} already voids event {event_id!r}; "
            "use a new correction id"
        )
        self.correction_id = correction_id
        self.event_id = event_id


class WrongAlgorithm(InvalidInput):
    """A limit was used in a way its algorithm does not have: a concurrent
    limit consumed (check it out instead), a windowed one checked out."""

    def __init__(self, limit: str, algorithm: str, message: str) -> None:
        super().__init__("limit", f"{limit!r} is {algorithm}: {message}")
        self.limit = limit
        self.algorithm = algorithm


class UnknownCheckout(MeteringError, LookupError):
    """No checkout has this id."""

    def __init__(self, checkout_id: str) -> None:
        super().__init__(f"no checkout {checkout_id!r}")
        self.checkout_id = checkout_id


class CheckoutReleased(MeteringError):
    """A checkout has ended (checked in, or expired: its license came back), so
    it cannot be renewed, and checking out again under its id holds nothing:
    the holder lost its license and checks out under a new id.

    ``released_by`` is ``checkin`` or ``expiry``; ``released_at`` when it ended.
    """

    def __init__(self, checkout_id: str, released_by: str, released_at: datetime) -> None:
        at = released_at.isoformat().replace("+00:00", "Z")
        how = f"was checked in at {at}" if released_by == "checkin" else f"expired at {at}"
        super().__init__(
            f"checkout {checkout_id!r} has ended: it {how}; check out again under a new checkout id"
        )
        self.checkout_id = checkout_id
        self.released_by = released_by
        self.released_at = released_at


class CheckoutConflict(MeteringError):
    """A checkout id was used again for another subject, limit or cost; nothing changed."""

    def __init__(self, checkout_id: str) -> None:
        super().__init__(
            f"checkout {checkout_id!r} already exists with another subject, limit or cost"
        )
        self.checkout_id = checkout_id
