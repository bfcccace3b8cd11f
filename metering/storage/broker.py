"""The embedded broker (kombu's SQLAlchemy transport on SQLite; docs/pipeline.md).

kombu's transport marks a message invisible when a worker takes it and settles it in the
worker's memory only. `EmbeddedTransport` settles it in the file: an acknowledged or
rejected message is deleted, one given back is made visible again; each take counts
(kombu's ``version`` column goes up by one: takes = version - 1) and is stamped with
the UTC time. A message still taken a visibility timeout later was never settled (its
worker died): `sweep_embedded_broker` makes it visible again, until it has been taken
``max_deliveries`` times; then it hands it (`Unfinished`) to be kept as a dead letter
and deletes it. Ages are in UTC on both sides, whatever ``TZ`` each process has.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from queue import Empty
from typing import Any, Final

import kombu.transport.sqlalchemy
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from sqlalchemy import (
    Connection,
    delete,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from metering.settings import DEFAULT_BROKER_MAX_DELIVERIES
from metering.storage.connections import make_engine, translate
from metering.storage.kombu_tables import Unfinished, kombu_messages, unfinished_of

log = logging.getLogger(__name__)


def naive_utc(moment: datetime) -> datetime:
    """An aware ``moment`` as the naive UTC time kombu's ``timestamp`` column holds."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def sweep_embedded_broker(
    broker_url: str,
    give_up: Callable[[Sequence[Unfinished]], object],
    *,
    now: datetime,
    visibility_timeout_seconds: float = 300,
    max_deliveries: int = DEFAULT_BROKER_MAX_DELIVERIES,
) -> dict[str, int]:
    """Give back the messages taken before ``now`` less the visibility timeout
    and never settled; those taken ``max_deliveries`` times go to ``give_up``
    (which keeps them) and are deleted once it returns. Returns counts.

    A message taken again or settled while the sweep runs is left alone: each
    change names the take it saw (``version``). ``now`` is aware.
    """
    url = broker_url.split("+", 1)[1]
    engine = make_engine(url)
    cutoff = naive_utc(now) - timedelta(seconds=visibility_timeout_seconds)
    try:
        with engine.begin() as connection:
            if not engine.dialect.has_table(connection, "kombu_message"):
                return {"restored": 0, "dead_lettered": 0}
            stale = _stale(connection, cutoff)
        spent = [row for row in stale if _takes(row.version) >= max_deliveries]
        again = [row for row in stale if _takes(row.version) < max_deliveries]
        with engine.begin() as connection:
            restored = sum(_settle(connection, row, visible=True) for row in again)
        if spent:
            give_up([unfinished_of(row.payload, _takes(row.version)) for row in spent])
            with engine.begin() as connection:
                dead = sum(_settle(connection, row, visible=None) for row in spent)
        else:
            dead = 0
    except SQLAlchemyError as exc:
        raise translate(exc) from exc
    finally:
        engine.dispose()
    return {"restored": restored, "dead_lettered": dead}


def _stale(connection: Connection, cutoff: datetime) -> list[Any]:
    messages = kombu_messages.c
    query = select(messages.id, messages.version, messages.payload).where(
        messages.visible.is_(False),
        messages.timestamp.is_(None) | (messages.timestamp < cutoff),
    )
    return list(connection.execute(query))


def _takes(version: int) -> int:
    """How many times a message was taken: kombu inserts it at version 1 and
    each take's update adds one (at least one: it is taken now)."""
    return max(version - 1, 1)


def _settle(connection: Connection, row: Any, *, visible: bool | None) -> int:
    """Make one taken message visible again, or delete it (``visible=None``),
    unless it was taken again or settled since it was read."""
    messages = kombu_messages.c
    still = (messages.id == row.id, messages.version == row.version, messages.visible.is_(False))
    if visible is None:
        statement: Any = delete(kombu_messages).where(*still)
    else:
        statement = update(kombu_messages).where(*still).values(visible=visible)
    return int(connection.execute(statement).rowcount)


# -- the transport ------------------------------------------------------------------


class _EmbeddedChannel(kombu.transport.sqlalchemy.Channel):
    """kombu's SQLAlchemy channel, which settles messages in the file and is safe
    when processes start together.

    On a new broker file every process creates kombu's tables and its queue
    rows as it comes up. kombu guards that with a lock of its own process
    only, so two workers started at the same moment both insert the
    ``metering`` queue row, and one died of the unique constraint.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The row of each message taken and not yet settled, by delivery tag.
        self._rows: dict[str, int] = {}
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

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
        # documentation); and the row is remembered, to settle it.
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
            message.visible = False  # the ORM's update also adds one to ``version``
            message.sent_at = naive_utc(datetime.now(UTC))
            payload = loads(bytes_to_str(message.payload))  # type: ignore[no-untyped-call]
            tag = _delivery_tag(payload)
            if tag is not None:
                self._rows[tag] = message.id
            return payload
        finally:
            self.session.commit()

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Callable[[Any], Any], consumer_tag: str, **kw: Any
    ) -> Any:
        if no_ack:  # nothing will acknowledge it: taken is consumed
            consume = callback

            def callback(message: Any) -> Any:
                self._forget(message.delivery_tag)
                return consume(message)

        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kw)  # type: ignore[no-untyped-call]

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        message = super().basic_get(queue, no_ack, **kwargs)  # type: ignore[no-untyped-call]
        if message is not None and no_ack:
            self._forget(message.delivery_tag)
        return message

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        super().basic_ack(delivery_tag, multiple)  # type: ignore[no-untyped-call]
        self._forget(delivery_tag)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        super().basic_reject(delivery_tag, requeue)  # type: ignore[no-untyped-call]
        self._forget(delivery_tag)  # given back: `_restore` settled it already

    def _restore(self, message: Any) -> None:
        # kombu puts a copy back and leaves the taken row; the row itself is
        # made visible again instead, keeping its count of takes.
        row = self._rows.pop(message.delivery_tag, None)
        if row is None:
            super()._restore(message)  # type: ignore[no-untyped-call]
            return
        back = update(kombu_messages).where(kombu_messages.c.id == row).values(visible=True)
        try:
            self.session.execute(back)
            self.session.commit()
        except OperationalError:
            self.session.rollback()
            raise

    def _forget(self, delivery_tag: str) -> None:
        """Delete a settled message's row. Should the file be locked past its
        timeout, the row stays taken and the sweep gives it back (applying it
        again changes nothing)."""
        row = self._rows.pop(delivery_tag, None)
        if row is None:
            return
        try:
            self.session.execute(delete(kombu_messages).where(kombu_messages.c.id == row))
            self.session.commit()
        except OperationalError as exc:
            self.session.rollback()
            log.warning("a settled message stays in the broker until the sweep: %s", exc)

    def _get_or_create(self, queue: str) -> Any:
        try:
            return super()._get_or_create(queue)  # type: ignore[no-untyped-call]
        except IntegrityError:  # another process made the queue row first
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()


def _delivery_tag(payload: object) -> str | None:
    properties = payload.get("properties") if isinstance(payload, dict) else None
    tag = properties.get("delivery_tag") if isinstance(properties, dict) else None
    return tag if isinstance(tag, str) else None


class EmbeddedTransport(kombu.transport.sqlalchemy.Transport):
    """The embedded broker's transport (``broker_transport`` for ``sqla+sqlite``)."""

    Channel = _EmbeddedChannel


_CREATE_ATTEMPTS: Final = 5
