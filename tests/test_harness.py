"""Tests of the test harness itself: `servers.py`, `fresh.py`, `celery_worker.py` and the
fixtures in conftest.

Nothing here uses metering's schema: the template tests build a one-table
template of their own. The Redis tests are at the end.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import budgets
import psycopg
import pytest
import redis
import sqlalchemy as sa
from fresh import run_fresh
from hypothesis import settings
from servers import (
    PostgresServer,
    RedisServer,
    copy_sqlite,
    find_pg_bindir,
    find_redis_server,
    make_base_dir,
    redis_client,
)

# For tests that run servers of their own rather than the session's (which
# conftest marks by itself): `-m "not postgres"` must not need PostgreSQL.
needs_postgres = pytest.mark.postgres


def test_run_fresh_names_what_the_code_loaded_and_what_it_printed() -> None:
    assert run_fresh("import csv\nprint('done')", {"csv", "tomllib"}) == (["done"], ["csv"])


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
def test_the_tests_workers_run_the_worker_command_of_celerys_umbrella() -> None:
    # `celery_worker.WORKER` runs celery.bin.worker's command directly: the
    # one `celery -A workers worker` dispatches to, not a copy or a wrapper.
    from celery.bin.celery import celery
    from celery.bin.worker import worker
    from celery_worker import WORKER

    assert celery.commands["worker"] is worker
    assert Path(WORKER[-1]).name == "celery_worker.py"


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


def test_server_marker_follows_the_fixtures(
    request: pytest.FixtureRequest, postgres_server: PostgresServer
) -> None:
    assert request.node.get_closest_marker("server") is not None


def test_no_server_marker_without_a_server(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    assert request.node.get_closest_marker("server") is None


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_postgresql_parameter_marks_server(kind: str, request: pytest.FixtureRequest) -> None:
    marked = request.node.get_closest_marker("server") is not None
    assert marked == (kind == "postgresql")


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


def _contents(url: str) -> tuple[object, ...]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return (
                sorted(conn.execute(sa.text("SELECT id, name FROM parent")).all()),
                sorted(conn.execute(sa.text("SELECT id, parent FROM child")).all()),
                conn.execute(sa.text("SELECT last_value, is_called FROM parent_id_seq")).one(),
            )
    finally:
        engine.dispose()


def test_a_copy_handed_back_is_the_template_again(postgres_server: PostgresServer) -> None:
    """`copy_of` reuses a copy handed back, emptied to the template: rows
    (the template's own put back), sequences, and the sessions left open ended."""
    template = "harness_tmpl_refill"
    postgres_server.create_database(template)
    _execute(
        postgres_server.url(template),
        "CREATE TABLE parent (id serial PRIMARY KEY, name text NOT NULL)",
        "CREATE TABLE child (id int PRIMARY KEY, parent int NOT NULL REFERENCES parent (id))",
        "INSERT INTO parent (name) VALUES ('from template')",
        "INSERT INTO child VALUES (1, 1)",
    )
    try:
        fresh = _contents(postgres_server.url(template))
        with postgres_server.copy_of(template, "harness_refill") as first:
            assert _contents(first) == fresh
            _execute(
                first,
                "INSERT INTO parent (name) VALUES ('a'), ('b')",
                "INSERT INTO child VALUES (2, 2), (3, 3)",
                "DELETE FROM child WHERE id = 1",
                "UPDATE parent SET name = 'changed' WHERE id = 1",
            )
            left_open = postgres_server.connect(first.rsplit("/", 1)[1])
            assert _contents(first) != fresh
        with left_open, pytest.raises(psycopg.OperationalError):
            left_open.execute("SELECT 1")
        with postgres_server.copy_of(template, "harness_refill") as second:
            assert second == first
            assert _contents(second) == fresh
            _execute(second, "INSERT INTO parent (name) VALUES ('again')")
            assert _scalar(second, "SELECT max(id) FROM parent") == 2
    finally:
        postgres_server.drop_database(template)


@needs_postgres
def test_a_copy_is_emptied_again_after_its_server_restarted_and_dropped_when_reshaped(
    own_server: PostgresServer,
) -> None:
    """`hand_back` empties a copy from the session it left open the last
    time, or from a new one when that session ended (the server stopped and
    started again); a copy whose schema changed is dropped, its kept session
    closed first."""
    own_server.start()
    template = "tmpl"
    own_server.create_database(template)
    _execute(
        own_server.url(template),
        "CREATE TABLE parent (id serial PRIMARY KEY, name text NOT NULL)",
        "INSERT INTO parent (name) VALUES ('from template')",
    )
    fresh = _scalar(own_server.url(template), "SELECT count(*) FROM parent")
    with own_server.copy_of(template, "kept") as first:
        _execute(first, "INSERT INTO parent (name) VALUES ('a')")
    own_server.stop()
    own_server.start()
    with own_server.copy_of(template, "kept") as second:
        assert second == first
        assert _scalar(second, "SELECT count(*) FROM parent") == fresh
        _execute(second, "INSERT INTO parent (name) VALUES ('b')")
    with own_server.copy_of(template, "kept") as third:
        assert third == first
        assert _scalar(third, "SELECT count(*) FROM parent") == fresh
        _execute(third, "ALTER TABLE parent ADD COLUMN extra int")
    with own_server.connect("postgres") as conn:
        names = {name for (name,) in conn.execute("SELECT datname FROM pg_database")}
    assert first.rsplit("/", 1)[1] not in names
    with own_server.copy_of(template, "kept") as fourth:
        assert fourth != first
        assert _scalar(fourth, "SELECT count(*) FROM parent") == fresh


def test_a_forgotten_template_and_its_copies_are_dropped(postgres_server: PostgresServer) -> None:
    """`forget` drops a template and the copies of it handed back, and only those."""
    template, other = "harness_tmpl_forget", "harness_tmpl_kept"
    for name in (template, other):
        postgres_server.create_database(name)
    try:
        with postgres_server.copy_of(template, "harness_forget") as url:
            copy = url.rsplit("/", 1)[1]
        with postgres_server.copy_of(other, "harness_kept") as url:
            kept = url.rsplit("/", 1)[1]
        postgres_server.forget(template)
        with postgres_server.connect("postgres") as conn:
            names = {name for (name,) in conn.execute("SELECT datname FROM pg_database")}
        assert {template, copy} & names == set()
        assert {other, kept} <= names
        with postgres_server.copy_of(other, "harness_kept") as url:
            assert url.rsplit("/", 1)[1] == kept  # its spare copy still taken
    finally:
        postgres_server.forget(other)


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
def test_is_running_answers_as_pg_ctl_status(own_server: PostgresServer) -> None:
    """`is_running` reads postmaster.pid itself; ``pg_ctl status`` (a
    process) says the same for a live server, a stopped one, a pid file
    left behind by a process now gone, another user's process and a
    garbled file."""

    def pg_ctl_says() -> bool:
        return own_server._pg_ctl("status").returncode == 0

    pid_file = own_server.data_dir / "postmaster.pid"
    own_server.start()
    written = pid_file.read_text()
    assert own_server.is_running() and pg_ctl_says()

    own_server.stop()
    assert not pid_file.exists()
    assert not own_server.is_running() and not pg_ctl_says()
    with subprocess.Popen(["true"]) as gone:
        pass  # exited and reaped: nothing runs under its pid
    rest = written.split("\n", 1)[1]
    others = {
        "gone": f"{gone.pid}\n{rest}",
        "another user's": f"1\n{rest}",
        "garbled": "not a pid\n",
    }
    for what, text in others.items():
        pid_file.write_text(text)
        assert (own_server.is_running(), pg_ctl_says()) == (False, False), what
    pid_file.unlink()

    own_server.start()
    assert own_server.is_running() and pg_ctl_says()


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


def test_the_next_pg_url_holds_none_of_the_last_ones_rows(pg_url: str) -> None:
    # Relies on file order: the test above runs first and records its database,
    # which this one is given again, emptied to the template.
    if not _pg_url_databases:
        pytest.skip("needs test_pg_url_is_a_fresh_copy_of_the_template to run first")
    assert pg_url.rsplit("/", 1)[1] == _pg_url_databases[-1]
    assert _scalar(pg_url, "SELECT array_agg(v) FROM marker") == ["from template"]
    _execute(pg_url, "CREATE TABLE extra (v int)")
    _pg_url_databases.append("changed")


def test_a_pg_url_whose_schema_changed_is_dropped(
    pg_url: str, postgres_server: PostgresServer
) -> None:
    if _pg_url_databases[-1:] != ["changed"]:
        pytest.skip("needs test_the_next_pg_url_holds_none_of_the_last_ones_rows to run first")
    assert not _database_exists(postgres_server, _pg_url_databases[-2])
    assert pg_url.rsplit("/", 1)[1] != _pg_url_databases[-2]
    assert _scalar(pg_url, "SELECT count(*) FROM pg_tables WHERE tablename = 'extra'") == 0


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


# -- Redis -------------------------------------------------------------------

needs_redis = pytest.mark.redis


def _redis_or_skip() -> Path:
    executable = find_redis_server()
    if executable is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("redis-server not found on PATH; CI must have it")
        pytest.skip("redis-server not found on PATH")
    return executable


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _refused(port: int) -> bool:
    """True when nothing listens on ``port``: the connect itself is refused."""
    try:
        with redis_client(port, timeout=2) as client:
            client.ping()
    except redis.ConnectionError as exc:
        return isinstance(exc.__context__, ConnectionRefusedError)
    return False


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of the test's own, to stop and start freely."""
    _redis_or_skip()
    server = RedisServer(tmp_path / "redis")
    try:
        yield server
    finally:
        server.destroy()


@needs_redis
def test_find_redis_server_is_executable() -> None:
    executable = _redis_or_skip()
    assert os.access(executable, os.X_OK)


def test_redis_answers_ping(redis_server: RedisServer) -> None:
    assert redis_server.is_running()
    assert redis_server.url() == f"redis://127.0.0.1:{redis_server.port}/0"
    assert redis_server.url(3) == f"redis://127.0.0.1:{redis_server.port}/3"
    assert redis_server.port != 6379  # never the system service's port
    assert redis_server.ping()
    with redis_client(redis_server.port) as client:
        assert client.execute_command("PING") is True  # redis-py's reading of +PONG
        assert client.execute_command("ECHO", "harness") == b"harness"


def test_redis_ping_is_false_and_quick_when_nothing_answers(tmp_path: Path) -> None:
    _redis_or_skip()
    never_started = RedisServer(tmp_path / "redis", port=_unused_port())
    started = time.monotonic()
    assert not never_started.ping(timeout=2)
    assert _refused(never_started.port)
    # No retries with backoff: redis-py's default ones take seconds here.
    assert time.monotonic() - started < 1.5


def test_redis_session_server_config(redis_server: RedisServer) -> None:
    with redis_server.client() as client:

        def config(name: str) -> object:
            reply = client.config_get(name)
            assert list(reply) == [name]
            return reply[name]

        assert config("bind") == "127.0.0.1"
        assert config("port") == str(redis_server.port)
        assert config("appendonly") == "yes"
        assert config("appendfsync") == "everysec"
        assert config("save") == ""  # no RDB snapshots
        assert config("dir") == str(redis_server.base_dir)
        assert config("logfile") == str(redis_server.log_file)
    assert redis_server.log_file.is_file()


def test_redis_set_get(redis_url: str, redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        assert client.set("harness:key", "value") is True
        assert client.get("harness:key") == b"value"
        assert client.get("harness:missing") is None
        assert client.incrby("harness:n", 5) == 5
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            client.lpush("harness:key", "x")
        # The harness's client and the URL the application gets reach one database.
        url_client = redis.Redis.from_url(redis_url)
        try:
            assert url_client.get("harness:key") == b"value"
            url_client.rpush("harness:queue", "a", "b")
        finally:
            url_client.close()
        assert client.lpop("harness:queue") == b"a"


def test_redis_client_timeout_is_applied(redis_server: RedisServer) -> None:
    with redis_server.client(timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            # The server would answer (nil) after 3 s; the client gives up first.
            client.blpop(["harness:never-filled"], timeout=3)
        assert time.monotonic() - started < 2


def test_redis_client_uses_the_database_it_is_given(
    redis_url: str, redis_server: RedisServer
) -> None:
    with redis_server.client(db=3) as three, redis_server.client() as zero:
        three.set("harness:db", "three")
        assert three.get("harness:db") == b"three"
        assert zero.get("harness:db") is None


def test_redis_marker_is_applied(request: pytest.FixtureRequest, redis_url: str) -> None:
    assert request.node.get_closest_marker("redis") is not None
    assert request.node.get_closest_marker("postgres") is None


def test_no_redis_marker_without_redis(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("redis") is None


_leftover_key = "harness:leftover"


def test_redis_url_leaves_a_key_behind(redis_url: str, redis_server: RedisServer) -> None:
    with redis_server.client() as client, redis_server.client(db=5) as other:
        client.set(_leftover_key, "dirty")
        other.set(_leftover_key, "dirty")
        assert client.exists(_leftover_key) == 1


def test_redis_url_starts_empty(redis_url: str, redis_server: RedisServer) -> None:
    # After the test above (file order): FLUSHALL removed its keys, in every database.
    with redis_server.client() as client, redis_server.client(db=5) as other:
        assert client.dbsize() == 0
        assert client.exists(_leftover_key) == 0
        assert other.dbsize() == 0


def test_redis_url_restarts_a_stopped_server(
    redis_server: RedisServer, request: pytest.FixtureRequest
) -> None:
    # As if a test simulating a broker outage failed before restarting it.
    port = redis_server.port
    redis_server.stop()
    assert not redis_server.is_running()
    url = request.getfixturevalue("redis_url")
    assert redis_server.is_running()
    assert redis_server.port == port
    assert url == f"redis://127.0.0.1:{port}/0"
    assert redis_server.ping()


@needs_redis
def test_redis_stop_then_start_keeps_data_and_port(own_redis: RedisServer) -> None:
    own_redis.start()
    port, url = own_redis.port, own_redis.url()
    pid = own_redis.pid
    with own_redis.client() as client:
        client.set("kept", "42")
        client.rpush("queue", "m1", "m2")

    own_redis.stop()
    assert not own_redis.is_running()
    stopped_pid = own_redis.pid
    assert stopped_pid is None
    assert _refused(port)
    own_redis.stop()  # a second stop is a no-op

    own_redis.start()
    assert own_redis.is_running()
    assert own_redis.pid not in (None, pid)
    assert own_redis.port == port
    assert own_redis.url() == url
    with own_redis.client() as client:
        assert client.get("kept") == b"42"
        assert client.lrange("queue", 0, -1) == [b"m1", b"m2"]
    assert any((own_redis.base_dir / "appendonlydir").iterdir())
    assert not (own_redis.base_dir / "dump.rdb").exists()


@needs_redis
def test_redis_new_instance_on_same_dir_reuses_port_and_data(own_redis: RedisServer) -> None:
    own_redis.start()
    with own_redis.client() as client:
        client.set("kept", "yes")
    own_redis.stop()
    again = RedisServer(own_redis.base_dir)
    try:
        again.start()
        assert again.port == own_redis.port
        with again.client() as client:
            assert client.get("kept") == b"yes"
    finally:
        again.stop()


@needs_redis
def test_redis_without_appendonly_keeps_nothing(tmp_path: Path) -> None:
    _redis_or_skip()
    server = RedisServer(tmp_path / "redis", appendonly=False)
    try:
        server.start()
        with server.client() as client:
            assert client.config_get("appendonly") == {"appendonly": "no"}
            client.set("gone", "1")
            assert client.exists("gone") == 1
        server.stop()
        server.start()
        with server.client() as client:
            assert client.exists("gone") == 0
    finally:
        server.destroy()


@needs_redis
def test_redis_start_is_idempotent_and_port_fixed_before_start(own_redis: RedisServer) -> None:
    with pytest.raises(RuntimeError, match="not chosen"):
        _ = own_redis.port
    own_redis.start()
    pid = own_redis.pid
    own_redis.start()  # already running: nothing happens
    assert own_redis.pid == pid


@needs_redis
def test_redis_restart_after_crash(own_redis: RedisServer) -> None:
    own_redis.start()
    port, pid = own_redis.port, own_redis.pid
    assert pid is not None
    os.kill(pid, 9)
    for _ in range(200):
        if not own_redis.is_running():
            break
        time.sleep(0.01)
    assert not own_redis.is_running()
    own_redis.start()
    assert own_redis.port == port
    assert own_redis.ping()


@needs_redis
def test_redis_destroy_removes_base_dir(own_redis: RedisServer) -> None:
    own_redis.start()
    assert own_redis.config_file.is_file()
    own_redis.destroy()
    assert not own_redis.is_running()
    assert not own_redis.base_dir.exists()
    own_redis.destroy()  # idempotent


@needs_redis
def test_redis_context_manager_starts_and_destroys(tmp_path: Path) -> None:
    _redis_or_skip()
    with RedisServer(tmp_path / "redis") as server:
        assert server.ping()
        base_dir, port = server.base_dir, server.port
    assert not server.is_running()
    assert not base_dir.exists()
    assert _refused(port)


@needs_redis
def test_redis_failed_start_raises_with_log_tail(tmp_path: Path) -> None:
    _redis_or_skip()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = RedisServer(tmp_path / "redis", port=taken)
        try:
            with pytest.raises(RuntimeError, match="Address already in use") as info:
                server.start()
            assert str(server.log_file) in str(info.value)
            assert not server.is_running()
        finally:
            server.destroy()


@needs_redis
def test_redis_url_rejects_bad_db(own_redis: RedisServer) -> None:
    own_redis.start()
    with pytest.raises(ValueError, match="0 to 15"):
        own_redis.url(16)


# -- example budgets ------------------------------------------------------------------


def test_the_budget_is_halved_unless_thorough(monkeypatch: pytest.MonkeyPatch) -> None:
    assert budgets.profile() == settings.get_current_profile_name()
    for name in ("default", "ci"):
        monkeypatch.setattr(budgets, "profile", lambda name=name: name)
        assert [budgets.examples(n) for n in (60, 25, 8, 3)] == [30, 13, 5, 3]
        assert [budgets.cases(n) for n in (25, 20, 10, 3)] == [7, 5, 5, 3]
    monkeypatch.setattr(budgets, "profile", lambda: budgets.THOROUGH)
    assert [budgets.examples(n) for n in (60, 25, 8, 3)] == [60, 25, 8, 3]
    assert [budgets.cases(n) for n in (25, 20, 10, 3)] == [25, 20, 10, 3]


def test_test_files_have_unique_names() -> None:
    """The suite imports test files by name (rootdir, no packages): two files of
    one name in different folders fail to import when one worker gets both."""
    names = [path.name for path in Path(__file__).parent.rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


@pytest.mark.parametrize("pending", [False, True], ids=["checkpointed", "log-pending"])
def test_a_sqlite_copy_holds_the_templates_rows(tmp_path: Path, pending: bool) -> None:
    """`copy_sqlite` copies the file when every commit is in it, and reads
    the write-ahead log (the backup API) while a connection keeps commits
    there."""
    template = tmp_path / "template.db"
    writer = sqlite3.connect(template, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE t (n INTEGER)")
    writer.executemany("INSERT INTO t VALUES (?)", [(n,) for n in range(100)])
    if not pending:
        writer.close()
    assert Path(f"{template}-wal").exists() == pending
    url = copy_sqlite(template, tmp_path / "copy.db")
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as copy:
        assert copy.execute("SELECT count(*), sum(n) FROM t").fetchone() == (100, 4950)
        assert copy.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    if pending:
        writer.close()
