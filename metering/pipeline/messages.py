"""The queued message format: what a producer writes and a worker reads (docs/pipeline.md).

A message is one Celery task message (protocol 2) of `routing.APPLY_BATCH_TASK` whose
one argument is ``{"v": 1, "events": [{"id", "charges", "at", "meta"}, ...]}`` (``at`` in
microseconds). Producers write the body as text (`event_text`, `batch_body`) and the
headers ``send_task`` writes (`task_headers`), published through kombu (`producer`). A
worker decodes it again (`decode_records`): a queue is untrusted input, so each event is
validated as `metering.domain.events.make_event` does; what fails is a `Rejected` with its
reason. Only the domain, the queue names and the standard library are imported here. The
bytes do not change between versions (tests/pipeline/test_messages.py keeps an old message).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from metering.domain.events import (
    EVENT_ID_PATTERN,
    MAX_CHARGES,
    MAX_COST,
    MAX_SUBJECT_LENGTH,
    Charge,
    EventRecord,
    Rejected,
    UsageEvent,
    fingerprint_of,
    new_event_id,
    plain_fingerprint,
    single_fingerprint,
    validate_charges,
    validate_event_id,
    validate_metadata,
)
from metering.domain.instants import MAX_US, MIN_US, from_us
from metering.domain.limits import NAME_PATTERN
from metering.errors import MeteringError
from metering.pipeline.routing import APPLY_BATCH_TASK, SENT_AT_HEADER

FORMAT_VERSION: Final = 1
# At most this many characters of input that cannot become an event are kept.
MAX_RAW: Final = 65_536

# -- writing ------------------------------------------------------------------


def encode_event(event: UsageEvent | EventRecord) -> dict[str, Any]:
    """An event as a message's ``events`` list holds it."""
    return {
        "id": event.event_id,
        "charges": [list(charge) for charge in event.charges],
        "at": event.occurred_at_us,
        "meta": dict(event.metadata) if event.metadata is not None else None,
    }


def encode_batch(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The task's argument holding ``events`` (each `encode_event`)."""
    return {"v": FORMAT_VERSION, "events": list(events)}


_compact = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def event_text(event: UsageEvent) -> str:
    """`encode_event` as JSON text: what a message's ``events`` list holds."""
    return _compact(encode_event(event))


def single_event_text(event_id: str, charges: str, at_us: int, meta: str) -> str:
    """`event_text` from parts that are JSON text already: ``charges`` the
    charges (for one charge, its `single_fingerprint`), ``meta`` the
    metadata (``null`` for none), and an ``event_id`` that needs no
    escaping (`EVENT_ID_PATTERN`). The API writes the usual event so."""
    return f'{{"id":"{event_id}","charges":{charges},"at":{at_us},"meta":{meta}}}'


# Celery's message body (protocol 2) is ``[args, kwargs, embed]``; a batch
# task's only argument is the batch.
_BODY_HEAD: Final = f'[[{{"v":{FORMAT_VERSION},"events":['
_BODY_TAIL: Final = ']}],{},{"callbacks":null,"errbacks":null,"chain":null,"chord":null}]'


def batch_body(texts: Sequence[str]) -> str:
    """The body of one ``metering.apply_batch`` message holding the events
    ``texts`` (each `event_text`, or `single_event_text`): the JSON Celery
    writes for ``send_task(APPLY_BATCH_TASK, args=[batch])``, built without
    decoding and encoding the events again."""
    return _BODY_HEAD + ",".join(texts) + _BODY_TAIL


def args_repr(count: int) -> str:
    """How a message of ``count`` events shows its arguments (Celery's ``argsrepr``)."""
    return f"[<{count} events>]"


def task_headers(task_id: str, count: int, origin: str, sent_at_us: int) -> dict[str, Any]:
    """The headers of a ``metering.apply_batch`` message of ``count`` events
    as Celery's ``send_task`` writes them (message protocol 2), and
    `SENT_AT_HEADER`: when it was sent, in microseconds since the epoch.
    tests/integration/test_redis_transport.py holds this to Celery's own."""
    return {
        "lang": "py",
        "task": APPLY_BATCH_TASK,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": args_repr(count),
        "kwargsrepr": "{}",
        "origin": origin,
        "ignore_result": None,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
        SENT_AT_HEADER: sent_at_us,
    }


# -- reading ------------------------------------------------------------------


def batch_argument(args: Sequence[object], kwargs: Mapping[str, object]) -> object:
    """What ``metering.apply_batch`` applies of the arguments a message gives it:
    its one argument, else all of them (kept as not a batch, with what they were)."""
    return args[0] if len(args) == 1 and not kwargs else {"args": args, "kwargs": kwargs}


def decode_records(payload: object) -> tuple[list[EventRecord], list[Rejected]]:
    """The events of a message's argument, as the worker applies them, and
    what could not be decoded, in order."""
    if not isinstance(payload, Mapping) or payload.get("v") != FORMAT_VERSION:
        return [], [Rejected(None, "not a metering batch (version 1)", raw_text(payload))]
    items = payload.get("events")
    if not isinstance(items, list):
        return [], [Rejected(None, "batch has no list of events", raw_text(payload))]
    events: list[EventRecord] = []
    rejected: list[Rejected] = []
    for item in items:
        found = _plain_record(item)
        if found is not None:
            events.append(found)
            continue
        try:
            events.append(_decode_record(item))
        except (MeteringError, TypeError, ValueError, OverflowError, KeyError) as exc:
            event_id = item.get("id") if isinstance(item, Mapping) else None
            # Kept only when it is a valid id: a NUL or a lone surrogate
            # cannot be stored, and would fail the whole batch.
            valid = isinstance(event_id, str) and EVENT_ID_PATTERN.fullmatch(event_id)
            usable = event_id if valid else None
            rejected.append(Rejected(usable, f"malformed event: {exc}", raw_text(item)))
    return events, rejected


_id_ok = EVENT_ID_PATTERN.fullmatch
_name_ok = NAME_PATTERN.fullmatch


def usual_charge(subject: object, limit: object, cost: object) -> bool:
    """Whether (subject, limit, cost) is a charge every check of the general
    path would pass: the one-pass readers (this module's decoder and the
    HTTP API's parser) take it at once, and leave anything else to the
    general path, which says what is wrong."""
    return (
        type(subject) is str
        and type(limit) is str
        and type(cost) is int
        and 1 <= cost <= MAX_COST
        and 1 <= len(subject) <= MAX_SUBJECT_LENGTH
        and _name_ok(limit) is not None
        and subject.isprintable()
        and subject.strip() == subject
    )


def _plain_record(item: object) -> EventRecord | None:
    """The usual queued event, decoded and validated in one pass, or None.

    The usual event: a JSON object with an id, 1 to `MAX_CHARGES` charges of
    three values on distinct (subject, limit) pairs, and no metadata or a
    JSON object of it. Its checks are `_decode_record`'s (the same types,
    patterns and ranges), written out so that one event costs a fraction of
    the general path; its fingerprint is written without the JSON encoder
    when no character needs escaping. Anything else (another shape, a value
    it does not accept) is None and goes through `_decode_record`, which
    gives the same record, or the error it has always given.
    """
    if type(item) is not dict:
        return None
    at = item.get("at")
    event_id = item.get("id")
    charges = item.get("charges")
    if (
        type(at) is not int
        or type(event_id) is not str
        or type(charges) is not list
        or not 1 <= len(charges) <= MAX_CHARGES
        or not MIN_US <= at <= MAX_US
        or _id_ok(event_id) is None
    ):
        return None
    metadata = item.get("meta")
    if metadata is not None:
        if type(metadata) is not dict:
            return None
        try:
            metadata = validate_metadata(metadata)
        except MeteringError:
            return None
    if len(charges) == 1:
        charge = charges[0]
        if type(charge) is not list or len(charge) != 3:
            return None
        subject, limit, cost = charge
        if not usual_charge(subject, limit, cost):
            return None
        fingerprint = single_fingerprint(subject, limit, cost)
        if fingerprint is None:
            return None
        return EventRecord(event_id, (Charge(subject, limit, cost),), at, metadata, fingerprint)
    found: list[Charge] = []
    for charge in charges:
        if type(charge) is not list or len(charge) != 3:
            return None
        subject, limit, cost = charge
        if not usual_charge(subject, limit, cost):
            return None
        found.append(Charge(subject, limit, cost))
    if len({(subject, limit) for subject, limit, _ in found}) != len(found):
        return None
    fingerprint = plain_fingerprint(found)
    if fingerprint is None:
        return None
    return EventRecord(event_id, tuple(found), at, metadata, fingerprint)


def _decode_record(item: object) -> EventRecord:
    # The checks of `make_event`, in its order, without building datetimes.
    if not isinstance(item, Mapping):
        raise ValueError("an event must be a JSON object")
    at = item["at"]
    if isinstance(at, bool) or not isinstance(at, int):
        raise ValueError(f"'at' must be microseconds since the epoch, got {at!r}")
    from_us(at)  # in the range of a datetime
    event_id = item["id"]
    charges = item["charges"]
    event_id = new_event_id() if event_id is None else validate_event_id(event_id)
    checked = validate_charges(charges)
    metadata = validate_metadata(item.get("meta"))
    return EventRecord(event_id, checked, at, metadata, fingerprint_of(checked))


def raw_text(value: object) -> str:
    """Input as a `Rejected` keeps it: compact JSON where it can be, at most
    `MAX_RAW` characters."""
    try:
        return json.dumps(value, separators=(",", ":"), default=repr)[:MAX_RAW]
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:MAX_RAW]
