"""Upkeep of the embedded broker (kombu's SQLAlchemy transport on SQLite; docs/pipeline.md).

That transport marks a message invisible when a worker takes it and keeps acknowledgements
in the worker's memory: alone, it never deletes a consumed message and loses those a killed
worker held. Applying a batch is idempotent, so `sweep_embedded_broker` fixes both: a taken
batch whose events all have results, or their dead letters, is deleted; one taken longer than
the visibility timeout that is not is made visible again (another task's message, which
leaves nothing to look for, is deleted then). Ages are in UTC on both
sides, whatever ``TZ`` each process has: `EmbeddedTransport` stamps a taken message with
the UTC time (kombu's own stamps local time), and the sweep compares it with its clock's now.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from queue import Empty
from typing import Any, Final

import kombu.transport.sqlalchemy
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from sqlalchemy import (
    delete,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from metering.pipeline.messages import decode_records
from metering.pipeline.routing import APPLY_BATCH_TASK
from metering.storage.connections import make_engine, translate
from metering.storage.kombu_tables import kombu_messages, task_body
from metering.storage.rejected import rejected_rows


def event_ids_of(payload_text: str) -> list[str] | None:
    """The event ids in a stored kombu message, or None if it cannot be read."""
    try:
        args = task_body(json.loads(payload_text))[0]
        return [str(event["id"]) for event in args[0]["events"]]
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def batch_outcome_of(payload_text: str) -> tuple[list[str], list[str]] | None:
    """What applying a stored ``metering.apply_batch`` message leaves: the ids
    of its events that get a result, and the digests of the dead letters of
    what cannot become an event (decoded as the worker decodes it). None for
    another task's message, or one the worker could not read as a task."""
    try:
        envelope = json.loads(payload_text)
        if envelope["headers"]["task"] != APPLY_BATCH_TASK:
            return None
        args, kwargs = task_body(envelope)[:2]
        # The task's own reading of its arguments (`workers.tasks.apply_batch_task`).
        payload = args[0] if len(args) == 1 and not kwargs else {"args": args, "kwargs": kwargs}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    events, malformed = decode_records(payload)
    return [e.event_id for e in events], [row[0] for row in rejected_rows(malformed, 0)]


def naive_utc(moment: datetime) -> datetime:
    """An aware ``moment`` as the naive UTC time kombu's ``timestamp`` column holds."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def sweep_embedded_broker(
    broker_url: str,
    decided: Callable[[Iterable[str]], set[str]],
    kept: Callable[[Iterable[str]], set[str]],
    *,
    now: datetime,
    visibility_timeout_seconds: float = 300,
) -> dict[str, int]:
    """Delete consumed messages and redeliver stale ones; returns counts.

    ``decided`` tells which event ids have results, ``kept`` which dead
    letters (by digest) are kept. ``now`` (aware) is compared in UTC with when
    each message was taken.
    """
    url = broker_url.split("+", 1)[1]
    engine = make_engine(url)
    deleted = restored = 0
    cutoff = naive_utc(now) - timedelta(seconds=visibility_timeout_seconds)
    try:
        with engine.begin() as connection:
            if not engine.dialect.has_table(connection, "kombu_message"):
                return {"deleted": 0, "restored": 0}
            taken = connection.execute(
                select(
                    kombu_messages.c.id, kombu_messages.c.timestamp, kombu_messages.c.payload
                ).where(kombu_messages.c.visible.is_(False))
            ).all()
            ids_of = {row.id: event_ids_of(row.payload) for row in taken}
            done = decided({e for ids in ids_of.values() if ids for e in ids})
            finished = [m for m, ids in ids_of.items() if ids is not None and set(ids) <= done]
            # The others are finished too when what they could not apply was kept.
            outcomes = {
                row.id: batch_outcome_of(row.payload) for row in taken if row.id not in finished
            }
            batches = {m: outcome for m, outcome in outcomes.items() if outcome is not None}
            more = {e for ids, _ in batches.values() for e in ids} - done
            done |= decided(more) if more else set()
            wanted = {d for _, digests in batches.values() for d in digests}
            letters = kept(wanted) if wanted else set()
            finished += [
                m
                for m, (ids, digests) in batches.items()
                if digests and set(ids) <= done and set(digests) <= letters
            ]
            stale = [
                row.id
                for row in taken
                if row.id not in finished and (row.timestamp is None or row.timestamp < cutoff)
            ]
            unreadable = [m for m in stale if ids_of[m] is None and m not in batches]
            redeliver = [m for m in stale if ids_of[m] is not None or m in batches]
            if finished or unreadable:
                gone = delete(kombu_messages).where(kombu_messages.c.id.in_(finished + unreadable))
                deleted = connection.execute(gone).rowcount
            if redeliver:
                back = (
                    update(kombu_messages)
                    .where(kombu_messages.c.id.in_(redeliver))
                    .values(visible=True)
                )
                restored = connection.execute(back).rowcount
    except SQLAlchemyError as exc:
        raise translate(exc) from exc
    finally:
        engine.dispose()
    return {"deleted": int(deleted), "restored": int(restored)}


# -- the transport ------------------------------------------------------------------


class _EmbeddedChannel(kombu.transport.sqlalchemy.Channel):
    """kombu's SQLAlchemy channel, safe when processes start together.

    On a new broker file every process creates kombu's tables and its queue
    rows as it comes up. kombu guards that with a lock of its own process
    only, so two workers started at the same moment both insert the
    ``metering`` queue row, and one died of the unique constraint.
    """

    def _open(self) -> Any:
        for attempt in range(_CREATE_ATTEMPTS):
            try:
                return super()._open()  # type: ignore[no-untyped-call]
            except OperationalError as exc:  # another process made the table first
                if "already exists" not in str(exc) or attempt == _CREATE_ATTEMPTS - 1:
                    raise
                time.sleep(0.05)
        raise AssertionError("unreachable")

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        # kombu's own, except the stamp: the UTC time, where kombu's column
        # stamps datetime.now(), this process's local time (see the module's
        # documentation).
        obj = self._get_or_create(queue)
        if self.session.bind.name == "sqlite":
            self.session.execute(text("BEGIN IMMEDIATE TRANSACTION"))
        try:
            message = (
                self.session.query(self.message_cls)
                .with_for_update()
                .filter(self.message_cls.queue_id == obj.id)
                .filter(self.message_cls.visible != False)  # noqa: E712 (SQL, not Python)
                .order_by(self.message_cls.sent_at)
                .order_by(self.message_cls.id)
                .limit(1)
                .first()
            )
            if message is None:
                raise Empty()
            message.visible = False
            message.sent_at = naive_utc(datetime.now(UTC))
            return loads(bytes_to_str(message.payload))  # type: ignore[no-untyped-call]
        finally:
            self.session.commit()

    def _get_or_create(self, queue: str) -> Any:
        try:
            return super()._get_or_create(queue)  # type: ignore[no-untyped-call]
        except IntegrityError:  # another process made the queue row first
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()


class EmbeddedTransport(kombu.transport.sqlalchemy.Transport):
    """The embedded broker's transport (``broker_transport`` for ``sqla+sqlite``)."""

    Channel = _EmbeddedChannel


_CREATE_ATTEMPTS: Final = 5
