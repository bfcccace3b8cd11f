"""Every webhook statement: endpoints, marks, the outbox, deliveries, attempts.

`WebhookStore` works on the caller's connection and transaction, like
`Store`. Notifications are recorded by `record_notices` inside the counters'
transaction: a mark is inserted (insert-or-ignore on its primary key, so two
workers cannot both fire), and only when it is new are the message and one
delivery per enabled, subscribed endpoint written. A rolled-back counter
change therefore leaves no trace here either.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Final

from sqlalchemy import Connection, and_, case, delete, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from metering.domain.notifications import DeliveryStatus, Mark, Notice
from metering.domain.state import NO_WINDOW, CounterState
from metering.storage.records import RecordColumns
from metering.storage.tables import (
    counters,
    webhook_attempts,
    webhook_deliveries,
    webhook_endpoints,
    webhook_marks,
    webhook_messages,
)
from metering.storage.webhook_records import (
    ATTEMPT,
    DELIVERY,
    ENDPOINT,
    AttemptRecord,
    DeliveryJob,
    DeliveryRecord,
    EndpointRecord,
    encode_payload,
    types_text,
)

__all__ = [
    "AttemptRecord",
    "DeliveryJob",
    "DeliveryRecord",
    "EndpointRecord",
    "WebhookStore",
    "encode_payload",
]


_MARK: Final = RecordColumns(Mark, columns={"limit": "limit_name"})


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(12)


class WebhookStore:
    """Webhook queries on one connection; the caller owns the transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._insert: Any = (
            postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
        )

    # -- notifications (inside the counters' transaction) ------------------

    def record_notices(
        self, notices: Sequence[tuple[Notice, dict[str, Any]]], now_us: int
    ) -> list[str]:
        """Insert each notice's mark; for every new one write the message and
        its deliveries. Returns the ids of the messages written.

        A few statements a batch, whatever its size: the marks in one
        executemany (`_new_marks`; SQLAlchemy sends it as multi-row inserts),
        then the messages in one and their deliveries in one."""
        if not notices:
            return []
        encoded = [(notice, encode_payload(document)) for notice, document in notices]
        fresh = self._new_marks(encoded, now_us)
        if not fresh:
            return []
        endpoints = self.list_endpoints(enabled_only=True)
        return self.add_messages(
            [(notice.type, payload) for notice, payload in fresh], endpoints, now_us
        )

    def _new_marks(
        self, notices: Sequence[tuple[Notice, str]], now_us: int
    ) -> list[tuple[Notice, str]]:
        """The notices whose mark this wrote, in their order: a mark already
        stored, or one an earlier notice of the batch wrote, is skipped."""
        statement = (
            self._insert(webhook_marks)
            .on_conflict_do_nothing()
            .returning(
                webhook_marks.c.limit_name,
                webhook_marks.c.subject,
                webhook_marks.c.window_start_us,
                webhook_marks.c.kind,
            )
        )
        rows = [
            {
                "limit_name": notice.limit,
                "subject": notice.subject,
                "window_start_us": notice.window_start_us,
                "kind": notice.mark,
                "window_end_us": notice.window_end_us,
                "maximum": notice.maximum,
                "event_id": notice.event_id,
                "created_at_us": now_us,
                "due_at_us": notice.due_at_us,
            }
            for notice, _ in notices
        ]
        written = {tuple(row) for row in self.connection.execute(statement, rows)}
        fresh: list[tuple[Notice, str]] = []
        for notice, payload in notices:
            key = (notice.limit, notice.subject, notice.window_start_us, notice.mark)
            if key in written:
                written.discard(key)  # the first notice of a key wrote its mark
                fresh.append((notice, payload))
        return fresh

    def add_message(
        self, message_type: str, payload: str, endpoints: Iterable[EndpointRecord], now_us: int
    ) -> str:
        """Write one message and a pending delivery for each endpoint that wants it."""
        return self.add_messages([(message_type, payload)], endpoints, now_us)[0]

    def add_messages(
        self,
        messages: Sequence[tuple[str, str]],
        endpoints: Iterable[EndpointRecord],
        now_us: int,
    ) -> list[str]:
        """Write each ``(type, payload)`` message and a pending delivery for
        each endpoint that wants it; the ids, in order."""
        endpoints = list(endpoints)
        ids = [new_message_id() for _ in messages]
        self.connection.execute(
            webhook_messages.insert(),
            [
                {
                    "id": message_id,
                    "type": message_type,
                    "payload": payload,
                    "created_at_us": now_us,
                }
                for message_id, (message_type, payload) in zip(ids, messages, strict=True)
            ],
        )
        rows = [
            {
                "message_id": message_id,
                "endpoint_id": endpoint.id,
                "status": DeliveryStatus.PENDING.value,
                "attempts": 0,
                "next_attempt_at_us": now_us,
                "created_at_us": now_us,
                "updated_at_us": now_us,
            }
            for message_id, (message_type, _) in zip(ids, messages, strict=True)
            for endpoint in endpoints
            if endpoint.wants(message_type)
        ]
        if rows:
            self.connection.execute(webhook_deliveries.insert(), rows)
        return ids

    # -- the reset sweep -----------------------------------------------------

    def lock_due_marks(self, now_us: int, count: int) -> list[Mark]:
        query = (
            select(webhook_marks)
            .where(webhook_marks.c.due_at_us <= now_us)
            .order_by(webhook_marks.c.due_at_us)
            .limit(count)
            .with_for_update(skip_locked=True)
        )
        return [_MARK.of_row(r) for r in self.connection.execute(query)]

    def bucket_state(self, limit: str, subject: str) -> CounterState | None:
        row = self.connection.execute(
            select(counters.c.tat_us, counters.c.tat_rem, counters.c.tat_scale).where(
                counters.c.limit_name == limit,
                counters.c.subject == subject,
                counters.c.window_start_us == NO_WINDOW,
            )
        ).first()
        if row is None:
            return None
        return CounterState(tat_us=row.tat_us, tat_rem=row.tat_rem, tat_scale=row.tat_scale)

    def settle_mark(self, mark: Mark, *, delete_it: bool, due_at_us: int | None) -> None:
        where = and_(
            webhook_marks.c.limit_name == mark.limit,
            webhook_marks.c.subject == mark.subject,
            webhook_marks.c.window_start_us == mark.window_start_us,
            webhook_marks.c.kind == mark.kind,
        )
        if delete_it:
            self.connection.execute(delete(webhook_marks).where(where))
        else:
            self.connection.execute(update(webhook_marks).where(where).values(due_at_us=due_at_us))

    # -- endpoints -------------------------------------------------------------

    def insert_endpoint(self, record: EndpointRecord) -> None:
        self.connection.execute(webhook_endpoints.insert().values(ENDPOINT.values(record)))

    def list_endpoints(
        self, *, enabled_only: bool = False, lock: bool = False
    ) -> list[EndpointRecord]:
        """Every endpoint, oldest first; ``lock``: each row locked until the
        transaction ends, for a rewrite of what was read (PostgreSQL)."""
        query = select(webhook_endpoints).order_by(
            webhook_endpoints.c.created_at_us, webhook_endpoints.c.id
        )
        if enabled_only:
            query = query.where(webhook_endpoints.c.enabled.is_(True))
        if lock:
            query = query.with_for_update()
        return [ENDPOINT.of_row(row) for row in self.connection.execute(query)]

    def get_endpoint(self, endpoint_id: str, *, lock: bool = False) -> EndpointRecord | None:
        query = select(webhook_endpoints).where(webhook_endpoints.c.id == endpoint_id)
        if lock:  # PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers
            query = query.with_for_update()
        row = self.connection.execute(query).first()
        return ENDPOINT.of_row(row) if row is not None else None

    def update_endpoint(self, endpoint_id: str, **values: Any) -> bool:
        """Set columns of an endpoint (``types`` as a sequence); False if there is none."""
        if "types" in values:
            values["types"] = types_text(values["types"])
        statement = (
            update(webhook_endpoints).where(webhook_endpoints.c.id == endpoint_id).values(**values)
        )
        return bool(self.connection.execute(statement).rowcount)

    def delete_endpoint(self, endpoint_id: str) -> bool:
        """Remove an endpoint with its deliveries and their attempts. The
        endpoint is locked first: a test ping writing its delivery meanwhile
        (which locks it too) commits before, and its delivery goes as well."""
        self.get_endpoint(endpoint_id, lock=True)
        ids = select(webhook_deliveries.c.id).where(webhook_deliveries.c.endpoint_id == endpoint_id)
        self.connection.execute(
            delete(webhook_attempts).where(webhook_attempts.c.delivery_id.in_(ids))
        )
        self.connection.execute(
            delete(webhook_deliveries).where(webhook_deliveries.c.endpoint_id == endpoint_id)
        )
        outcome = self.connection.execute(
            delete(webhook_endpoints).where(webhook_endpoints.c.id == endpoint_id)
        )
        return bool(outcome.rowcount)

    # -- deliveries ------------------------------------------------------------

    def claim_due(
        self, now_us: int, lease_until_us: int, *, skip_endpoints: Collection[str] = ()
    ) -> DeliveryJob | None:
        """Claim the most overdue delivery of an enabled endpoint, or None.

        PostgreSQL skips rows another worker is claiming (``FOR UPDATE SKIP
        LOCKED``); SQLite transactions are serialised by ``BEGIN IMMEDIATE``.
        An expired lease (a worker that died mid-attempt) is claimable again.
        Deliveries to ``skip_endpoints`` (the caller's busy ones) are left.
        """
        d = webhook_deliveries
        enabled = select(webhook_endpoints.c.id).where(webhook_endpoints.c.enabled.is_(True))
        if skip_endpoints:
            enabled = enabled.where(webhook_endpoints.c.id.not_in(list(skip_endpoints)))
        return self._claim(
            and_(
                d.c.status == DeliveryStatus.PENDING.value,
                d.c.next_attempt_at_us <= now_us,
                or_(d.c.claimed_until_us.is_(None), d.c.claimed_until_us < now_us),
                d.c.endpoint_id.in_(enabled),
            ),
            lease_until_us,
        )

    def backlog(self, now_us: int) -> tuple[int, int, int | None]:
        """Pending deliveries to enabled endpoints: how many are due at
        ``now_us``, how many in all, and the earliest due time (None: none)."""
        d = webhook_deliveries
        enabled = select(webhook_endpoints.c.id).where(webhook_endpoints.c.enabled.is_(True))
        due = case((d.c.next_attempt_at_us <= now_us, 1), else_=0)
        row = self.connection.execute(
            select(func.coalesce(func.sum(due), 0), func.count(), func.min(d.c.next_attempt_at_us))
            .where(d.c.status == DeliveryStatus.PENDING.value)
            .where(d.c.endpoint_id.in_(enabled))
        ).one()
        return int(row[0]), int(row[1]), None if row[2] is None else int(row[2])

    def claim_message(self, message_id: str, lease_until_us: int) -> DeliveryJob | None:
        """Claim the (first) delivery of one message, whatever its state (test pings)."""
        return self._claim(webhook_deliveries.c.message_id == message_id, lease_until_us)

    def _claim(self, condition: Any, lease_until_us: int) -> DeliveryJob | None:
        d = webhook_deliveries
        candidate = (
            select(d.c.id)
            .where(condition)
            .order_by(d.c.next_attempt_at_us, d.c.id)
            .limit(1)
            .with_for_update(skip_locked=True)
        ).scalar_subquery()
        token = secrets.token_hex(16)
        claimed = self.connection.execute(
            update(d)
            .where(d.c.id == candidate)
            .values(claim_token=token, claimed_until_us=lease_until_us)
            .returning(d.c.id, d.c.attempts, d.c.message_id, d.c.endpoint_id)
        ).first()
        if claimed is None:
            return None
        message = self.connection.execute(
            select(webhook_messages).where(webhook_messages.c.id == claimed.message_id)
        ).one()
        endpoint = self.get_endpoint(claimed.endpoint_id)
        assert endpoint is not None
        return DeliveryJob(
            claimed.id, token, claimed.attempts, message.id, message.type, message.payload, endpoint
        )

    def finish_attempt(
        self, job: DeliveryJob, attempt: AttemptRecord, status: DeliveryStatus, now_us: int
    ) -> bool:
        """Record an attempt and the delivery's new state, if the claim is still ours."""
        self.connection.execute(webhook_attempts.insert().values(ATTEMPT.values(attempt)))
        outcome = self.connection.execute(
            update(webhook_deliveries)
            .where(
                webhook_deliveries.c.id == job.delivery_id,
                webhook_deliveries.c.claim_token == job.claim_token,
            )
            .values(
                status=status.value,
                attempts=attempt.attempt,
                next_attempt_at_us=attempt.next_attempt_at_us,
                claim_token=None,
                claimed_until_us=None,
                last_status_code=attempt.status_code,
                last_error=attempt.error,
                updated_at_us=now_us,
            )
        )
        return bool(outcome.rowcount)

    def retry_unanswered(self, now_us: int) -> int:
        """Make pending deliveries whose last attempt got no HTTP answer (a
        refused destination, no connection, a timeout) due at ``now_us``;
        those a receiver answered keep their schedule, and claimed ones their
        lease. Returns how many."""
        d = webhook_deliveries
        outcome = self.connection.execute(
            update(d)
            .where(
                d.c.status == DeliveryStatus.PENDING.value,
                d.c.attempts > 0,
                d.c.last_status_code.is_(None),
                d.c.next_attempt_at_us > now_us,
                or_(d.c.claimed_until_us.is_(None), d.c.claimed_until_us < now_us),
            )
            .values(next_attempt_at_us=now_us, updated_at_us=now_us)
        )
        return int(outcome.rowcount)

    def replay(self, delivery_ids: Sequence[int] | None, since_us: int | None, now_us: int) -> int:
        """Make deliveries (by id, or every one created since) pending again, due now,
        with a fresh retry schedule. Their past attempts stay recorded."""
        statement = update(webhook_deliveries).values(
            status=DeliveryStatus.PENDING.value,
            attempts=0,
            next_attempt_at_us=now_us,
            claim_token=None,
            claimed_until_us=None,
            updated_at_us=now_us,
        )
        if delivery_ids is not None:
            statement = statement.where(webhook_deliveries.c.id.in_(list(delivery_ids)))
        if since_us is not None:
            statement = statement.where(webhook_deliveries.c.created_at_us >= since_us)
        return int(self.connection.execute(statement).rowcount)

    def list_deliveries(
        self, *, status: str | None = None, endpoint_id: str | None = None, count: int = 50
    ) -> list[DeliveryRecord]:
        d, m = webhook_deliveries, webhook_messages
        query = (
            select(d, m.c.type)
            .join(m, m.c.id == d.c.message_id)
            .order_by(d.c.id.desc())
            .limit(count)
        )
        if status is not None:
            query = query.where(d.c.status == status)
        if endpoint_id is not None:
            query = query.where(d.c.endpoint_id == endpoint_id)
        return [DELIVERY.of_row(r) for r in self.connection.execute(query)]

    def get_delivery(self, delivery_id: int) -> DeliveryRecord | None:
        """The delivery, or None (its endpoint was removed since)."""
        d, m = webhook_deliveries, webhook_messages
        query = select(d, m.c.type).join(m, m.c.id == d.c.message_id).where(d.c.id == delivery_id)
        row = self.connection.execute(query).first()
        return DELIVERY.of_row(row) if row is not None else None

    def attempts_of(self, delivery_id: int) -> list[AttemptRecord]:
        a = webhook_attempts
        query = select(a).where(a.c.delivery_id == delivery_id).order_by(a.c.attempt, a.c.id)
        return [ATTEMPT.of_row(r) for r in self.connection.execute(query)]

    def messages(self, message_type: str | None = None) -> list[tuple[str, str, str]]:
        """(id, type, payload) of stored messages, oldest first."""
        query = select(webhook_messages).order_by(
            webhook_messages.c.created_at_us, webhook_messages.c.id
        )
        if message_type is not None:
            query = query.where(webhook_messages.c.type == message_type)
        return [(r.id, r.type, r.payload) for r in self.connection.execute(query)]
