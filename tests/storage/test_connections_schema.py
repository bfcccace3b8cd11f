"""Migrations, schema checks and unreachable databases."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from servers import PostgresServer

from metering import Meter
from metering.errors import DatabaseUnavailable, SchemaOutdated
from metering.storage.connections import MIGRATIONS_DIR, SCHEMA_REVISION, make_engine
from metering.storage.tables import metadata


def test_schema_revision_is_the_migrations_head() -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert ScriptDirectory.from_config(config).get_current_head() == SCHEMA_REVISION


def test_migrations_produce_the_declared_schema(db_url: str) -> None:
    Meter(db_url).close()  # SQLite migrates on first use; PostgreSQL was migrated
    engine = make_engine(db_url)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), metadata)
    engine.dispose()
    assert differences == []


def test_postgresql_without_schema_asks_for_an_upgrade(postgres_server: PostgresServer) -> None:
    postgres_server.create_database("empty_db")
    try:
        with pytest.raises(SchemaOutdated, match="metering db upgrade"):
            Meter(postgres_server.url("empty_db"))
    finally:
        postgres_server.drop_database("empty_db")


def test_unreachable_databases_raise_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatabaseUnavailable):
        Meter("postgresql://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    with pytest.raises(DatabaseUnavailable):
        Meter(f"sqlite:///{tmp_path}/missing-dir/metering.db")
