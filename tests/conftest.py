"""Database fixtures shared by the whole suite.

PostgreSQL: one throw-away server per test session (`postgres_server`), one
migrated template database (`pg_template_url`), and a fresh copy of that
template for every test that asks for `pg_url` (copying is much faster than
migrating; emptying a used copy faster than copying again). Tests that
touch the server get the ``postgres`` marker automatically, so ``-m "not
postgres"`` runs without it.

Redis (the Celery broker): one throw-away server per test session
(`redis_server`), emptied with FLUSHALL for every test that asks for
`redis_url`. Tests that use either get the ``redis`` marker, so
``-m "not redis"`` runs without it.

Hypothesis: ``--hypothesis-profile thorough`` gives the slow property tests
their whole example budget, the default half of it (`budgets`).

The repository stays clean: a test that leaves the embedded default database
(``./metering.db``, where ``Meter()`` opens without a URL) in the project's
root fails in its teardown (`pytest_runtest_teardown`); such a test runs in
``tmp_path`` (``monkeypatch.chdir``) or gives a URL.

Order: whole test files longest first (`file_order`), so that `make test`'s
workers finish together; ``--write-durations`` records this run's seconds
per file in ``tests/durations.json`` for that order.

`metering` is imported inside fixtures only: this file must import, and the
harness tests must run, before the package exists.
"""

from __future__ import annotations

import gc
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import budgets
import file_order
import pytest
from hypothesis import settings
from servers import (
    PostgresServer,
    RedisServer,
    copy_sqlite,
    find_pg_bindir,
    find_redis_server,
    make_base_dir,
)

TEMPLATE_DB = "metering_template"


REDIS_MARKER = "redis: needs the throw-away Redis server the test session starts"
SERVER_MARKER = "server: needs a real server or process (set by conftest.py from the fixtures used)"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--write-durations",
        action="store_true",
        default=False,
        help="store each file's seconds in tests/durations.json (the order files run in)",
    )


# The whole example budgets of the slow property tests (`budgets`): same settings.
settings.register_profile(budgets.THOROUGH, settings.get_profile("default"))


# A test process holds a large heap that lives as long as it does (the
# collected tests, the libraries, Hypothesis' strategies): the collector
# walked it over and over, about a tenth of a test process's CPU
# (docs/testing.md). Collections start after this many new
# objects instead of 700, and what collection made is frozen out of them.
GC_YOUNGEST_THRESHOLD = 50_000


def pytest_configure(config: pytest.Config) -> None:
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNGEST_THRESHOLD, older, oldest)
    # Also belongs in pyproject's [tool.pytest.ini_options] markers; declaring
    # it here too keeps --strict-markers happy either way.
    config.addinivalue_line("markers", REDIS_MARKER)
    config.addinivalue_line("markers", SERVER_MARKER)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


# Fixtures that start or reach a real server: the session's PostgreSQL and
# Redis, a Celery worker or an API process in a subprocess, uvicorn or
# waitress on a socket, a test's own server. A test that uses any of them,
# directly or through another fixture, gets the ``server`` marker; so does a
# test parametrised with "postgresql" (``db_url`` and the like), and one
# marked ``postgres``, ``redis`` or ``slow`` by hand. ``make test-fast`` runs
# ``-m "not server"``. A new fixture that starts a server goes in this set.
SERVER_FIXTURES = frozenset(
    {
        "postgres_server",
        "pg_template_url",
        "pg_url",
        "redis_server",
        "redis_url",
        "own_server",
        "own_redis",
        "start_worker",
        "api_worker",
        "serve_api",
        "serve_api_module",
        "serve_api_shared",
        "serve_asgi",
        "serve_wsgi",
    }
)
SERVER_MARKERS = frozenset({"postgres", "redis", "slow", "server"})
POSTGRES_PARAMS = frozenset({"postgresql", "postgres"})


def _params(item: pytest.Item) -> dict[str, object]:
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        params = _params(item)
        if "redis_server" in fixtures or "redis_url" in fixtures:
            item.add_marker(pytest.mark.redis)
        if (
            "pg_url" in fixtures
            or "postgres_server" in fixtures
            or ("db_url" in fixtures and params.get("db_url") == "postgresql")
        ):
            item.add_marker(pytest.mark.postgres)
        on_postgres = any(isinstance(v, str) and v in POSTGRES_PARAMS for v in params.values())
        marked = {mark.name for mark in item.iter_markers()}
        if fixtures & SERVER_FIXTURES or on_postgres or marked & SERVER_MARKERS:
            item.add_marker(pytest.mark.server)
    items[:] = file_order.ordered(items, file_order.recorded())


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The heap goes with the process: after pytest's own last collection
    (its check for unraisable exceptions, an earlier hook) nothing walks it
    again. The interpreter's collections at exit took seconds of CPU in a
    worker that had run a third of the suite (docs/testing.md)."""
    gc.freeze()


# The embedded default database, relative to the directory pytest started in.
STRAY_DATABASE = "metering.db"
_stray_before = pytest.StashKey[bool]()


def _stray(config: pytest.Config) -> Path:
    return config.rootpath / STRAY_DATABASE


def pytest_sessionstart(session: pytest.Session) -> None:
    # One the developer made before the run (the README's demo) is theirs.
    session.config.stash[_stray_before] = _stray(session.config).exists()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Fail the test after which (its fixtures torn down too) ``./metering.db``
    appeared in the project's root (under xdist, it or the test running beside
    it on the other worker), and remove the file so the next run starts clean."""
    yield
    path = _stray(item.config)
    if item.config.stash.get(_stray_before, True) or not path.exists():
        return
    path.unlink(missing_ok=True)
    raise AssertionError(
        f"{path} appeared during this test (or one running beside it on another "
        "xdist worker): a Meter or command opened the default database in the "
        "project's root; give it a URL or monkeypatch.chdir(tmp_path)"
    )


_durations: list[tuple[str, float]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations.append((report.nodeid, report.duration))


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Under xdist the controller hears every worker's reports: it writes.
    config = session.config
    if config.getoption("write_durations") and not hasattr(config, "workerinput"):
        file_order.write(_durations)


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
    from metering.storage.connections import upgrade_schema

    postgres_server.create_database(TEMPLATE_DB)
    upgrade_schema(postgres_server.url(TEMPLATE_DB))
    return TEMPLATE_DB


@pytest.fixture
def pg_url(postgres_server: PostgresServer, pg_template_url: str) -> Iterator[str]:
    """URL of a fresh, migrated PostgreSQL database: a copy of the template,
    emptied after the test for the next one (or dropped, when the test
    changed its schema: `PostgresServer.hand_back`)."""
    name = postgres_server.take(pg_template_url, "t")
    try:
        yield postgres_server.url(name)
    finally:
        # A test that stopped the server to simulate an outage may have
        # failed before starting it again; do not fail every later test too.
        postgres_server.start()
        postgres_server.hand_back(pg_template_url, name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to head once a session, to copy per test
    (as `pg_url` copies `pg_template_url`): migrating a fresh file costs
    each test more than the test itself, copying it a millisecond."""
    from metering.storage.connections import upgrade_schema

    path = tmp_path_factory.mktemp("sqlite-template") / "metering.db"
    upgrade_schema(f"sqlite:///{path}")
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    """URL of a fresh, migrated SQLite database file in the test's own temp
    directory (a copy of `sqlite_template`, made with SQLite's backup API)."""
    return copy_sqlite(sqlite_template, tmp_path / "metering.db")


@pytest.fixture(params=["sqlite", "postgresql"], ids=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """The test runs once against SQLite and once against PostgreSQL."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture(scope="session")
def forked_metering() -> Path:
    """A ``metering`` executable that runs each command in a process forked
    from one that imported the CLI once (`command_server`): the real
    command, its streams, directory and environment, without the second of
    imports of a fresh process; `serve`, `worker`, `status` and `demo` run
    as processes of their own."""
    import command_server

    return command_server.shim_directory() / "metering"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A running Redis server for the whole session, removed at the end.

    Loopback only, on a port of its own, append-only file on. Tests may stop
    and start it to simulate a broker outage; `redis_url` starts it again.
    """
    if find_redis_server() is None:
        reason = "redis-server not found on PATH (scripts/ensure-servers.sh installs it)"
        if _in_ci():
            pytest.fail(f"{reason}; CI must run the Redis tests", pytrace=False)
        pytest.skip(reason)
    base_dir = tmp_path_factory.mktemp("redis", numbered=True)
    try:
        server = RedisServer(base_dir)
        server.start()
    except BaseException:
        shutil.rmtree(base_dir, ignore_errors=True)
        raise
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL (database 0) of the session's Redis, emptied of every key first."""
    # A test that stopped the server to simulate an outage may have failed
    # before starting it again; do not fail every later test too.
    redis_server.start()
    url = redis_server.url(0)
    redis_server.flushall()
    return url
