"""Alembic environment: migrations run on the connection `upgrade_schema` passes in."""

from __future__ import annotations

from alembic import context

from metering.storage.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    from metering.storage.connections import make_engine

    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("set sqlalchemy.url, or run `metering db upgrade`")
    with make_engine(url).begin() as own_connection:
        context.configure(connection=own_connection, target_metadata=metadata)
        context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=metadata)
    context.run_migrations()
