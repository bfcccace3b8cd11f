"""The queued path's apply side: applying one message's batch.

The message format, and its decoding, is `metering.pipeline.messages`. `apply_batch`
is what the worker's task calls: it decodes each event again (a queue is
untrusted input), applies the valid ones in one transaction with the rules
of `Meter.consume`, stores unknown limits and out-of-range times as
``rejected`` results, and keeps input that cannot become an event at all in
``rejected_messages`` with its error. Applying is idempotent, so the task can
be delivered any number of times; `apply_delivered` bounds them, for a message
that never finishes (its worker dies each time: docs/pipeline.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from metering.domain.events import EventRecord, Rejected
from metering.domain.jsonable import fields_dict
from metering.engine.answers import CONFLICT, DUPLICATE, NEW, Answer
from metering.engine.core import collector_paused
from metering.errors import InputRefused
from metering.meter import Meter
from metering.pipeline.messages import decode_records, encode_event, raw_text
from metering.pipeline.routing import APPLY_BATCH_TASK
from metering.storage.kombu_tables import Unfinished
from metering.telemetry.metrics import observe_batch
from metering.upkeep.dead_letters import keep_unfinished

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What applying one message did, for logs and the task's return value."""

    applied: int = 0
    duplicates: int = 0
    conflicts: int = 0
    rejected: int = 0
    malformed: int = 0

    def to_dict(self) -> dict[str, int]:
        return fields_dict(self)


def apply_batch(meter: Meter, payload: object) -> BatchReport:
    """Apply one queued message; database errors propagate so the task retries.

    An event the database refuses (`InputRefused`: a constraint, a value it
    cannot store) would fail the same way on every retry. The batch is then
    split in halves until the refused events stand alone; each is kept in
    ``rejected_messages`` (the dead-letter record) and every other event is
    applied, in order.
    """
    began = time.perf_counter()
    with collector_paused():
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


def apply_delivered(
    meter: Meter, payload: object, earlier: int, *, max_deliveries: int
) -> BatchReport:
    """`apply_batch` for a message delivered after ``earlier`` deliveries that never
    finished; once those reach ``max_deliveries`` it is kept instead
    (`keep_unfinished`: each event without a result ``rejected``, with a dead
    letter naming the deliveries, which `metering rejected replay` applies)."""
    if earlier < max_deliveries:
        return apply_batch(meter, payload)
    unfinished = Unfinished(raw_text(payload), earlier, APPLY_BATCH_TASK, payload)
    rejected = keep_unfinished(meter.database, [unfinished])
    log.warning(
        "batch delivered %d times and never finished: %d events kept rejected", earlier, rejected
    )
    return BatchReport(rejected=rejected)


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
    return raw_text(encode_event(event))


def report_of(answers: Sequence[Answer], *, malformed: int) -> BatchReport:
    new = [a.record for a in answers if a.kind == NEW and a.record is not None]
    rejected = sum(1 for record in new if record.outcome == "rejected")
    return BatchReport(
        applied=len(new) - rejected,
        duplicates=sum(1 for answer in answers if answer.kind == DUPLICATE),
        conflicts=sum(1 for answer in answers if answer.kind == CONFLICT),
        rejected=rejected,
        malformed=malformed,
    )
