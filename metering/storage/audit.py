"""The audit's SQL (`metering.upkeep.audit`; the rules: `metering.domain.audit`).

`AuditStore` reads the ledger from an instant on (results by ``decided_at_us``, voids by
``created_at_us``, give-backs by ``settled_at_us``, resets by ``reset_at_us``: each by an
index, or a table kept small by retention), the counters, grants and draws of given windows,
the rollup rows and the voids, settles and limits' definitions they are judged by, what
is left unresolved past a bound, and keeps the audit's own state
(``audit_marks``, ``audit_windows``, ``audit_runs``), and the seats held. `begin_snapshot`
makes every read of one PostgreSQL transaction see one instant, so a
counter and its results are read as they were committed together.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from sqlalchemy import delete, exists, func, select, tuple_

from metering.domain.audit import Invariant, Violation, WindowKey, WindowLedger
from metering.domain.events import FUTURE_TOLERANCE_US
from metering.domain.instants import from_us
from metering.domain.licenses import CheckoutState
from metering.domain.notifications import DeliveryStatus
from metering.domain.reservations import ReservationState
from metering.domain.rollups import RollupKey
from metering.domain.state import NO_WINDOW
from metering.storage.on_connection import OnConnection, chunks
from metering.storage.tables import (
    audit_marks,
    audit_runs,
    audit_windows,
    checkouts,
    corrections,
    counter_resets,
    counters,
    distinct_values,
    grants,
    overdrafts,
    reservations,
    results,
    usage_rollup_deltas,
    usage_rollups,
    webhook_deliveries,
    webhook_endpoints,
)
from metering.storage.webhook_records import encode_payload
from metering.storage.webhooks import WebhookStore

CHECKED_TO: Final = "checked_to"
RESULTS_PRUNED_BEFORE: Final = "results_pruned_before"
RUNS_KEPT: Final = 50
STREAM_BATCH: Final = 2000
# Row values per IN list: three columns each, well under SQLite's bound.
KEY_CHUNK: Final = 300
# (event id, outcome, decided_at_us, reset tick, charges as JSON, occurred_at_us,
# metadata as JSON: None unless asked for).
ResultRow = tuple[str, str, int, int, str, int, str | None]
# A reservation a cancel or a commit settled: (id, held charges, given back, both
# as JSON: the latter None when nothing went back, settled_at_us).
SettledRow = tuple[str, str, str | None, int]


def _window_in(table: Any, keys: Sequence[WindowKey]) -> Any:
    c = table.c
    return tuple_(c.subject, c.limit_name, c.window_start_us).in_(keys)


class AuditStore(OnConnection):
    """The audit's queries on one connection; the caller owns the transaction."""

    def begin_snapshot(self) -> None:
        """On PostgreSQL, the first statement of the transaction: one snapshot for every read."""
        if self._postgres:
            self.connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    # -- marks ---------------------------------------------------------------------

    def mark(self, name: str) -> int | None:
        query = select(audit_marks.c.at_us).where(audit_marks.c.name == name)
        found = self.connection.execute(query).scalar()
        return None if found is None else int(found)

    def set_mark(self, name: str, at_us: int) -> None:
        self._upsert(audit_marks, {"name": name, "at_us": at_us}, ["name"])

    # -- the ledger since an instant ----------------------------------------------

    def results_since(self, after_us: int | None, *, metadata: bool = False) -> Iterator[ResultRow]:
        """Every result decided after ``after_us`` (None: every one), streamed
        (``metadata``: with it)."""
        r = results.c
        columns = [r.event_id, r.outcome, r.decided_at_us, r.reset_tick, r.charges]
        columns.append(r.occurred_at_us)
        query = select(*columns, *([r.metadata] if metadata else []))
        if after_us is not None:
            query = query.where(r.decided_at_us > after_us)
        query = query.execution_options(stream_results=True, yield_per=STREAM_BATCH)
        for row in self.connection.execute(query):
            text = row[6] if metadata else None
            yield (row[0], row[1], int(row[2]), int(row[3]), row[4], int(row[5]), text)

    def resets_since(self, after_us: int | None) -> list[tuple[WindowKey, int, int]]:
        """Resets of one counter each after ``after_us``: (window, tick, reset_at_us)."""
        c = counter_resets.c
        query = select(c.subject, c.limit_name, c.window_start_us, c.tick, c.reset_at_us).where(
            c.tick.is_not(None), c.window_start_us.is_not(None), c.subject.is_not(None)
        )
        if after_us is not None:
            query = query.where(c.reset_at_us > after_us)
        return [((s, lim, int(w)), int(t), int(at)) for s, lim, w, t, at in self._rows(query)]

    def voids_since(self, after_us: int | None) -> list[tuple[WindowKey, int, int]]:
        """What voids after ``after_us`` reversed: (window, units, created_at_us)."""
        c = corrections.c
        query = select(c.charges, c.created_at_us)
        if after_us is not None:
            query = query.where(c.created_at_us > after_us)
        found = []
        for text, at_us in self._rows(query):
            for subject, limit, cost, start, *_ in json.loads(text):
                if start:
                    found.append(((str(subject), str(limit), int(start)), int(cost), int(at_us)))
        return found

    def give_backs_since(self, after_us: int | None) -> list[tuple[WindowKey, int, int]]:
        """What cancels (and settling commits) after ``after_us`` gave back
        to the counters: (window, units, settled_at_us). A void's give-back is
        its correction's; what a commit of less released of a charge a reset
        dropped from the hold went off the rollups alone."""
        c = reservations.c
        query = select(c.given_back, c.charges, c.settled_at_us).where(
            c.given_back.is_not(None), c.settled_by != "void"
        )
        if after_us is not None:
            query = query.where(c.settled_at_us > after_us)
        found = []
        for text, held, at_us in self._rows(query):
            holds = {(str(row[0]), str(row[1]), int(row[3])) for row in json.loads(held)}
            for subject, limit, start, units in json.loads(text):
                window = (str(subject), str(limit), int(start))
                if start and units and window in holds:
                    found.append((window, int(units), int(at_us)))
        return found

    def commits_since(self, after_us: int) -> list[tuple[str, str, int]]:
        """Reservations committed after ``after_us`` whose result was decided
        before (a commit of more than was reserved, or of fewer priced units,
        rewrote it): (result charges, held charges, both as JSON, settled_at_us)."""
        c, r = reservations.c, results.c
        query = (
            select(r.charges, c.charges, c.settled_at_us)
            .select_from(reservations)
            .join(results, r.event_id == c.id)
            .where(
                c.settled_at_us > after_us,
                c.state == ReservationState.COMMITTED.value,
                r.decided_at_us <= after_us,
            )
        )
        return [(charged, held, int(at_us)) for charged, held, at_us in self._rows(query)]

    def commits_of_results_since(self, after_us: int | None) -> list[tuple[str, str, int, int]]:
        """Reservations committed whose result was decided after ``after_us``
        (None: every one): (result charges, held charges, settled_at_us, the
        result's reset tick). A reset between the hold and a commit of more
        clears the result, not the units the commit added after it."""
        c, r = reservations.c, results.c
        query = (
            select(r.charges, c.charges, c.settled_at_us, r.reset_tick)
            .select_from(reservations)
            .join(results, r.event_id == c.id)
            .where(c.state == ReservationState.COMMITTED.value)
        )
        if after_us is not None:  # (settled after its result: in the span too)
            query = query.where(c.settled_at_us > after_us, r.decided_at_us > after_us)
        return [
            (charged, held, int(at_us), int(tick))
            for charged, held, at_us, tick in self._rows(query)
        ]

    # -- what the rollups are judged by -------------------------------------------

    def voided(self) -> dict[str, int]:
        """Every voided event: its correction's ``created_at_us``."""
        c = corrections.c
        return {
            event_id: int(at) for event_id, at in self._rows(select(c.event_id, c.created_at_us))
        }

    def settled(self) -> list[SettledRow]:
        """Every reservation a cancel or a commit settled (not the sweeper, nor a void)."""
        c = reservations.c
        query = select(c.id, c.charges, c.given_back, c.settled_at_us).where(
            c.settled_by.in_(("cancel", "commit")),
            c.state != ReservationState.HELD.value,
        )
        return [(i, held, back, int(at)) for i, held, back, at in self._rows(query)]

    def whole_from_us(self) -> int | None:
        """The first instant whose windows and hours kept their whole ledger
        (retention pruned the results before it; None: it pruned none)."""
        pruned_us = self.mark(RESULTS_PRUNED_BEFORE)
        return None if pruned_us is None else pruned_us + FUTURE_TOLERANCE_US

    def rollups(self, from_hour_us: int | None) -> dict[RollupKey, list[int]]:
        """Every rollup row's [used, events], its appended deltas added in, of
        the hours from ``from_hour_us`` on (None: all). The rows have a key
        each: read as they are; the deltas (a minute's, till beat folds them
        in) summed here."""
        found: dict[RollupKey, list[int]] = {}
        for table in (usage_rollups, usage_rollup_deltas):
            r = table.c
            key = (r.subject, r.limit_name, r.dimension, r.hour_start_us, r.value)
            query = select(*key, r.used, r.events)
            if from_hour_us is not None:
                query = query.where(r.hour_start_us >= from_hour_us)
            for s, lim, d, h, v, used, events in self.connection.execute(query):
                row = found.setdefault((s, lim, d, int(h), v), [0, 0])
                row[0] += int(used)
                row[1] += int(events)
        return found

    # -- windows -------------------------------------------------------------------

    def ledgers(self, keys: Sequence[WindowKey] | None) -> dict[WindowKey, WindowLedger]:
        """What earlier runs found of ``keys`` (None: every window)."""
        a = audit_windows.c
        query = select(a.subject, a.limit_name, a.window_start_us, a.used, a.maximum)
        return {
            (s, lim, int(w)): WindowLedger(int(u), int(m))
            for s, lim, w, u, m in self._by_keys(query, audit_windows, keys)
        }

    def save_ledgers(self, found: Mapping[WindowKey, WindowLedger], *, replace: bool) -> None:
        """Keep ``found`` for the next run (``replace``: instead of every window kept)."""
        if replace:
            self.connection.execute(delete(audit_windows))
        keys = sorted(found)
        for chunk in chunks(keys, KEY_CHUNK):
            if not replace:
                self.connection.execute(
                    delete(audit_windows).where(_window_in(audit_windows, chunk))
                )
            rows = [
                {"subject": s, "limit_name": lim, "window_start_us": w}
                | {"used": found[(s, lim, w)].used, "maximum": found[(s, lim, w)].maximum}
                for s, lim, w in chunk
            ]
            self.connection.execute(audit_windows.insert(), rows)

    def counters_of(self, keys: Sequence[WindowKey] | None) -> dict[WindowKey, int]:
        """``used`` of the windowed counters of ``keys`` (None: every one)."""
        c = counters.c
        query = select(c.subject, c.limit_name, c.window_start_us, c.used).where(
            c.window_start_us != NO_WINDOW
        )
        return {(s, lim, int(w)): int(u) for s, lim, w, u in self._by_keys(query, counters, keys)}

    def window_ends(self, keys: Sequence[WindowKey]) -> dict[WindowKey, int]:
        """When each window of ``keys`` that has a counter ends."""
        c = counters.c
        query = select(c.subject, c.limit_name, c.window_start_us, c.window_end_us)
        return {(s, lim, int(w)): int(e) for s, lim, w, e in self._by_keys(query, counters, keys)}

    def drawn(self, keys: Sequence[WindowKey]) -> dict[WindowKey, int]:
        """What each window of ``keys`` drew on grants."""
        c = counters.c
        query = select(c.subject, c.limit_name, c.window_start_us, c.granted).where(c.granted != 0)
        return {(s, lim, int(w)): int(n) for s, lim, w, n in self._by_keys(query, counters, keys)}

    def overdrawn(self, keys: Sequence[WindowKey]) -> dict[WindowKey, int]:
        """The overdraft commits recorded in each window of ``keys``."""
        o = overdrafts.c
        query = select(o.subject, o.limit_name, o.window_start_us, func.sum(o.units)).group_by(
            o.subject, o.limit_name, o.window_start_us
        )
        return {(s, lim, int(w)): int(n) for s, lim, w, n in self._by_keys(query, overdrafts, keys)}

    def seats_held(self, keys: Sequence[WindowKey]) -> dict[WindowKey, set[str]]:
        """The values holding a seat (``live_events > 0``) in each window of ``keys``
        that has one: by the windows, a prefix of the table's key."""
        d = distinct_values.c
        query = select(d.subject, d.limit_name, d.window_start_us, d.value).where(d.live_events > 0)
        found: dict[WindowKey, set[str]] = {}
        for s, lim, w, value in self._by_keys(query, distinct_values, keys):
            found.setdefault((s, lim, int(w)), set()).add(value)
        return found

    def unvoided_metadata(self, event_ids: Iterable[str]) -> dict[str, str | None]:
        """The metadata (JSON) of those of ``event_ids`` whose result no void corrected."""
        r = results.c
        voided = exists().where(corrections.c.event_id == r.event_id)
        found: dict[str, str | None] = {}
        for chunk in chunks(sorted(set(event_ids)), KEY_CHUNK):
            query = select(r.event_id, r.metadata).where(r.event_id.in_(chunk), ~voided)
            found.update((event_id, text) for event_id, text in self._rows(query))
        return found

    def _by_keys(self, query: Any, table: Any, keys: Sequence[WindowKey] | None) -> list[Any]:
        if keys is None:
            return self._rows(query)
        found: list[Any] = []
        for chunk in chunks(sorted(keys), KEY_CHUNK):
            found.extend(self._rows(query.where(_window_in(table, chunk))))
        return found

    def _rows(self, query: Any) -> list[Any]:
        return list(self.connection.execute(query))

    # -- grants and what is left unresolved ----------------------------------------

    def grant_balances(
        self, pairs: Iterable[tuple[str, str]] | None
    ) -> list[tuple[str, str, str, int, int, int]]:
        """(grant id, subject, limit, amount, used, drawn) of the grants of
        ``pairs`` (None: every grant). The windows keep what they drew on their
        pair's grants together (``counters.granted``), not grant by grant: a
        grant's ``drawn`` is what its pair's windows still hold drawn less the
        other grants' ``used``, so that it passes ``used`` only when the pair's
        windows hold more than its grants' ``used`` together."""
        g, c = grants.c, counters.c
        g2 = grants.alias("g2")
        held = (
            select(func.coalesce(func.sum(c.granted), 0))
            .where(c.subject == g.subject, c.limit_name == g.limit_name)
            .scalar_subquery()
        )
        others = (
            select(func.coalesce(func.sum(g2.c.used), 0))
            .where(
                g2.c.subject == g.subject,
                g2.c.limit_name == g.limit_name,
                g2.c.grant_id != g.grant_id,
            )
            .scalar_subquery()
        )
        query = select(g.grant_id, g.subject, g.limit_name, g.amount, g.used, held - others)
        if pairs is None:
            rows = self._rows(query)
        else:
            rows = []
            for chunk in chunks(sorted(set(pairs)), KEY_CHUNK):
                rows.extend(self._rows(query.where(tuple_(g.subject, g.limit_name).in_(chunk))))
        return [(i, s, lim, int(a), int(u), int(n)) for i, s, lim, a, u, n in rows]

    def orphans_since(self, after_us: int | None) -> list[Violation]:
        """Reservations, voids and overdrafts (made after ``after_us``) whose
        event has no result."""
        found = []
        for table, column, at in (
            (reservations, reservations.c.id, reservations.c.created_at_us),
            (corrections, corrections.c.event_id, corrections.c.created_at_us),
            (overdrafts, overdrafts.c.event_id, overdrafts.c.created_at_us),
        ):
            # NOT EXISTS: an anti-join on the results' key, never a scan of them.
            has_result = exists().where(results.c.event_id == column)
            query = select(column).distinct().where(~has_result)
            if after_us is not None:
                query = query.where(at > after_us)
            for (event_id,) in self._rows(query):
                found.append(
                    Violation(
                        Invariant.ONE_RESULT,
                        expected=f"a result for the {table.name} row's event",
                        found="no result",
                        item=event_id,
                    )
                )
        return found

    def unresolved(self, expired_before_us: int) -> list[Violation]:
        """Reservations and checkouts still held that expired before ``expired_before_us``."""
        found = []
        r, c = reservations.c, checkouts.c
        held = select(r.id, r.expires_at_us).where(
            r.state == ReservationState.HELD.value, r.expires_at_us < expired_before_us
        )
        for item, expires in self._rows(held):
            found.append(_unresolved(Invariant.RESERVATION_UNRESOLVED, None, None, item, expires))
        out = select(c.id, c.subject, c.limit_name, c.expires_at_us).where(
            c.state == CheckoutState.HELD.value, c.expires_at_us < expired_before_us
        )
        for item, subject, limit, expires in self._rows(out):
            found.append(_unresolved(Invariant.CHECKOUT_UNRESOLVED, subject, limit, item, expires))
        return found

    def stuck_deliveries(self, due_before_us: int) -> list[Violation]:
        """Pending deliveries to enabled endpoints due before ``due_before_us``."""
        d, e = webhook_deliveries.c, webhook_endpoints.c
        query = (
            select(d.id, d.next_attempt_at_us)
            .join(webhook_endpoints, e.id == d.endpoint_id)
            .where(
                d.status == DeliveryStatus.PENDING.value,
                d.next_attempt_at_us < due_before_us,
                e.enabled.is_(True),
            )
        )
        return [
            Violation(
                Invariant.DELIVERY_STUCK,
                expected=f"attempted by {_iso(due_before_us)}",
                found=f"pending, due {_iso(due)}",
                item=str(item),
            )
            for item, due in self._rows(query)
        ]

    # -- runs ----------------------------------------------------------------------

    def record_run(
        self,
        ran_at_us: int,
        checked: tuple[int | None, int],
        *,
        full: bool,
        windows: int,
        violations: Sequence[Violation],
    ) -> None:
        """Keep a run (and the latest `RUNS_KEPT`)."""
        self.connection.execute(
            audit_runs.insert().values(
                ran_at_us=ran_at_us,
                checked_from_us=checked[0],
                checked_to_us=checked[1],
                full=full,
                windows=windows,
                violations=json.dumps([v.to_dict() for v in violations]),
            )
        )
        a = audit_runs.c
        kept = select(a.id).order_by(a.id.desc()).limit(RUNS_KEPT)
        self.connection.execute(delete(audit_runs).where(a.id.not_in(kept.scalar_subquery())))

    def last_run(self) -> dict[str, Any] | None:
        """The latest run: its columns, ``violations`` decoded."""
        query = select(audit_runs).order_by(audit_runs.c.id.desc()).limit(1)
        row = self.connection.execute(query).first()
        if row is None:
            return None
        found = dict(row._mapping)
        found["violations"] = json.loads(found["violations"])
        return found

    def announce(self, document: dict[str, Any], now_us: int) -> None:
        """An ``audit.violation`` message to every endpoint that wants it."""
        webhooks = WebhookStore(self.connection)
        endpoints = webhooks.list_endpoints(enabled_only=True)
        webhooks.add_message("audit.violation", encode_payload(document), endpoints, now_us)


def _unresolved(
    invariant: Invariant, subject: str | None, limit: str | None, item: str, expires_us: int
) -> Violation:
    return Violation(
        invariant,
        subject,
        limit,
        expected=f"settled after its expiry at {_iso(expires_us)}",
        found="still held",
        item=item,
    )


def _iso(us: int) -> str:
    return from_us(us).isoformat()
