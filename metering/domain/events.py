"""Usage events and the validation of everything a caller passes in."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, NamedTuple

from metering.domain.bounds import shown, validate_whole
from metering.domain.instants import US_PER_SECOND, to_us
from metering.domain.jsonable import encoder
from metering.domain.limits import Limit, validate_limit_name
from metering.errors import InvalidInput, OccurredAtOutOfRange

MAX_SUBJECT_LENGTH: Final = 200
MAX_COST: Final = 10**12
MAX_CHARGES: Final = 32
MAX_METADATA_BYTES: Final = 8192
FUTURE_TOLERANCE_US: Final = 5 * 60 * US_PER_SECOND
EVENT_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_.:@/+=\-]{1,128}")


class Charge(NamedTuple):
    """(subject, limit, cost): what one event asks of one limit."""

    subject: str
    limit: str
    cost: int = 1


class Rejected(NamedTuple):
    """Input that could not be applied, as the dead-letter record keeps it: its
    event id when it had a usable one, why, and the raw input (JSON text)."""

    event_id: str | None
    reason: str
    raw: str


class EventRecord(NamedTuple):
    """A validated event as the hot path carries it: plain values, no datetime.

    ``fingerprint`` is `UsageEvent.fingerprint`: what makes two deliveries
    of one id the same event.
    """

    event_id: str
    charges: tuple[Charge, ...]
    occurred_at_us: int
    metadata: Mapping[str, Any] | None
    fingerprint: str


# `json.dumps` with these options, without building an encoder per call.
_compact = json.JSONEncoder(separators=(",", ":")).encode
_compact_finite = encoder(",", ":", allow_nan=False)


def fingerprint_of(charges: Iterable[Sequence[object]]) -> str:
    if isinstance(charges, tuple | list):
        if len(charges) == 1 and len(charges[0]) == 3:
            found = _single(*charges[0])
        else:
            found = plain_fingerprint(charges)
        if found is not None:
            return found
    return _compact(sorted([list(c) for c in charges]))


# One charge's fingerprints by (subject, limit, cost), each of its exact type
# (a bool or float cost is never looked up): a batch's events repeat them
# (a subject's calls). Emptied when full.
_SINGLES: Final[dict[tuple[str, str, int], str]] = {}
_SINGLES_KEPT: Final = 4096


def _single(subject: object, limit: object, cost: object) -> str | None:
    """`single_fingerprint`, remembered in `_SINGLES`."""
    if type(subject) is not str or type(limit) is not str or type(cost) is not int:
        return None  # (as `single_fingerprint` finds)
    key = (subject, limit, cost)
    found = _SINGLES.get(key)
    if found is None:
        found = single_fingerprint(subject, limit, cost)
        if found is not None:
            if len(_SINGLES) >= _SINGLES_KEPT:
                _SINGLES.clear()
            _SINGLES[key] = found
    return found


def single_fingerprint(subject: object, limit: object, cost: object) -> str | None:
    """`fingerprint_of` one charge without the JSON encoder, or None when its
    text would need escaping (the encoder then writes it).

    Printable ASCII other than ``"`` and ``\\`` is written as it is by
    ``json.dumps`` (with its default ``ensure_ascii``); limit names never need
    escaping, but are checked too, as this is called on unvalidated input.
    """
    if (
        type(subject) is str
        and type(limit) is str
        and type(cost) is int
        and subject.isascii()
        and subject.isprintable()
        and '"' not in subject
        and "\\" not in subject
        and limit.isascii()
        and limit.isprintable()
        and '"' not in limit
        and "\\" not in limit
    ):
        return f'[["{subject}","{limit}",{cost}]]'
    return None


def plain_fingerprint(charges: Sequence[Sequence[object]]) -> str | None:
    """`fingerprint_of` several charges as `single_fingerprint` writes one
    (sorted as the encoder's lists are), or None when one is not plain."""
    parts = []
    for charge in charges:
        if len(charge) != 3:
            return None
        found = _single(*charge)
        if found is None:
            return None
        parts.append((charge[0], charge[1], charge[2], found[1:-1]))
    parts.sort()
    return "[" + ",".join([part[3] for part in parts]) + "]"


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """A validated usage event: build it with `make_event`."""

    event_id: str
    charges: tuple[Charge, ...]
    occurred_at: datetime
    metadata: Mapping[str, Any] | None = None
    occurred_at_us: int = field(init=False, repr=False, compare=False)
    # Computed on first use: the queued path (the API's 202) never needs it.
    _fingerprint: str | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "occurred_at_us", to_us(self.occurred_at))

    def fingerprint(self) -> str:
        """What makes two deliveries of one id the same event: its charges."""
        found = self._fingerprint
        if found is None:
            found = fingerprint_of(self.charges)
            object.__setattr__(self, "_fingerprint", found)
        return found

    def record(self) -> EventRecord:
        return EventRecord(
            self.event_id, self.charges, self.occurred_at_us, self.metadata, self.fingerprint()
        )


def records_of(events: Iterable[UsageEvent]) -> list[EventRecord]:
    """Each event's `UsageEvent.record`, for a batch (each keeps its fingerprint).

    An event of one charge whose fingerprint `_SINGLES` remembers (a batch's
    events mostly repeat their subjects' charges) is made in this loop, with
    no call per event; any other as `UsageEvent.record` makes it."""
    made: list[EventRecord] = []
    append, singles, setter = made.append, _SINGLES, object.__setattr__
    for event in events:
        found = event._fingerprint
        charges = event.charges
        if found is None and len(charges) == 1:
            charge = charges[0]  # exact types only, as `_single` looks them up
            if type(charge[0]) is str and type(charge[1]) is str and type(charge[2]) is int:
                found = singles.get(charge)
                if found is not None:
                    setter(event, "_fingerprint", found)
        if found is None:
            append(event.record())
            continue
        append(EventRecord(event.event_id, charges, event.occurred_at_us, event.metadata, found))
    return made


def new_event_id() -> str:
    return uuid.uuid4().hex


def validate_subject(subject: object) -> str:
    if not isinstance(subject, str):
        raise InvalidInput("subject", f"must be a string, got {type(subject).__name__}")
    if not 1 <= len(subject) <= MAX_SUBJECT_LENGTH:
        raise InvalidInput("subject", f"must be 1 to {MAX_SUBJECT_LENGTH} characters")
    if not subject.isprintable() or subject.strip() != subject:
        raise InvalidInput("subject", f"{shown(subject)} has control characters or edge spaces")
    return subject


def validate_filters(subject: str | None, limit: str | None) -> None:
    """A listing's filters: the subject and the limit name, each checked when given."""
    if subject is not None:
        validate_subject(subject)
    if limit is not None:
        validate_limit_name(limit)


def validate_cost(cost: object) -> int:
    return validate_whole("cost", cost, 1, MAX_COST)


def validate_charge_cost(cost: object) -> int:
    """A charge's cost: 0 too, the level a gauge may report (`refuse_free`)."""
    if type(cost) is int and cost == 0:  # never False nor 0.0
        return 0
    return validate_cost(cost)


def refuse_free(limit: Limit, cost: int) -> InvalidInput | None:
    """The error of a cost of 0 on ``limit`` (None: fine): only a gauge
    reports a level of 0; elsewhere 0 is no usage, refused as it always was."""
    if cost == 0 and not limit.is_gauge:
        try:
            validate_cost(cost)
        except InvalidInput as exc:
            return exc
    return None


def validate_event_id(event_id: object, field_name: str = "event_id") -> str:
    """An event id; grant and correction ids follow the same rule (``field_name``)."""
    if not isinstance(event_id, str) or EVENT_ID_PATTERN.fullmatch(event_id) is None:
        raise InvalidInput(
            field_name, f"{shown(event_id)} must be 1 to 128 of A-Z a-z 0-9 and _ . : @ / + = -"
        )
    return event_id


# A CloudEvent's event id: its ``id``, ``@``, and this many hex digits of the
# SHA-256 of its ``source`` (64 bits: two sources collide once in 2**32 pairs).
SOURCE_DIGITS: Final = 16
MAX_CLOUDEVENT_ID: Final = 128 - 1 - SOURCE_DIGITS


def cloudevent_event_id(source: str, cloudevent_id: str) -> str:
    """The event id of a CloudEvent, whose identity is ``(source, id)``.

    ``{id}@{16 hex digits of SHA-256(source)}``: the same id from two
    producers names two events, and the same event sent again is one. The
    suffix is always the last 17 characters, so ids that contain ``@`` stay
    apart. The ``id`` follows the event-id rule, up to 111 characters.
    """
    validate_event_id(cloudevent_id, "id")
    if len(cloudevent_id) > MAX_CLOUDEVENT_ID:
        raise InvalidInput("id", f"must be at most {MAX_CLOUDEVENT_ID} characters")
    digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{cloudevent_id}@{digest[:SOURCE_DIGITS]}"


def validate_charges(charges: Iterable[object]) -> tuple[Charge, ...]:
    if isinstance(charges, str | bytes) or not isinstance(charges, Iterable):
        raise InvalidInput("charges", "must be a list of (subject, limit, cost)")
    result: list[Charge] = []
    for item in charges:
        if not isinstance(item, tuple | list) or len(item) not in (2, 3):
            raise InvalidInput("charges", f"{shown(item)} is not (subject, limit[, cost])")
        subject, limit = validate_subject(item[0]), validate_limit_name(item[1])
        cost = validate_charge_cost(item[2] if len(item) == 3 else 1)
        result.append(Charge(subject, limit, cost))
    if not 1 <= len(result) <= MAX_CHARGES:
        raise InvalidInput("charges", f"an event has 1 to {MAX_CHARGES} charges")
    # One charge (most events) cannot repeat a pair.
    if len(result) > 1 and len({(c.subject, c.limit) for c in result}) != len(result):
        raise InvalidInput("charges", "each (subject, limit) may appear once per event")
    return tuple(result)


def validate_metadata(metadata: object) -> Mapping[str, Any] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise InvalidInput("metadata", "must be a mapping of JSON values")
    try:
        encoded = _compact_finite(metadata)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput("metadata", f"is not JSON-serialisable: {exc}") from exc
    if "\\ud" in encoded:  # a surrogate, paired (fine) or lone (not text: cannot be stored)
        try:
            json.dumps(metadata, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise InvalidInput("metadata", f"is not valid Unicode text: {exc.reason}") from None
    if len(encoded) > MAX_METADATA_BYTES:
        raise InvalidInput("metadata", f"is larger than {MAX_METADATA_BYTES} bytes as JSON")
    return dict(metadata)


def charges_of(
    subject: str | None, limit: str | None, cost: int, charges: Sequence[object] | None
) -> Sequence[object]:
    """One charge given as (subject, limit, cost), or several as ``charges``; not both."""
    if charges is None:
        if subject is None or limit is None:
            raise InvalidInput("charges", "give subject and limit, or charges=[...]")
        return [(subject, limit, cost)]
    if subject is not None or limit is not None:
        raise InvalidInput("charges", "give subject and limit, or charges=[...], not both")
    return charges


def make_event(
    charges: Iterable[object],
    occurred_at: datetime,
    event_id: str | None = None,
    metadata: object = None,
) -> UsageEvent:
    """Validate the parts of an event; a missing id is generated."""
    return UsageEvent(
        event_id=new_event_id() if event_id is None else validate_event_id(event_id),
        charges=validate_charges(charges),
        occurred_at=occurred_at,
        metadata=validate_metadata(metadata),
    )


def check_event_time(occurred_at: datetime, now_us: int, lateness_seconds: int) -> None:
    """SPEC invariant 4: reject events too late for their limit, or from the future."""
    at_us = to_us(occurred_at)
    if at_us > now_us + FUTURE_TOLERANCE_US:
        raise OccurredAtOutOfRange(occurred_at, "is more than 5 minutes in the future")
    if at_us < now_us - lateness_seconds * US_PER_SECOND:
        raise OccurredAtOutOfRange(
            occurred_at, f"is older than the allowed lateness of {lateness_seconds} s"
        )
