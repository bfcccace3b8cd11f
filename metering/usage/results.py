"""Results: the engine's answers as decisions, and stored results and
rejected input as operators and workers read them. `stored_results` gives the
ledger's rows with their fingerprints, so a repeated event id is told apart
from a conflicting one before it is queued again."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from metering.domain.bounds import validate_count
from metering.domain.decisions import Decision
from metering.domain.events import Rejected, validate_event_id
from metering.engine.answers import CONFLICT, DUPLICATE, Answer
from metering.engine.reference import Decided, decision_of
from metering.errors import EventConflict
from metering.storage.database import Database
from metering.storage.store import Store


def decided(database: Database, event_ids: Iterable[str]) -> set[str]:
    """Which of these event ids have a stored result."""
    wanted = list(event_ids)
    return database.run(lambda c: Store(c).decided_ids(wanted))


def outcome_counts(database: Database) -> dict[str, int]:
    """How many results there are of each outcome."""
    return database.run(lambda c: Store(c).outcome_counts())


def count_results(database: Database) -> int:
    return database.run(lambda c: Store(c).count_results())


def result(database: Database, event_id: str) -> Decision | None:
    """The stored result of an event, or None if it has not been decided."""
    validate_event_id(event_id)
    found = database.run(lambda c: Store(c).fetch_results([event_id]))
    if event_id not in found:
        return None
    return decision_of(found[event_id], duplicate=False)


def rejected_messages(database: Database, count: int) -> list[Rejected]:
    """The ``count`` newest pieces of queued input that could not be applied."""
    validate_count("count", count)
    return database.run(lambda c: Store(c).list_rejected_messages(count))


def consumed(event_id: str, answer: Answer) -> Decision:
    """The decision of one consumed event; `EventConflict` for a reused id."""
    applied = applied_of(event_id, answer)
    if isinstance(applied, EventConflict):
        raise applied
    return applied


def applied_of(event_id: str, answer: Answer) -> Decided:
    """An engine's answer as `Meter.apply` returns it (a conflict is an `EventConflict`)."""
    record = answer.record
    if answer.kind == CONFLICT or record is None:
        return EventConflict(event_id)
    return decision_of(record, duplicate=answer.kind == DUPLICATE)


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A decided event: what identifies its charges, and its decision (a duplicate's)."""

    fingerprint: str
    decision: Decision


def stored_results(database: Database, event_ids: Iterable[str]) -> dict[str, StoredResult]:
    """The stored results of those of ``event_ids`` that were decided."""
    wanted = [validate_event_id(event_id) for event_id in event_ids]
    if not wanted:
        return {}
    found = database.run(lambda c: Store(c).fetch_results(wanted))
    return {
        event_id: StoredResult(record.fingerprint, decision_of(record, duplicate=True))
        for event_id, record in found.items()
    }
