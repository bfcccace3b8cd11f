"""The tables of kombu's SQLAlchemy transport, the embedded broker's store.

Declared once, as ``kombu.transport.sqlalchemy.models`` creates them (same
names, types, nullability, unique name, index and foreign key), for the code
that reads or tends them without kombu's ORM: the embedded channel and its sweep
(`metering.storage.broker`) and the queue report (`metering.storage.queue_state`).
Nothing here creates them; kombu does, on a channel's first connect. `task_body` reads a
stored message's task arguments as both of them need.
"""

from __future__ import annotations

import base64
import json
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
