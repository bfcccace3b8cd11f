"""Database fixtures shared by the whole suite.

PostgreSQL: one throw-away server per test session (`postgres_server`), one
migrated template database (`pg_template_url`), and a fresh copy of that
template for every test that asks for `pg_url` (copying is much faster than
migrating). Tests that touch the server get the ``postgres`` marker
automatically, so ``-m "not postgres"`` runs without it.

`metering` is imported inside fixtures only: this file must import, and the
harness tests must run, before the package exists.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import PostgresServer, find_pg_bindir, make_base_dir

TEMPLATE_DB = "metering_template"

_db_counter = itertools.count(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        db_url_param = callspec.params.get("db_url") if callspec is not None else None
        if (
            "pg_url" in fixtures
            or "postgres_server" in fixtures
            or ("db_url" in fixtures and db_url_param == "postgresql")
        ):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """A running PostgreSQL server for the whole session, removed at the end."""
    if find_pg_bindir() is None:
        reason = "PostgreSQL server binaries (initdb, pg_ctl) not found"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI must run the PostgreSQL tests", pytrace=False)
        pytest.skip(reason)
    # Under root this is in /tmp, not in pytest's mode-0700 temp dir.
    base_dir = make_base_dir(tmp_path_factory.getbasetemp(), prefix="metering-pg-")
    try:
        server = PostgresServer(base_dir)
        server.start()
    except BaseException:
        shutil.rmtree(base_dir, ignore_errors=True)
        raise
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def pg_template_url(postgres_server: PostgresServer) -> str:
    """Name (not URL) of a database migrated to head, to copy per test."""
    from metering.storage.engine import upgrade_schema

    postgres_server.create_database(TEMPLATE_DB)
    upgrade_schema(postgres_server.url(TEMPLATE_DB))
    return TEMPLATE_DB


@pytest.fixture
def pg_url(postgres_server: PostgresServer, pg_template_url: str) -> Iterator[str]:
    """URL of a fresh, migrated PostgreSQL database, dropped after the test."""
    name = f"t_{next(_db_counter)}"
    postgres_server.create_database(name, template=pg_template_url)
    try:
        yield postgres_server.url(name)
    finally:
        # A test that stopped the server to simulate an outage may have
        # failed before starting it again; do not fail every later test too.
        postgres_server.start()
        postgres_server.drop_database(name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a SQLite database file in the test's own temp directory."""
    return f"sqlite:///{tmp_path}/metering.db"


@pytest.fixture(params=["sqlite", "postgresql"], ids=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """The test runs once against SQLite and once against PostgreSQL."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(fixture)
    return url
