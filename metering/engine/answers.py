"""What a decision path is given and what it answers.

A `Batch` is events to apply in order, in one transaction, with how they
are applied (a reservation's `Hold`, an import's policy, dead letters). A
path answers one `Answer` per event, or `Declined`: a returned value,
naming the need the batch turned out to have, after which the engine gives
the batch to the next path that implements it (`metering.engine.paths`).
A decline comes before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

from metering.domain.events import EventRecord, Rejected
from metering.domain.imports import ImportPolicy
from metering.domain.needs import Need
from metering.errors import MeteringError
from metering.storage.results import ResultRecord

InvalidPolicy = Literal["raise", "reject"]

AnswerKind = Literal["new", "duplicate", "conflict"]
NEW: Final = "new"
DUPLICATE: Final = "duplicate"
CONFLICT: Final = "conflict"


@dataclass(frozen=True, slots=True)
class Answer:
    """One event's answer: ``NEW`` with the result just written, ``DUPLICATE``
    with the stored result of the same event decided before, or ``CONFLICT``
    (its id was decided for another event: no record)."""

    kind: AnswerKind
    record: ResultRecord | None = None


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep a held reservation's row with the event when it is allowed
    (`metering.reservations.transactions`): for ``ttl_us`` from the decision, or until
    ``until_us`` (a lease's block, at least 1 µs from now). A block that
    does not fit (``block``) is no event: `NotHeld` is raised before
    anything is written, and the transaction rolls back."""

    ttl_us: int = 0
    until_us: int | None = None
    block: bool = False

    def expires_at_us(self, now_us: int) -> int:
        if self.until_us is not None:
            return max(self.until_us, now_us + 1)
        return now_us + self.ttl_us


@dataclass(frozen=True, slots=True)
class Batch:
    """Events to apply in order in one transaction, decided at ``now_us``.

    ``invalid="raise"`` raises the first unacceptable event's error
    (`Unacceptable`); ``"reject"`` stores it as a rejected result.
    ``lookup_first``: look every id up before deciding (else a repeated id
    fails the results insert and the transaction runs again, looking up).
    ``rejected``: malformed input kept as dead letters in the same
    transaction; ``hold``: keep a reservation; ``policy``: an import's flags.
    ``meanwhile``: given the answers once their write is sent, work to do
    while the database writes them (a store with a round trip to wait for
    calls it: PostgreSQL); called again if the transaction runs again, or
    never: the answers returned are those of its last call only if they are
    the same list.
    """

    records: Sequence[EventRecord]
    now_us: int
    invalid: InvalidPolicy = "reject"
    rejected: Sequence[Rejected] = ()
    hold: Hold | None = None
    policy: ImportPolicy | None = None
    lookup_first: bool = False
    meanwhile: Callable[[list[Answer]], None] | None = None

    def looking_up(self) -> Batch:
        return self if self.lookup_first else replace(self, lookup_first=True)


@dataclass(frozen=True, slots=True)
class Declined:
    """A path leaves the batch to the next: it has ``need``, which the path
    does not implement, or (``stale``) the cached limits are older than the
    database's: reload them and ask the same path again. Nothing was written."""

    reason: str
    need: Need | None = None
    stale: bool = False


class NotHeld(Exception):
    """A lease's block was denied: nothing is recorded (see `Hold`)."""


class Unacceptable(Exception):
    """With ``invalid="raise"``: the event at ``index`` cannot be applied, for ``error``."""

    def __init__(self, index: int, error: MeteringError) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error
