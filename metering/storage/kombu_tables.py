"""The tables of kombu's SQLAlchemy transport, the embedded broker's store.

Declared once, as ``kombu.transport.sqlalchemy.models`` creates them (same
names, types, nullability, unique name, index and foreign key), for the code
that reads or tends them without kombu's ORM: the embedded channel and its sweep
(`metering.storage.broker`) and the queue report (`metering.storage.queue_state`).
Nothing here creates them; kombu does, on a channel's first connect. `task_body` reads a
stored message's task arguments as both of them need; `unfinished_of` a message given up.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
)

from metering.pipeline.messages import batch_argument
from metering.pipeline.routing import APPLY_BATCH_TASK

metadata = MetaData()

kombu_queues = Table(
    "kombu_queue",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), unique=True),
    sqlite_autoincrement=True,
)

kombu_messages = Table(
    "kombu_message",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("visible", Boolean, index=True),
    Column("timestamp", DateTime, nullable=True, index=True),
    Column("payload", Text, nullable=False),
    Column("version", SmallInteger, nullable=False),
    Column(
        "queue_id",
        Integer,
        ForeignKey("kombu_queue.id", name="FK_kombu_message_queue"),
    ),
    Index("ix_kombu_message_timestamp_id", "timestamp", "id"),
    sqlite_autoincrement=True,
)


def task_body(envelope: dict[str, Any]) -> Any:
    """A stored kombu envelope's body, JSON-decoded (base64 first when its
    properties say so): a Celery task's ``[args, kwargs, embed]``. Raises
    `ValueError`, `KeyError` or `TypeError` on what is not one."""
    body: Any = envelope["body"]
    properties = envelope.get("properties")
    if isinstance(properties, dict) and properties.get("body_encoding") == "base64":
        body = base64.b64decode(body)
    return json.loads(body)


@dataclass(frozen=True, slots=True)
class Unfinished:
    """A message taken ``deliveries`` times and never settled, as the sweep gives it up.

    ``raw`` is the stored kombu envelope; ``task`` the Celery task it names (None: none);
    ``batch`` the ``metering.apply_batch`` task's argument as the worker reads it (None
    for any other message, or one whose body cannot be read).
    """

    raw: str
    deliveries: int
    task: str | None
    batch: object | None


def unfinished_of(payload_text: str, deliveries: int) -> Unfinished:
    """A stored kombu message as `Unfinished`, read as the worker would read it."""
    try:
        envelope = json.loads(payload_text)
        task = envelope["headers"]["task"]
    except (ValueError, KeyError, TypeError):
        return Unfinished(payload_text, deliveries, None, None)
    if not isinstance(task, str):
        return Unfinished(payload_text, deliveries, None, None)
    if task != APPLY_BATCH_TASK:
        return Unfinished(payload_text, deliveries, task, None)
    try:
        batch = batch_argument(*task_body(envelope)[:2])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        batch = None
    return Unfinished(payload_text, deliveries, task, batch)
