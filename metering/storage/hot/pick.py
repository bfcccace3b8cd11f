"""The hot path's store for a SQLAlchemy connection's database (`metering.storage.hot`)."""

from __future__ import annotations

from sqlalchemy import Connection

from metering.storage.hot import HotStore


def hot_store(connection: Connection) -> HotStore:
    """`PostgresHotStore` on PostgreSQL, else `SqliteHotStore`."""
    if connection.dialect.name == "postgresql":
        from metering.storage.hot.postgres import PostgresHotStore

        return PostgresHotStore.of(connection)
    from metering.storage.hot.sqlite import SqliteHotStore

    return SqliteHotStore(connection)
