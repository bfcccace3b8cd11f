"""Results: the engine's answers as decisions, and stored results and
rejected input as operators and workers read them. `Decisions` is what
`Meter.apply` returns: a read-only sequence that makes each event's
`Decision` when it is first read, or while the batch's write was on its
way to the database (`Early`). `stored_results` gives the ledger's rows
with their fingerprints, so a repeated event id is told apart from a
conflicting one before it is queued again."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from metering.domain.bounds import validate_count
from metering.domain.decisions import Decision
from metering.domain.events import Rejected, validate_event_id
from metering.engine.answers import CONFLICT, DUPLICATE, Answer
from metering.engine.reference import Decided, decision_of, decisions_of
from metering.errors import EventConflict
from metering.storage.database import Database
from metering.storage.store import Store


def decided(database: Database, event_ids: Iterable[str]) -> set[str]:
    """Which of these event ids have a stored result."""
    wanted = list(event_ids)
    return database.read(lambda c: Store(c).decided_ids(wanted))


def outcome_counts(database: Database) -> dict[str, int]:
    """How many results there are of each outcome."""
    return database.read(lambda c: Store(c).outcome_counts())


def count_results(database: Database) -> int:
    return database.read(lambda c: Store(c).count_results())


def result(database: Database, event_id: str) -> Decision | None:
    """The stored result of an event, or None if it has not been decided."""
    validate_event_id(event_id)
    found = database.read(lambda c: Store(c).fetch_results([event_id]))
    if event_id not in found:
        return None
    return decision_of(found[event_id], duplicate=False)


def rejected_messages(database: Database, count: int) -> list[Rejected]:
    """The ``count`` newest pieces of queued input that could not be applied."""
    validate_count("count", count)
    return database.read(lambda c: Store(c).list_rejected_messages(count))


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


class Decisions(Sequence[Decided]):
    """A batch's decisions in event order, as `Meter.apply` returns them.

    Each is made from the engine's answer when first read, then kept (read
    again, it is the same object): a caller that only counts, or reads a
    few, does not pay for the rest. It equals a list of the same decisions
    (as a list does: not a tuple); a slice is a list.
    """

    __slots__ = ("_answers", "_event_ids", "_made")

    def __init__(
        self,
        event_ids: Sequence[str],
        answers: Sequence[Answer],
        made: list[Decided] | None = None,
    ) -> None:
        if len(event_ids) != len(answers):
            raise ValueError("one answer per event")
        self._event_ids = event_ids
        self._answers = answers
        # None: none read yet; ``made``: every one made already, of ``answers``.
        self._made: list[Decided | None] | None = made  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self._answers)

    @overload
    def __getitem__(self, index: int) -> Decided: ...

    @overload
    def __getitem__(self, index: slice) -> list[Decided]: ...

    def __getitem__(self, index: int | slice) -> Decided | list[Decided]:
        if isinstance(index, slice):
            return [self[n] for n in range(*index.indices(len(self)))]
        made = self._made
        if made is None:
            made = self._made = [None] * len(self._answers)
        found = made[index]
        if found is None:
            if index < 0:
                index += len(made)
            found = made[index] = applied_of(self._event_ids[index], self._answers[index])
        return found

    def __iter__(self) -> Iterator[Decided]:
        return iter(self._all())

    def _all(self) -> list[Decided]:
        made, ids, answers = self._made, self._event_ids, self._answers
        if made is None:
            every = decisions_of(ids, answers)
            self._made = every  # type: ignore[assignment]  # a list of what it holds
            return every
        if None in made:
            for index, found in enumerate(made):
                if found is None:
                    made[index] = applied_of(ids[index], answers[index])
        return made  # type: ignore[return-value]  # every one is made

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Decisions):
            return self._all() == other._all()
        if isinstance(other, list):
            return self._all() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        return f"Decisions({self._all()!r})"


class Early:
    """A batch's decisions made early: while its write is on its way to the
    database (`metering.engine.answers.Batch.meanwhile`: PostgreSQL), for
    `Meter.apply`, whose caller reads them, as a rule."""

    __slots__ = ("_answers", "_event_ids", "_made")

    def __init__(self, event_ids: Sequence[str]) -> None:
        self._event_ids = event_ids
        self._answers: list[Answer] | None = None
        self._made: list[Decided] | None = None

    def make(self, answers: list[Answer]) -> None:
        """Every decision of ``answers`` (made again if the batch is written again)."""
        self._answers = answers
        self._made = decisions_of(self._event_ids, answers)

    def decisions(self, answers: list[Answer]) -> Decisions:
        """The batch's `Decisions`: those made early if they were made of ``answers``."""
        made = self._made if answers is self._answers else None
        return Decisions(self._event_ids, answers, made)


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
    found = database.read(lambda c: Store(c).fetch_results(wanted))
    return {
        event_id: StoredResult(record.fingerprint, decision_of(record, duplicate=True))
        for event_id, record in found.items()
    }
