"""Tests of the test harness itself: `servers.py` and the fixtures in conftest.

Nothing here uses metering's schema: the template tests build a one-table
template of their own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from servers import PostgresServer, find_pg_bindir, make_base_dir

# For tests that run servers of their own rather than the session's (which
# conftest marks by itself): `-m "not postgres"` must not need PostgreSQL.
needs_postgres = pytest.mark.postgres


def _bindir_or_skip() -> Path:
    bindir = find_pg_bindir()
    if bindir is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("PostgreSQL server binaries not found; CI must have them")
        pytest.skip("PostgreSQL server binaries not found")
    return bindir


def _scalar(url: str, query: str) -> object:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(query)).scalar_one()
    finally:
        engine.dispose()


def _execute(url: str, *statements: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement))
    finally:
        engine.dispose()


def _database_exists(server: PostgresServer, name: str) -> bool:
    count = _scalar(server.url(), f"SELECT count(*) FROM pg_database WHERE datname = '{name}'")
    return count == 1


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[PostgresServer]:
    """A second, durable server of the test's own, to stop and start freely."""
    _bindir_or_skip()
    server = PostgresServer(make_base_dir(tmp_path), durable=True)
    try:
        yield server
    finally:
        server.destroy()


@needs_postgres
def test_find_pg_bindir_has_initdb_and_pg_ctl() -> None:
    bindir = _bindir_or_skip()
    assert bindir.is_dir()
    assert (bindir / "initdb").is_file()
    assert (bindir / "pg_ctl").is_file()


def test_server_answers_select_1(postgres_server: PostgresServer) -> None:
    assert postgres_server.is_running()
    assert postgres_server.url() == (
        f"postgresql+psycopg://postgres@127.0.0.1:{postgres_server.port}/postgres"
    )
    assert _scalar(postgres_server.url(), "SELECT 1") == 1


def test_session_server_is_tuned_for_tests(postgres_server: PostgresServer) -> None:
    assert _scalar(postgres_server.url(), "SHOW fsync") == "off"
    assert _scalar(postgres_server.url(), "SHOW synchronous_commit") == "off"
    assert _scalar(postgres_server.url(), "SHOW max_connections") == "200"
    assert _scalar(postgres_server.url(), "SHOW listen_addresses") == "127.0.0.1"
    assert _scalar(postgres_server.url(), "SHOW server_encoding") == "UTF8"


def test_postgres_marker_is_applied(
    request: pytest.FixtureRequest, postgres_server: PostgresServer
) -> None:
    assert request.node.get_closest_marker("postgres") is not None


def test_no_postgres_marker_without_postgres(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("postgres") is None


def test_database_from_template_sees_template_table(postgres_server: PostgresServer) -> None:
    postgres_server.create_database("harness_tmpl_a")
    try:
        _execute(
            postgres_server.url("harness_tmpl_a"),
            "CREATE TABLE widgets (id int PRIMARY KEY, name text)",
            "INSERT INTO widgets VALUES (1, 'sprocket')",
        )
        postgres_server.create_database("harness_copy_a", template="harness_tmpl_a")
        try:
            name = _scalar(
                postgres_server.url("harness_copy_a"), "SELECT name FROM widgets WHERE id = 1"
            )
            assert name == "sprocket"
        finally:
            postgres_server.drop_database("harness_copy_a")
        assert not _database_exists(postgres_server, "harness_copy_a")
    finally:
        postgres_server.drop_database("harness_tmpl_a")


def test_template_copy_succeeds_while_template_has_a_connection(
    postgres_server: PostgresServer,
) -> None:
    # A pooled connection left over from migrating the template must not
    # make every copy fail with "source database is being accessed".
    postgres_server.create_database("harness_tmpl_b")
    try:
        with psycopg.connect(
            host="127.0.0.1", port=postgres_server.port, user="postgres", dbname="harness_tmpl_b"
        ):
            postgres_server.create_database("harness_copy_b", template="harness_tmpl_b")
        assert _database_exists(postgres_server, "harness_copy_b")
    finally:
        postgres_server.drop_database("harness_copy_b")
        postgres_server.drop_database("harness_tmpl_b")


def test_drop_database_disconnects_sessions(postgres_server: PostgresServer) -> None:
    postgres_server.create_database("harness_busy")
    with psycopg.connect(
        host="127.0.0.1", port=postgres_server.port, user="postgres", dbname="harness_busy"
    ) as conn:
        conn.execute("SELECT 1")
        postgres_server.drop_database("harness_busy")
        assert not _database_exists(postgres_server, "harness_busy")
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    postgres_server.drop_database("harness_busy")  # IF EXISTS: no error


@needs_postgres
def test_stop_then_start_keeps_data_and_port(own_server: PostgresServer) -> None:
    own_server.start()
    port, url = own_server.port, own_server.url()
    assert _scalar(url, "SHOW fsync") == "on"  # durable=True
    _execute(url, "CREATE TABLE kept (v int)", "INSERT INTO kept VALUES (42)")

    own_server.stop()
    assert not own_server.is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(host="127.0.0.1", port=port, user="postgres", connect_timeout=2)
    own_server.stop()  # a second stop is a no-op

    own_server.start()
    assert own_server.is_running()
    assert own_server.port == port
    assert _scalar(url, "SELECT v FROM kept") == 42


@needs_postgres
def test_destroy_removes_base_dir(own_server: PostgresServer) -> None:
    own_server.start()
    assert own_server.data_dir.is_dir()
    own_server.destroy()
    assert not own_server.is_running()
    assert not own_server.base_dir.exists()
    own_server.destroy()  # idempotent


@needs_postgres
def test_context_manager_starts_and_destroys(tmp_path: Path) -> None:
    _bindir_or_skip()
    with PostgresServer(make_base_dir(tmp_path)) as server:
        assert _scalar(server.url(), "SELECT 1") == 1
        base_dir = server.base_dir
    assert not server.is_running()
    assert not base_dir.exists()


@needs_postgres
def test_failed_start_raises_with_log_tail(tmp_path: Path) -> None:
    _bindir_or_skip()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = PostgresServer(make_base_dir(tmp_path), port=taken)
        try:
            with pytest.raises(RuntimeError, match="could not bind"):
                server.start()
            assert not server.is_running()
        finally:
            server.destroy()


# pg_url and db_url, over a tiny template of this module's instead of
# metering's schema: overriding pg_template_url leaves the real pg_url in use.

_pg_url_databases: list[str] = []


@pytest.fixture(scope="module")
def pg_template_url(postgres_server: PostgresServer) -> Iterator[str]:
    postgres_server.create_database("harness_fixture_tmpl")
    _execute(
        postgres_server.url("harness_fixture_tmpl"),
        "CREATE TABLE marker (v text)",
        "INSERT INTO marker VALUES ('from template')",
    )
    try:
        yield "harness_fixture_tmpl"
    finally:
        postgres_server.drop_database("harness_fixture_tmpl")


def test_pg_url_is_a_fresh_copy_of_the_template(
    pg_url: str, request: pytest.FixtureRequest
) -> None:
    assert request.node.get_closest_marker("postgres") is not None
    dbname = pg_url.rsplit("/", 1)[1]
    assert dbname.startswith("t_")
    assert _scalar(pg_url, "SELECT v FROM marker") == "from template"
    _execute(pg_url, "INSERT INTO marker VALUES ('dirty')")
    _pg_url_databases.append(dbname)


def test_pg_url_database_was_dropped(postgres_server: PostgresServer) -> None:
    # Relies on file order: the test above runs first and records its database.
    if not _pg_url_databases:
        pytest.skip("needs test_pg_url_is_a_fresh_copy_of_the_template to run first")
    assert not _database_exists(postgres_server, _pg_url_databases[-1])


def test_pg_url_teardown_survives_a_stopped_server(
    pg_url: str, postgres_server: PostgresServer
) -> None:
    # As if a test simulating an outage failed before restarting the server:
    # pg_url's teardown starts it again (checked by the next test).
    postgres_server.stop()


def test_server_is_running_after_outage_teardown(postgres_server: PostgresServer) -> None:
    assert postgres_server.is_running()
    assert _scalar(postgres_server.url(), "SELECT 1") == 1


def test_db_url_switches_backend(db_url: str, request: pytest.FixtureRequest) -> None:
    backend = request.node.callspec.id
    marked = request.node.get_closest_marker("postgres") is not None
    if backend == "sqlite":
        assert db_url.startswith("sqlite:///")
        assert db_url.endswith("/metering.db")
        assert not marked
        assert _scalar(db_url, "SELECT 1") == 1
    else:
        assert backend == "postgresql"
        assert db_url.startswith("postgresql+psycopg://")
        assert marked
        # A fresh copy: the 'dirty' row of the earlier test is not here.
        assert _scalar(db_url, "SELECT count(*) FROM marker") == 1
