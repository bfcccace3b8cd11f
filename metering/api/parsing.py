"""Request bodies into validated usage events, every rule the library's own.

A body is JSON with no NaN or infinite numbers (and no integer beyond
Python's 4,300 digits). It holds one plain event, a JSON array of them, or
CloudEvents 1.0 (one structured event, or a batch). Each event goes through
`metering.domain.events.make_event`, so the API accepts exactly what
`Meter.consume` and `UsageProducer.emit` accept. Errors name the field with
a pointer into the body: ``cost`` in a single event, ``events[3].cost`` in
an array or batch, ``events[0].data.charges[1].limit`` in a CloudEvent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, Final, Literal, NamedTuple, cast

from metering.api.models import (
    ChargeIn,
    SingleCheck,
    SingleEvent,
    StackedCheck,
    StackedEvent,
    body_fields,
)
from metering.api.problems import ApiProblem
from metering.domain.events import (
    EVENT_ID_PATTERN,
    FUTURE_TOLERANCE_US,
    MAX_METADATA_BYTES,
    Charge,
    UsageEvent,
    cloudevent_event_id,
    make_event,
    new_event_id,
    validate_cost,
    validate_event_id,
    validate_subject,
)
from metering.domain.instants import parse_instant, to_us
from metering.domain.limits import NAME_PATTERN, validate_limit_name
from metering.errors import InvalidInput
from metering.pipeline.messages import event_text, single_event_text, usual_charge

BodyKind = Literal["json", "cloudevent", "cloudevents-batch"]
MEDIA_TYPES: Final[dict[str, BodyKind]] = {
    "application/json": "json",
    "application/cloudevents+json": "cloudevent",
    "application/cloudevents-batch+json": "cloudevents-batch",
}
# The fields each body may have, from the models that describe it (`metering.api.models`).
PLAIN_FIELDS: Final = body_fields(SingleEvent, StackedEvent)
CHECK_FIELDS: Final = body_fields(SingleCheck, StackedCheck)
CHARGE_FIELDS: Final = body_fields(ChargeIn)
CLOUDEVENT_REQUIRED: Final = ("specversion", "id", "source", "type")
# Library field names as the request spells them; and in a CloudEvent.
_FIELD_NAMES: Final = {"name": "limit"}
_CLOUDEVENT_NAMES: Final = {"event_id": "id", "occurred_at": "time", "metadata": "data"}
# At most this many field errors in one answer.
MAX_ERRORS: Final = 100

FieldErrors = list[tuple[str, str]]


# Where an event's charges were in the body: at the event itself (one charge),
# in ``charges`` (stacked), in ``data`` or ``data.charges`` (a CloudEvent).
Shape = Literal["single", "stacked", "data", "data.charges"]
RawCharge = tuple[object, object, object]


@dataclass(frozen=True, slots=True)
class Parsed:
    """A validated event and where its parts were in the body, for later errors."""

    event: UsageEvent
    prefix: str
    shape: Shape

    @property
    def time_pointer(self) -> str:
        return _at(self.prefix, "time" if self.shape.startswith("data") else "occurred_at")

    def field_pointer(self, name: str) -> str:
        """Where the event's own field ``name`` (the library's) was given."""
        name = _FIELD_NAMES.get(name, name)
        if self.shape.startswith("data"):
            name = _CLOUDEVENT_NAMES.get(name, name)
        return _at(self.prefix, name)

    def charge_pointer(self, index: int, name: str) -> str:
        """Where charge ``index``'s ``name`` (subject, limit, cost) was given."""
        if self.shape == "single":
            return _at(self.prefix, name)
        if self.shape == "data":
            return _at(self.prefix, name if name == "subject" else f"data.{name}")
        base = "charges" if self.shape == "stacked" else "data.charges"
        return _at(self.prefix, f"{base}[{index}].{name}")


class Invalid(Exception):
    """One field of the body at fault: (pointer, message)."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(pointer, message)
        self.pointer = pointer
        self.message = message


def body_kind(content_type: str | None) -> BodyKind:
    """Which of the three bodies a ``Content-Type`` announces; 415 for any other."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    kind = MEDIA_TYPES.get(media)
    if kind is None:
        shown = repr(media) if media else "no content type"
        raise ApiProblem(
            "unsupported-media-type",
            f"{shown}: send application/json, application/cloudevents+json "
            "or application/cloudevents-batch+json",
        )
    return kind


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def decode_json(body: bytes) -> Any:
    """Strict JSON: no NaN or Infinity, no number that overflows; 400 otherwise."""
    if not body.strip():
        raise ApiProblem("invalid-input", "the request body is empty", [("body", "is empty")])
    try:
        return json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, int digits
        message = str(exc) if len(str(exc)) <= 200 else str(exc)[:199] + "…"
        raise ApiProblem(
            "invalid-input", f"the body is not valid JSON: {message}", [("body", message)]
        ) from None


def _at(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _parse_time(value: object, pointer: str) -> datetime:
    if not isinstance(value, str):
        raise Invalid(pointer, "must be an RFC 3339 date-time string with a time zone")
    try:
        return parse_instant(value, field_name=pointer, naive_is_utc=False, dates=False)
    except InvalidInput as exc:
        raise Invalid(pointer, exc.message) from None


def _raw_charge(item: object, pointer: str, default_subject: object = None) -> RawCharge:
    """A charge object's values, not yet validated (`make_event` does that once)."""
    if not isinstance(item, Mapping):
        raise Invalid(pointer, "must be an object with subject, limit and cost")
    _only(item, CHARGE_FIELDS, pointer)
    cost = whole_number(item.get("cost", 1))
    return (item.get("subject", default_subject), item.get("limit"), cost)


# Each field of a charge and the library rule that checks it.
CHARGE_CHECKS: Final[tuple[tuple[str, Callable[[object], object]], ...]] = (
    ("subject", validate_subject),
    ("limit", validate_limit_name),
    ("cost", validate_cost),
)


def _locate(charges: Sequence[RawCharge], where: Parsed) -> Invalid | None:
    """The first bad value among ``charges``, with its pointer (after `make_event` refused)."""
    for index, values in enumerate(charges):
        for (name, check), value in zip(CHARGE_CHECKS, values, strict=True):
            try:
                check(value)
            except InvalidInput as exc:
                return Invalid(where.charge_pointer(index, name), exc.message)
    return None


def whole_number(cost: object) -> object:
    """A JSON number with no fraction is a whole number, however it is written
    (``2``, ``2.0``, ``2e0``): JSON has one number type. Past 2**53 a float is
    not exact, and past 10**12 no cost is valid anyway."""
    if isinstance(cost, float) and cost.is_integer() and abs(cost) <= 2**53:
        return int(cost)
    return cost


def _only(item: Mapping[str, Any], allowed: frozenset[str], prefix: str) -> None:
    for key in item:
        if key not in allowed:
            raise Invalid(_at(prefix, str(key)[:60]), "is not a field of this object")


def _raw_charges(value: object, pointer: str, default_subject: object = None) -> list[RawCharge]:
    if not isinstance(value, list) or not value:
        raise Invalid(pointer, "must be a non-empty array of {subject, limit, cost}")
    return [_raw_charge(c, f"{pointer}[{i}]", default_subject) for i, c in enumerate(value)]


def _plain_charges(item: Mapping[str, Any], prefix: str) -> tuple[list[RawCharge], Shape]:
    if "charges" in item:
        if "subject" in item or "limit" in item or "cost" in item:
            raise Invalid(_at(prefix, "charges"), "give subject and limit, or charges, not both")
        return _raw_charges(item["charges"], _at(prefix, "charges")), "stacked"
    if "subject" not in item or "limit" not in item:
        missing = "subject" if "subject" not in item else "limit"
        raise Invalid(_at(prefix, missing), "is required (or give charges)")
    return [(item["subject"], item["limit"], whole_number(item.get("cost", 1)))], "single"


def _event(
    charges: list[RawCharge],
    occurred_at: datetime,
    event_id: object,
    metadata: object,
    where: Parsed,
    now_us: int,
) -> UsageEvent:
    """`make_event`, its `InvalidInput` turned into a pointer into the body."""
    try:
        event = make_event(charges, occurred_at, event_id, metadata)  # type: ignore[arg-type]
    except InvalidInput as exc:
        located = _locate(charges, where)
        if located is not None:
            raise located from None
        name = _FIELD_NAMES.get(exc.field, exc.field)
        if where.shape.startswith("data"):
            name = _CLOUDEVENT_NAMES.get(name, name)
        raise Invalid(_at(where.prefix, name), exc.message) from None
    if event.occurred_at_us > now_us + FUTURE_TOLERANCE_US:
        raise Invalid(where.time_pointer, "is more than 5 minutes in the future")
    return event


# A placeholder until the event exists: `_event` reports errors through it.
_NO_EVENT: Final = UsageEvent("-", (), datetime.fromtimestamp(0, UTC))


def plain_event(item: object, prefix: str, now: datetime, now_us: int | None = None) -> Parsed:
    """One event in the Python API's names (``now_us``: ``now`` in microseconds,
    computed once by a caller that parses many)."""
    if not isinstance(item, Mapping):
        raise Invalid(prefix or "body", "must be a JSON object (an event)")
    _only(item, PLAIN_FIELDS, prefix)
    charges, shape = _plain_charges(item, prefix)
    where = Parsed(_NO_EVENT, prefix, shape)
    at = item.get("occurred_at")
    when = now if at is None else _parse_time(at, where.time_pointer)
    metadata = item.get("metadata")
    now_us = to_us(now) if now_us is None else now_us
    event = _event(charges, when, item.get("event_id"), metadata, where, now_us)
    return Parsed(event, prefix, shape)


def cloud_event(item: object, prefix: str, now: datetime, now_us: int | None = None) -> Parsed:
    """One CloudEvent 1.0 (structured JSON) as a usage event; see docs/api-http.md."""
    if not isinstance(item, Mapping):
        raise Invalid(prefix or "body", "must be a JSON object (a CloudEvent)")
    for name in CLOUDEVENT_REQUIRED:
        value = item.get(name)
        if not isinstance(value, str) or not value:
            raise Invalid(_at(prefix, name), "is required: a non-empty string")
    if item["specversion"] != "1.0":
        raise Invalid(_at(prefix, "specversion"), "must be 1.0")
    content_type = item.get("datacontenttype", "application/json")
    if not isinstance(content_type, str) or not _is_json_media(content_type):
        raise Invalid(_at(prefix, "datacontenttype"), "must be application/json")
    if "data_base64" in item:
        raise Invalid(_at(prefix, "data_base64"), "binary data is not supported: send data")
    data = item.get("data")
    if not isinstance(data, Mapping):
        raise Invalid(_at(prefix, "data"), "must be an object: {limit, cost} or {charges}")
    subject = item.get("subject")
    shape: Shape
    if "charges" in data:
        if "limit" in data or "cost" in data:
            raise Invalid(_at(prefix, "data.charges"), "give limit and cost, or charges, not both")
        charges = _raw_charges(data["charges"], _at(prefix, "data.charges"), subject)
        rest = {k: v for k, v in data.items() if k != "charges"}
        shape = "data.charges"
    else:
        if subject is None:
            raise Invalid(_at(prefix, "subject"), "is required (or give data.charges)")
        charges = [(subject, data.get("limit"), whole_number(data.get("cost", 1)))]
        rest = {k: v for k, v in data.items() if k not in ("limit", "cost")}
        shape = "data"
    where = Parsed(_NO_EVENT, prefix, shape)
    at = item.get("time")
    when = now if at is None else _parse_time(at, where.time_pointer)
    now_us = to_us(now) if now_us is None else now_us
    try:
        event_id = cloudevent_event_id(item["source"], item["id"])
    except InvalidInput as exc:
        raise Invalid(_at(prefix, "id"), exc.message) from None
    event = _event(charges, when, event_id, rest or None, where, now_us)
    return Parsed(event, prefix, shape)


def _is_json_media(media: str) -> bool:
    base = media.split(";", 1)[0].strip().lower()
    return base == "application/json" or base.endswith("+json")


def _items(data: Any, kind: BodyKind, max_events: int) -> tuple[list[Any], bool]:
    """The events of a decoded body, and whether it was an array."""
    batch = isinstance(data, list)
    if kind == "cloudevents-batch" and not batch:
        raise ApiProblem(
            "invalid-input",
            "a CloudEvents batch is a JSON array",
            [("body", "must be a JSON array of CloudEvents")],
        )
    if kind == "cloudevent" and batch:
        raise ApiProblem(
            "invalid-input",
            "a structured CloudEvent is one JSON object",
            [
                (
                    "body",
                    "must be one CloudEvent object; send an array as "
                    "application/cloudevents-batch+json",
                )
            ],
        )
    items = data if batch else [data]
    if len(items) > max_events:
        raise ApiProblem(
            "body-too-large", f"{len(items)} events in one request; at most {max_events}"
        )
    if not items:
        raise ApiProblem("invalid-input", "no events", [("body", "is an empty array")])
    return items, batch


IDEMPOTENCY_HEADER: Final = "Idempotency-Key"


def idempotency_key(value: str) -> str:
    """The event id an ``Idempotency-Key`` header names: a Structured Field
    string (``"abc"``, as draft-ietf-httpapi-idempotency-key-header writes
    it) or the bare id; either way it must be a valid event id."""
    key = value.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    try:
        return validate_event_id(key, IDEMPOTENCY_HEADER)
    except InvalidInput as exc:
        raise ApiProblem(
            "invalid-input", f"{IDEMPOTENCY_HEADER}: {exc.message}", [(exc.field, exc.message)]
        ) from None


def with_idempotency_key(body: bytes, kind: BodyKind, values: Sequence[str]) -> bytes:
    """The body of a request that carries an ``Idempotency-Key`` (``values``:
    its header lines): one plain event whose ``event_id`` is the key. A body
    ``event_id`` equal to it is fine; a different one, a batch, a CloudEvent
    (whose id is its own ``(source, id)``) or the header twice (a list, RFC 9110
    5.3) is a 400 problem. Only requests with the header come here: the usual
    request is parsed in one pass, as before."""
    if len(values) > 1:
        raise _header_problem("is one id: send the header once")
    key = idempotency_key(values[0])
    if kind != "json":
        raise _header_problem("names a plain event's id; a CloudEvent carries its own id")
    data = decode_json(body)
    if not isinstance(data, dict):
        raise _header_problem(
            "is for one event; send a batch without it, each event with its event_id"
        )
    given = data.get("event_id")
    if given is not None and given != key:
        message = f"differs from the {IDEMPOTENCY_HEADER} header ({key!r}); give one, or both equal"
        raise ApiProblem("invalid-input", f"event_id: {message}", [("event_id", message)])
    data["event_id"] = key
    return json.dumps(data, separators=(",", ":")).encode()


def _header_problem(message: str) -> ApiProblem:
    return ApiProblem(
        "invalid-input", f"{IDEMPOTENCY_HEADER}: {message}", [(IDEMPOTENCY_HEADER, message)]
    )


def parse_events(body: bytes, kind: BodyKind, now: datetime, max_events: int) -> list[Parsed]:
    """Every event of a request, all valid, or `ApiProblem` naming each bad one."""
    items, batch = _items(decode_json(body), kind, max_events)
    parse = plain_event if kind == "json" else cloud_event
    now_us = to_us(now)
    events: list[Parsed] = []
    errors: FieldErrors = []
    for index, item in enumerate(items):
        try:
            events.append(parse(item, f"events[{index}]" if batch else "", now, now_us))
        except Invalid as exc:
            errors.append((exc.pointer, exc.message))
    if errors:
        shown = errors[:MAX_ERRORS]
        raise ApiProblem("invalid-input", _summary(errors, len(items)), shown)
    return events


class QueuedEvent(NamedTuple):
    """A validated event as the queued path carries it: its id, charges and
    time (microseconds), its metadata, its fingerprint (what makes two
    deliveries of one id the same event) and ``text``, the event as a queued
    message holds it (`metering.pipeline.messages.event_text`)."""

    event_id: str
    charges: tuple[Charge, ...]
    occurred_at_us: int
    metadata: Mapping[str, Any] | None
    fingerprint: str
    text: str


def queued_of(event: UsageEvent) -> QueuedEvent:
    return QueuedEvent(
        event.event_id,
        event.charges,
        event.occurred_at_us,
        event.metadata,
        event.fingerprint(),
        event_text(event),
    )


# The JSON text of `metering.domain.events.validate_metadata`'s encoder
# (compact, ASCII, no NaN), as its C encoder called directly: the metadata
# was decoded from JSON, so it holds no cycle and nothing unencodable.
_encode_metadata = c_make_encoder(
    None, None, encode_basestring_ascii, None, ":", ",", False, False, False
)
_id_ok = EVENT_ID_PATTERN.fullmatch
_new = tuple.__new__
_name_ok = NAME_PATTERN.fullmatch
# Times already parsed (RFC 3339 text to microseconds: a pure function), at
# most this many; clients often send one time for a whole batch.
_times: dict[str, int] = {}
MAX_TIMES: Final = 4096


def _us_of(text: str) -> int | None:
    found = _times.get(text)
    if found is None:
        try:
            found = to_us(parse_instant(text, field_name="time", naive_is_utc=False, dates=False))
        except InvalidInput:
            return None
        if len(_times) >= MAX_TIMES:
            _times.clear()
        _times[text] = found
    return found


def _queued_plain(item: object, now_us: int) -> QueuedEvent | None:
    """The usual plain event (one charge; subject, limit, cost, event_id,
    occurred_at, metadata), validated and written as message text in one
    pass; None for anything else or anything wrong, which `plain_event`
    then accepts or refuses as it always has. Its checks are those of
    `plain_event` and `make_event`, written out for this one shape: an event
    this returns is the one `queued_of(plain_event(...).event)` gives, text
    included (tests/api/test_api_parsing.py holds it to that)."""
    if type(item) is not dict or not item.keys() <= PLAIN_FIELDS or "charges" in item:
        return None
    subject = cast(str, item.get("subject"))  # checked by `usual_charge` next
    limit = item.get("limit")
    cost = item.get("cost", 1)
    if not usual_charge(subject, limit, cost):
        return None
    event_id = item.get("event_id")
    if event_id is None:
        event_id = new_event_id()
    elif type(event_id) is not str or _id_ok(event_id) is None:
        return None
    at = item.get("occurred_at")
    if at is None:
        at_us = now_us
    else:
        found = _us_of(at) if type(at) is str else None
        if found is None or found > now_us + FUTURE_TOLERANCE_US:
            return None
        at_us = found
    metadata = item.get("metadata")
    if metadata is None:
        meta = "null"
    elif type(metadata) is dict:
        meta = "".join(_encode_metadata(metadata, 0))
        # A surrogate (`validate_metadata` looks closer), or too large.
        if len(meta) > MAX_METADATA_BYTES or "\\ud" in meta:
            return None
    else:
        return None
    # `single_fingerprint`: the charges' JSON text when the subject needs no
    # escaping (ids and limit names never do: their patterns).
    if not subject.isascii() or '"' in subject or "\\" in subject:
        return None
    charges = f'[["{subject}","{limit}",{cost}]]'
    text = single_event_text(event_id, charges, at_us, meta)
    # The tuples built directly (a NamedTuple's own __new__ costs twice as much).
    charge = _new(Charge, (subject, limit, cost))
    return _new(QueuedEvent, (event_id, (charge,), at_us, metadata, charges, text))


def queued_events(body: bytes, kind: BodyKind, now: datetime, max_events: int) -> list[QueuedEvent]:
    """`parse_events` for the queued path: the same events, errors and
    problems, as `QueuedEvent`. The usual plain event takes `_queued_plain`;
    any other goes through `plain_event` or `cloud_event`."""
    if kind != "json":
        return [queued_of(item.event) for item in parse_events(body, kind, now, max_events)]
    items, batch = _items(decode_json(body), kind, max_events)
    now_us = to_us(now)
    events: list[QueuedEvent] = []
    errors: FieldErrors = []
    for index, item in enumerate(items):
        found = _queued_plain(item, now_us)
        if found is None:
            try:
                found = queued_of(
                    plain_event(item, f"events[{index}]" if batch else "", now, now_us).event
                )
            except Invalid as exc:
                errors.append((exc.pointer, exc.message))
                continue
        events.append(found)
    if errors:
        shown = errors[:MAX_ERRORS]
        raise ApiProblem("invalid-input", _summary(errors, len(items)), shown)
    return events


def _summary(errors: FieldErrors, total: int) -> str:
    first = f"{errors[0][0]}: {errors[0][1]}"
    if total == 1:
        return first
    return f"{len(errors)} of {total} events are not valid; nothing was accepted. {first}"


def parse_check(body: bytes, now: datetime) -> Parsed:
    """The body of ``POST /v1/check``: charges and when (the event has no id of its own)."""
    item = decode_json(body)
    try:
        if not isinstance(item, Mapping):
            raise Invalid("body", "must be a JSON object")
        _only(item, CHECK_FIELDS, "")
        charges, shape = _plain_charges(item, "")
        where = Parsed(_NO_EVENT, "", shape)
        at = item.get("occurred_at")
        when = now if at is None else _parse_time(at, where.time_pointer)
        metadata = item.get("metadata")
        return Parsed(_event(charges, when, "check", metadata, where, to_us(now)), "", shape)
    except Invalid as exc:
        raise ApiProblem(
            "invalid-input", f"{exc.pointer}: {exc.message}", [(exc.pointer, exc.message)]
        ) from None
