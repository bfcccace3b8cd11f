"""Dead letters as operators replay them.

The dead-letter record holds undecodable messages, reused ids and every event
rejected (unknown limit, too late, its message never finished: `keep_unfinished`),
whole, with its reason. Those of the last `RECENT_SECONDS` are a warning of
`metering status` and the gauge ``metering_rejected_recent``. `replay` applies the
rejected events acceptable now, exactly once: in one transaction it deletes each
one's ``rejected`` result (a concurrent replay deletes none twice), decides it with
the reference engine and deletes its dead letter. An event still unacceptable is
left as it is, with why.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection

from metering.domain.bounds import validate_count
from metering.domain.decisions import Decision
from metering.domain.events import EventRecord, Rejected, UsageEvent
from metering.domain.instants import from_us
from metering.engine.fast import refused_event
from metering.engine.reference import apply_events, validate_against_limits
from metering.errors import EventConflict
from metering.pipeline.messages import decode_records, encode_batch
from metering.storage.connections import RetryTransaction
from metering.storage.database import Database
from metering.storage.kombu_tables import Unfinished
from metering.storage.results import ResultRecord
from metering.storage.store import Store
from metering.telemetry.metrics import UNKNOWN_LIMIT, count_events

RECENT_SECONDS: Final = 86_400


@dataclass(frozen=True, slots=True)
class Replayed:
    """What `replay` did: the decisions of the events it applied, and the
    events left rejected with why (their limit still unknown, too late)."""

    applied: tuple[Decision, ...]
    waiting: tuple[tuple[str, str], ...]


def replay(database: Database, count: int) -> Replayed:
    """Apply up to ``count`` rejected events, oldest first, that are acceptable now."""
    validate_count("count", count)
    now_us = database.now_us()

    def work(connection: Connection) -> Replayed:
        store = Store(connection)
        letters = [(d, i, _event(raw)) for d, i, raw in store.rejected_events(count)]
        limits = store.load_limits(c.limit for _, _, e in letters if e for c in e.charges)
        ready: list[tuple[str, UsageEvent]] = []
        waiting: list[tuple[str, str]] = []
        for digest, event_id, event in letters:
            error = None if event is None else validate_against_limits(event, limits, now_us)
            if event is None or error is not None:
                waiting.append((event_id, "not an event" if event is None else str(error)))
            else:
                ready.append((digest, event))
        taken = store.take_rejected_results([event.event_id for _, event in ready])
        events = [event for _, event in ready if event.event_id in taken]
        decided = apply_events(store, events, now_us, invalid="raise")
        store.delete_rejected_messages([digest for digest, _ in ready])
        applied = tuple(d for d in decided if isinstance(d, Decision))
        return Replayed(applied, tuple(waiting))

    done = database.run(work)
    _count(done.applied)
    return done


def _event(raw: str) -> UsageEvent | None:
    """The event a dead letter keeps (`metering.engine.fast.refused_event`), or None."""
    try:
        records, _ = decode_records(encode_batch([json.loads(raw)]))
    except ValueError:
        return None
    if len(records) != 1:
        return None
    record = records[0]
    return UsageEvent(
        record.event_id, record.charges, from_us(record.occurred_at_us), record.metadata
    )


def _count(decisions: Sequence[Decision]) -> None:
    """`metering_events_total` for the replayed events, as the engine counts new results."""
    outcomes: Counter[tuple[str, str]] = Counter(
        (name, str(d.outcome))
        for d in decisions
        for name in dict.fromkeys(c.limit for c in d.charges)
    )
    denied = Counter(name for d in decisions if d.outcome == "denied" for name in d.denied_by)
    count_events(outcomes, denied, {}, 0)


def unfinished_reason(deliveries: int) -> str:
    """The reason of what `keep_unfinished` keeps: the message's count of deliveries."""
    return f"delivered {deliveries} times and never finished: taken off the queue"


def keep_unfinished(database: Database, messages: Sequence[Unfinished]) -> int:
    """Keep the messages the broker gave up on, in one transaction; how many events
    it rejected.

    A batch's events without a result get a ``rejected`` result and their dead
    letter, the reason naming the deliveries (`replay` applies them); an id already
    decided is left as it is, or, with other charges, kept as a conflict, and what
    cannot become an event is kept, each as applying the batch would. Any other
    message is kept whole. Writing it twice writes nothing more.
    """
    now_us = database.now_us()

    def work(connection: Connection) -> tuple[list[EventRecord], set[str], int]:
        store = Store(connection)
        letters: list[Rejected] = []
        rejected: list[EventRecord] = []
        for message in messages:
            reason = unfinished_reason(message.deliveries)
            if message.batch is None:
                what = message.task or "a message that names no task"
                letters.append(Rejected(None, f"{what}: {reason}", message.raw))
                continue
            records, malformed = decode_records(message.batch)
            letters += malformed
            if not records and not malformed:
                letters.append(Rejected(None, f"an empty batch: {reason}", message.raw))
            undecided, kept = _reject_undecided(store, records, reason)
            rows = [_rejected_row(record, reason, now_us) for record in undecided]
            if len(store.insert_results(rows)) != len(rows):
                raise RetryTransaction("an event id was decided concurrently")
            rejected += undecided
            letters += kept
        store.record_rejected_messages(letters, now_us)
        known = set(store.load_limits(_limit_names(rejected)))
        return rejected, known, len(letters) - len(rejected)

    rejected, known, other_letters = database.run(work)
    _count_rejected(rejected, known, other_letters)
    return len(rejected)


def _limit_names(records: Sequence[EventRecord]) -> dict[str, None]:
    return dict.fromkeys(charge[1] for record in records for charge in record.charges)


def _count_rejected(records: Sequence[EventRecord], known: set[str], dead_letters: int) -> None:
    """`metering_events_total` for the events kept ``rejected``, as the engine counts
    new rejected results (an unknown limit as `UNKNOWN_LIMIT`); the dead letters
    of anything else kept (what is no event, conflicts, whole messages)."""
    outcomes: Counter[tuple[str, str]] = Counter(
        (name if name in known else UNKNOWN_LIMIT, "rejected")
        for record in records
        for name in _limit_names([record])
    )
    count_events(outcomes, {}, {}, dead_letters)


def _reject_undecided(
    store: Store, records: Sequence[EventRecord], reason: str
) -> tuple[list[EventRecord], list[Rejected]]:
    """Those of ``records`` without a result (an id repeated in ``records``
    once), and the dead letters of those and of conflicts."""
    known = {e: r.fingerprint for e, r in store.fetch_results(r.event_id for r in records).items()}
    undecided: list[EventRecord] = []
    letters: list[Rejected] = []
    for record in records:
        fingerprint = known.get(record.event_id)
        if fingerprint is None:
            known[record.event_id] = record.fingerprint
            undecided.append(record)
            letters.append(refused_event(record, reason))
        elif fingerprint != record.fingerprint:
            conflict = EventConflict(record.event_id)
            letters.append(Rejected(record.event_id, str(conflict), record.fingerprint))
    return undecided, letters


def _rejected_row(record: EventRecord, reason: str, now_us: int) -> ResultRecord:
    """The ledger's row of an event rejected with ``reason`` (no charges)."""
    return ResultRecord(
        event_id=record.event_id,
        outcome="rejected",
        fingerprint=record.fingerprint,
        occurred_at_us=record.occurred_at_us,
        decided_at_us=now_us,
        denied_by=(),
        reason=reason,
        charges=[],
        metadata=record.metadata,
    )
