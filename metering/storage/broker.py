"""Upkeep of the embedded broker (kombu's SQLAlchemy transport on SQLite).

That transport marks a message invisible when a worker takes it and keeps
acknowledgements in the worker's memory, so on its own it never deletes a
consumed message and loses the ones a killed worker held. Because applying a
batch is idempotent, this sweep can fix both:

* a taken message whose events all have results is deleted;
* a taken message older than the visibility timeout whose events are not all
  decided is made visible again, and some worker applies it (again).

kombu stamps ``timestamp`` (local time) when it takes a message.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Integer,
    MetaData,
    Table,
    Text,
    delete,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from metering.storage.engine import make_engine, translate

_meta = MetaData()
_messages = Table(
    "kombu_message",
    _meta,
    Column("id", Integer, primary_key=True),
    Column("visible", Boolean),
    Column("timestamp", DateTime),
    Column("payload", Text),
)


def event_ids_of(payload_text: str) -> list[str] | None:
    """The event ids in a stored kombu message, or None if it cannot be read."""
    try:
        envelope = json.loads(payload_text)
        body: Any = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return [str(event["id"]) for event in args[0]["events"]]
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def sweep_embedded_broker(
    broker_url: str,
    decided: Callable[[Iterable[str]], set[str]],
    *,
    now_local: datetime,
    visibility_timeout_seconds: float = 300,
) -> dict[str, int]:
    """Delete consumed messages and redeliver stale ones; returns counts."""
    url = broker_url.split("+", 1)[1]
    engine = make_engine(url)
    deleted = restored = 0
    cutoff = now_local - timedelta(seconds=visibility_timeout_seconds)
    try:
        with engine.begin() as connection:
            if not engine.dialect.has_table(connection, "kombu_message"):
                return {"deleted": 0, "restored": 0}
            taken = connection.execute(
                select(_messages.c.id, _messages.c.timestamp, _messages.c.payload).where(
                    _messages.c.visible.is_(False)
                )
            ).all()
            ids_of = {row.id: event_ids_of(row.payload) for row in taken}
            done = decided({e for ids in ids_of.values() if ids for e in ids})
            finished = [m for m, ids in ids_of.items() if ids is not None and set(ids) <= done]
            stale = [
                row.id
                for row in taken
                if row.id not in finished and (row.timestamp is None or row.timestamp < cutoff)
            ]
            unreadable = [m for m in stale if ids_of[m] is None]
            redeliver = [m for m in stale if ids_of[m] is not None]
            if finished or unreadable:
                gone = delete(_messages).where(_messages.c.id.in_(finished + unreadable))
                deleted = connection.execute(gone).rowcount
            if redeliver:
                back = update(_messages).where(_messages.c.id.in_(redeliver)).values(visible=True)
                restored = connection.execute(back).rowcount
    except SQLAlchemyError as exc:
        raise translate(exc) from exc
    finally:
        engine.dispose()
    return {"deleted": int(deleted), "restored": int(restored)}
