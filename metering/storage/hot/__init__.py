"""The hot path's storage contract: one read and one write per transaction.

The fast path (`metering.engine.fast`) decides events between the two calls
of a `HotStore`:

* `HotStore.read` locks and returns what the decisions need: the limits'
  version, stored results of the batch's ids (when asked), the current
  first-use windows, the counters that exist, and the live events of the
  seat values asked for (`metering.domain.distinct`). On PostgreSQL it is
  one round trip.
* `HotStore.write` stores what changed: counters updated and created,
  first-use windows moved, the results rows, and what the batch adds to the
  usage rollups (limits with dimensions only), the live events the batch
  adds to seat values (``seats``), and the rows of reservations
  held with their events (``holds``). On PostgreSQL it is one
  round trip, and it carries the COMMIT when nothing else follows.

This package holds the contract (here) and its implementations:

* `postgres`: `PostgresHotStore` (and ``read_unlocked`` for ``check``);
* `sqlite`: `SqliteHotStore`, and `DirectSqlite`, which gives the store a
  stdlib ``sqlite3`` connection of its own in a ``BEGIN IMMEDIATE``
  transaction (and ``sqlite_read_unlocked`` for ``check``, in a read
  transaction); `sqlite_grants`: its statements of grants and recurring grants;
* `direct_postgres`: `DirectPostgres`, the pool of psycopg connections the
  PostgreSQL store runs on without SQLAlchemy;
* `one_trip`: a single event in one round trip on PostgreSQL
  (``metering_consume_one``);
* `pick`: `hot_store`, the store for a SQLAlchemy connection's transaction;
* `statements`: the statements the PostgreSQL and SQLite stores share but
  for the driver's placeholder;
* `extras`: breakers, notices and ``grant.low``, read and written with the rest.

The common case runs without SQLAlchemy, on `DirectSqlite` or
`DirectPostgres`, notices, forecasts and breakers included; what is rare
there (dead letters on SQLite) the engine's path declines, and the next
path writes it on a SQLAlchemy connection (`metering.engine.paths`).

Lock order, as in the general engine (`Store`): a settle locks its
reservation row (`HotStore.lock_reservation`) before anything else; then
first-use window rows sorted
by (limit, subject), then counters sorted by (limit, subject, window start),
in one statement each. Rows that do not exist yet are created by `write`.
Seat values' rows are read and written only under their window's counter
lock, as `metering.storage.distinct` orders them. The batch's rollups come last,
appended: they lock no row (`metering.storage.rollups`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol

from metering.domain.breaker import Breaker
from metering.domain.distinct import SeatKey, Seen
from metering.domain.events import Rejected
from metering.domain.grants import Pot
from metering.domain.notifications import Notice
from metering.domain.recurring import Issue
from metering.domain.rollups import Delta, RollupKey
from metering.domain.rules import Key, State
from metering.domain.windows import Window
from metering.storage.allowances import DrawKey
from metering.storage.counters import Pair
from metering.storage.recurring import LastIssue, ScheduleRecord
from metering.storage.reservations import HoldRow, ReservationRecord, SettleRow
from metering.storage.results import ResultRecord

# A counter the hot path needs: (limit, subject, window start, window end).
WantedKey = tuple[str, str, int, int]
# A seat value the hot path needs: (limit, subject, window start, value);
# the start None is the pair's current first-use window (none: nothing read).
WantedSeat = tuple[str, str, int | None, str]


# `ReadRequest.grants_since_us` when no instant bounds it: every grant not
# used up is read.
ALL_GRANTS: Final = -(2**62)


class ReadRequest(NamedTuple):
    """What a batch asks `HotStore.read` to lock and read (a check, to read
    without a lock: `metering.storage.hot.postgres.read_unlocked`), made once.

    ``pairs`` (sorted) are first-use windows, whose current counters are read
    too; ``keys`` (sorted) the other counters. Results are looked up only when
    ``ids`` is given. The live events of ``seats`` are read after the counters
    are locked (their lock serialises every writer of them,
    `metering.storage.distinct`). The grants of ``grant_pairs`` are read after
    the counters are locked: on PostgreSQL without a lock of their own, and
    `HotStore.write` then fails with `RetryTransaction` if another transaction
    spent what a draw counted on (the grants' check constraint). The recurring
    grants of ``due_pairs`` (sorted; the cache has an issue due) are locked
    first of all (the general engine's order: schedules, windows, counters,
    grants), every one of those pairs, with their last issues. The breakers of
    ``breaker_pairs`` (sorted) are locked after the counters, with the breaker
    links' secret read (`metering.storage.hot.extras`). Of the grants, only
    those not used up and not expired at ``grants_since_us`` are read (the
    earliest instant the decisions count grants at): every pair of
    ``grant_pairs`` has a pot, empty when none is left, with what its windows
    drew.
    """

    ids: Sequence[str] | None
    pairs: Sequence[Pair]
    keys: Sequence[WantedKey]
    grant_pairs: Sequence[Pair] = ()
    seats: Sequence[WantedSeat] = ()
    due_pairs: Sequence[Pair] = ()
    breaker_pairs: Sequence[Pair] = ()
    grants_since_us: int = ALL_GRANTS


@dataclass(slots=True)
class Snapshot:
    """What `HotStore.read` found, under lock.

    ``windows`` holds each pair asked for that has a row in ``current_windows``
    (None: its row holds no window); a pair with no row is absent, on every
    store, so the pairs present are those a moved window updates.
    """

    version: int
    stored: dict[str, ResultRecord]
    windows: dict[Pair, Window | None]
    states: dict[Key, State]
    # The grants of the pairs asked for, with what each of their windows drew.
    pots: dict[Pair, Pot] = field(default_factory=dict)
    # The live events of the seat values asked for that have a row.
    seen: Seen = field(default_factory=dict)
    # Of those grants, each that may still announce ``grant.low``: its
    # threshold, and its ``used`` as read (`Changes.expected`).
    watched: dict[str, tuple[int, int]] = field(default_factory=dict)
    # The recurring grants of the ``due_pairs`` asked for (due or not: those
    # not due tell the cache their next issue), locked, each with its last
    # issue (`metering.storage.recurring.issues_of`).
    schedules: list[tuple[ScheduleRecord, LastIssue | None]] = field(default_factory=list)
    # Each counter's rate and its instant as read (`metering.domain.forecast`),
    # for the forecasts of what the batch writes; none from cached rows.
    rates: dict[Key, tuple[float, int]] = field(default_factory=dict)
    # The breakers of the ``breaker_pairs`` asked for that have a row, locked,
    # and the breaker links' secret (None: none made yet).
    breakers: dict[Pair, Breaker] = field(default_factory=dict)
    secret: str | None = None
    # The seat windows' stamps of the counters read that have one
    # (`metering.engine.seats.HeldCache`); none from a store that keeps none.
    stamps: dict[Key, int] = field(default_factory=dict)


@dataclass(slots=True)
class Changes:
    """What `HotStore.write` stores, each list sorted by key.

    ``created`` counters carry their window end and billing month
    (`metering.domain.zones.billing_month`; None for a token bucket). First-use windows are
    ``new_windows`` when their pair had no row, else ``moved_windows``.
    ``rollups`` are added to the usage rollups (empty: no statement).
    """

    updated: list[tuple[Key, State]] = field(default_factory=list)
    created: list[tuple[Key, int, State, str | None]] = field(default_factory=list)
    new_windows: list[tuple[Pair, Window]] = field(default_factory=list)
    moved_windows: list[tuple[Pair, Window]] = field(default_factory=list)
    results: list[ResultRecord] = field(default_factory=list)
    # What the batch drew on grants: (limit, subject, window start, grant id) -> amount.
    draws: dict[DrawKey, int] = field(default_factory=dict)
    # The ``used`` read of drawn grants that may announce ``grant.low``: a
    # grant drawn on meanwhile by another transaction fails the write with
    # `RetryTransaction` (PostgreSQL reads grants without a lock), so that
    # what crossed the threshold is decided on what is stored.
    expected: dict[str, int] = field(default_factory=dict)
    # Recurring grants' issues made (each schedule with its issues, in order):
    # inserted before the draws, the schedules moved on, the limits' version bumped.
    issues: list[tuple[ScheduleRecord, list[Issue]]] = field(default_factory=list)
    rollups: dict[RollupKey, Delta] = field(default_factory=dict)
    # Live events added to seat values (all positive: the hot path only consumes).
    seats: dict[SeatKey, int] = field(default_factory=dict)
    # Dead letters (input that could not be applied), for a store whose
    # ``takes_rejected`` is true; the caller records them otherwise.
    rejected: list[Rejected] = field(default_factory=list)
    # Held reservations to insert with their events' results
    # (`metering.storage.reservations.hold_row`): `Meter.reserve` and leases.
    holds: list[HoldRow] = field(default_factory=list)
    # Reservations settled (`metering.storage.reservations.settle_row`):
    # `metering.reservations.transactions`'s cancel and commit, leases settling.
    settled: list[SettleRow] = field(default_factory=list)
    # Breakers the batch stepped (`metering.engine.breakers`).
    breakers: dict[Pair, Breaker] = field(default_factory=dict)
    # The breaker links' secret when this write makes it (none was read).
    secret: str | None = None
    # Grants whose draws may have left them low: ``grant.low`` for those
    # at or below their threshold, not announced yet.
    low: list[str] = field(default_factory=list)
    # Notices with their payloads (`encode_payload`), recorded once per mark
    # (`metering.storage.webhooks.WebhookStore.record_notices`).
    notices: list[tuple[Notice, str]] = field(default_factory=list)


class HotStore(Protocol):
    # True when `write` keeps ``changes.rejected`` (the dead letters) itself.
    takes_rejected: bool
    # True when `read` locks and reads the counters' stamps (``Snapshot.stamps``)
    # and `read_seats` may follow it.
    keeps_stamps: bool
    # True when `read` reads one seat value in the statement of its first
    # counter (SQLite, in process): `HeldCache` is asked for that value alone
    # (`HeldCache.settle_one`).
    folds_one_seat: bool

    def read(self, request: ReadRequest) -> Snapshot:
        """Lock and read what ``request`` asks for (`ReadRequest`)."""
        ...

    def read_seats(self, seats: Sequence[WantedSeat]) -> Seen:
        """The live events of ``seats`` (each with its window start) that have a
        row, in `read`'s transaction, after it: seats a cache took as held
        whose window's stamp (``Snapshot.stamps``) was not the one it knew."""
        ...

    def read_held(self, keys: Sequence[Key]) -> dict[Key, set[str]]:
        """The values held in the seat windows of ``keys`` (counters `read`
        locked), in its transaction, by window (none: no value held)."""
        ...

    def looking_up(self, ids: Sequence[str] | None) -> AbstractContextManager[None]:
        """Around planning and `read`: a store may send the lookup of ``ids``
        (`read`'s `ReadRequest.ids`, in the same order) ahead, to run while
        the caller plans (PostgreSQL); one that does not does nothing."""
        ...

    def sending(
        self,
    ) -> AbstractContextManager[Callable[[Sequence[ResultRecord]], None] | None]:
        """Around deciding and `write`, after `read`: a store may yield a
        function that sends the results of events decided, sorted by id
        (their insert, as `write`'s) while the rest are, and roll back what it sent when the
        block ends in anything but `write` (PostgreSQL); one that does not
        yields None."""
        ...

    def lock_reservation(self, reservation_id: str) -> ReservationRecord | None:
        """Lock and read one reservation's row (a settle: before any counter)."""
        ...

    def write(
        self,
        changes: Changes,
        now_us: int,
        *,
        commit: bool,
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        """Store ``changes``; with ``commit`` also commit the transaction.
        A store that waits for the server calls ``meanwhile`` once its
        statements are sent, before their replies (others need not).

        A store whose ``takes_rejected`` is true also keeps
        ``changes.rejected`` (the dead letters) in the same round trip; for
        any other, `metering.engine.fast` records them after `write`.
        Breakers, ``grant.low`` and notices are written last
        (`metering.storage.hot.extras`).

        An event id already in the results table fails the results key's
        unique constraint (the driver's integrity error: another transaction
        decided it first); the caller rolls back and decides it again, as a
        repeated id.
        """
        ...
