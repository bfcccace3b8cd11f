"""The queued path: the message format, and applying one message's batch.

A message is one JSON object, the only argument of the task
``metering.apply_batch`` (`metering.routing.APPLY_BATCH_TASK`)::

    {"v": 1, "events": [{"id": "…", "charges": [["org-42", "api_calls", 3]],
                         "at": 1795000000000000, "meta": {…} | null}, …]}

``at`` is ``occurred_at`` in microseconds since the epoch. `apply_batch` is
what the worker's task calls: it validates each event again (a queue is
untrusted input), applies the valid ones in one transaction with the rules of
`Meter.consume`, stores unknown limits and out-of-range times as ``rejected``
results, and keeps input that cannot become an event at all in
``rejected_messages`` with its error. Applying is idempotent, so the task can
be delivered any number of times.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from metering.domain.events import (
    EVENT_ID_PATTERN,
    MAX_COST,
    MAX_SUBJECT_LENGTH,
    Charge,
    EventRecord,
    Rejected,
    UsageEvent,
    fingerprint_of,
    new_event_id,
    single_fingerprint,
    validate_charges,
    validate_event_id,
    validate_metadata,
)
from metering.domain.instants import MAX_US, MIN_US, from_us
from metering.domain.limits import NAME_PATTERN
from metering.engine.fast import CONFLICT, DUPLICATE, NEW, Answer
from metering.errors import InputRefused, MeteringError
from metering.meter import Meter
from metering.metrics import observe_batch

FORMAT_VERSION: Final = 1


def encode_event(event: UsageEvent) -> dict[str, Any]:
    return {
        "id": event.event_id,
        "charges": [list(charge) for charge in event.charges],
        "at": event.occurred_at_us,
        "meta": dict(event.metadata) if event.metadata is not None else None,
    }


def encode_batch(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"v": FORMAT_VERSION, "events": list(events)}


_compact = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def event_text(event: UsageEvent) -> str:
    """`encode_event` as JSON text: what a message's ``events`` list holds."""
    return _compact(encode_event(event))


# Celery's message body (protocol 2) is ``[args, kwargs, embed]``; a batch
# task's only argument is the batch.
_BODY_HEAD: Final = f'[[{{"v":{FORMAT_VERSION},"events":['
_BODY_TAIL: Final = ']}],{},{"callbacks":null,"errbacks":null,"chain":null,"chord":null}]'


def batch_body(texts: Sequence[str]) -> str:
    """The body of one ``metering.apply_batch`` message holding the events
    ``texts`` (each `event_text`, or the API's own `parsing.QueuedEvent.text`):
    the JSON Celery writes for ``send_task(APPLY_BATCH_TASK, args=[batch])``,
    built without decoding and encoding the events again."""
    return _BODY_HEAD + ",".join(texts) + _BODY_TAIL


def decode_batch(payload: object) -> tuple[list[UsageEvent], list[Rejected]]:
    """The events of a message, and what could not be decoded, in order."""
    records, rejected = decode_records(payload)
    events = [
        UsageEvent(r.event_id, r.charges, from_us(r.occurred_at_us), r.metadata) for r in records
    ]
    return events, rejected


def decode_records(payload: object) -> tuple[list[EventRecord], list[Rejected]]:
    """`decode_batch` as plain records, as the worker applies them."""
    if not isinstance(payload, Mapping) or payload.get("v") != FORMAT_VERSION:
        return [], [Rejected(None, "not a metering batch (version 1)", _raw(payload))]
    items = payload.get("events")
    if not isinstance(items, list):
        return [], [Rejected(None, "batch has no list of events", _raw(payload))]
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
            rejected.append(Rejected(usable, f"malformed event: {exc}", _raw(item)))
    return events, rejected


_id_ok = EVENT_ID_PATTERN.fullmatch
_name_ok = NAME_PATTERN.fullmatch


def _plain_record(item: object) -> EventRecord | None:
    """The usual queued event, decoded and validated in one pass, or None.

    The usual event: a JSON object with an id, one charge of three values and
    no metadata. Its checks are `_decode_record`'s (the same types, patterns
    and ranges), written out so that one event costs about a quarter of the
    general path; its fingerprint is written without the JSON encoder when
    no character needs escaping. Anything else (another shape, a value it
    does not accept) is None and goes through `_decode_record`, which gives
    the same record, or the error it has always given.
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
        or len(charges) != 1
        or item.get("meta") is not None
        or not MIN_US <= at <= MAX_US
        or _id_ok(event_id) is None
    ):
        return None
    charge = charges[0]
    if type(charge) is not list or len(charge) != 3:
        return None
    subject, limit, cost = charge
    if (
        type(subject) is not str
        or type(limit) is not str
        or type(cost) is not int
        or not 1 <= cost <= MAX_COST
        or not 1 <= len(subject) <= MAX_SUBJECT_LENGTH
        or _name_ok(limit) is None
        or not subject.isprintable()
        or subject.strip() != subject
    ):
        return None
    fingerprint = single_fingerprint(subject, limit, cost)
    if fingerprint is None:
        return None
    return EventRecord(event_id, (Charge(subject, limit, cost),), at, None, fingerprint)


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


def _raw(value: object) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), default=repr)[:65_536]
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:65_536]


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What applying one message did, for logs and the task's return value."""

    applied: int = 0
    duplicates: int = 0
    conflicts: int = 0
    rejected: int = 0
    malformed: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "applied": self.applied,
            "duplicates": self.duplicates,
            "conflicts": self.conflicts,
            "rejected": self.rejected,
            "malformed": self.malformed,
        }


def apply_batch(meter: Meter, payload: object) -> BatchReport:
    """Apply one queued message; database errors propagate so the task retries.

    An event the database refuses (`InputRefused`: a constraint, a value it
    cannot store) would fail the same way on every retry. The batch is then
    split in halves until the refused events stand alone; each is kept in
    ``rejected_messages`` (the dead-letter record) and every other event is
    applied, in order.
    """
    began = time.perf_counter()
    with _collector_paused():
        events, malformed = decode_records(payload)
        size = len(events) + len(malformed)
        try:
            answers = meter.apply_records(events, invalid="reject", rejected=malformed)
        except InputRefused:
            answers, refused = _apply_around_refusals(meter, events)
            malformed = [*malformed, *refused]
            meter.apply_records([], rejected=malformed)
    # Timed once applied: a batch that raises (the task retries it) is not one.
    observe_batch(time.perf_counter() - began, size)
    return report_of(answers, malformed=len(malformed))


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector, paused for one batch.

    A batch allocates tens of thousands of short-lived lists and tuples, all
    freed by reference counting when it ends; while it runs they trigger
    collections that walk every object of the process (in a worker: Celery,
    SQLAlchemy, the limits), a third of the batch's client CPU (measured).
    Cyclic garbage made meanwhile is collected after the batch. Left alone
    when the collector was already off.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _apply_around_refusals(
    meter: Meter, events: Sequence[EventRecord]
) -> tuple[list[Answer], list[Rejected]]:
    """Apply ``events`` in order, halving around the ones the database refuses."""
    try:
        return meter.apply_records(events, invalid="reject"), []
    except InputRefused as exc:
        if len(events) == 1:
            [event] = events
            return [], [
                Rejected(event.event_id, f"refused by the database: {exc}", _raw_record(event))
            ]
    middle = len(events) // 2
    head, head_refused = _apply_around_refusals(meter, events[:middle])
    tail, tail_refused = _apply_around_refusals(meter, events[middle:])
    return [*head, *tail], [*head_refused, *tail_refused]


def _raw_record(event: EventRecord) -> str:
    return _raw(
        {
            "id": event.event_id,
            "charges": [list(charge) for charge in event.charges],
            "at": event.occurred_at_us,
            "meta": dict(event.metadata) if event.metadata is not None else None,
        }
    )


def report_of(answers: Sequence[Answer], *, malformed: int) -> BatchReport:
    new = [record for kind, record in answers if kind == NEW and record is not None]
    rejected = sum(1 for record in new if record.outcome == "rejected")
    return BatchReport(
        applied=len(new) - rejected,
        duplicates=sum(1 for kind, _ in answers if kind == DUPLICATE),
        conflicts=sum(1 for kind, _ in answers if kind == CONFLICT),
        rejected=rejected,
        malformed=malformed,
    )
