"""API keys over HTTP: uvicorn on a loopback port, httpx, SQLite and PostgreSQL.

Routes of each scope (ingest: ``POST /v1/events``; read: ``GET
/v1/subjects/{subject}/usage``; admin: ``GET /v1/webhooks/endpoints``),
answered 401 without a valid key and 403 with the wrong scope; a revoked
key refused on the next request; the database holding no key nor any
piece of one; the last use recorded; one noisy key answered 429 while
another goes on.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from lock_waits import WAIT_SECONDS
from loopback import http_client
from servers import PostgresServer
from sqlalchemy import make_url, select, text

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.api.ratelimit import RATE_LIMIT
from metering.apikeys import ApiKeys
from metering.cli import main
from metering.errors import DatabaseUnavailable
from metering.settings import ApiRate, Settings
from metering.storage.api_keys import ApiKeyStore
from metering.storage.tables import metadata

Serve = Callable[[Any], str]  # the serve_api fixture
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PROBLEM = "application/problem+json"

# (scope, method, path, JSON body) of a route of each scope.
ROUTES: dict[str, tuple[str, str, Any]] = {
    "ingest": (
        "POST",
        "/v1/events",
        {"event_id": "e-1", "subject": "org-1", "limit": "api_calls", "cost": 1},
    ),
    "read": ("GET", "/v1/subjects/org-1/usage", None),
    "admin": ("GET", "/v1/webhooks/endpoints", None),
}


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=1000, period="1h", window="calendar"))
        yield m


@pytest.fixture
def start(
    serve_api: Serve, meter: Meter, tmp_path: Path
) -> Callable[..., tuple[FastAPI, httpx.Client]]:
    """``start(**settings)`` → the app under uvicorn, and a client of it."""
    clients: list[httpx.Client] = []

    def run(**options: Any) -> tuple[FastAPI, httpx.Client]:
        settings = Settings(
            database_url=meter.url,
            broker_url=f"sqla+sqlite:///{tmp_path}/metering-broker.db",
            **options,
        )
        app = create_api(settings, meter=meter)
        client = http_client(base_url=serve_api(app), timeout=30)
        clients.append(client)
        return app, client

    yield run  # type: ignore[misc]
    for client in clients:
        client.close()


def call(client: httpx.Client, scope: str, token: str | None = None) -> httpx.Response:
    method, path, body = ROUTES[scope]
    headers = {"Authorization": f"Bearer {token}".strip()} if token is not None else {}
    return client.request(method, path, json=body, headers=headers)


def assert_problem(answer: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    body: dict[str, Any] = answer.json()
    assert (body["type"], body["status"]) == (f"urn:metering:problem:{slug}", status)
    return body


def test_without_a_valid_key_every_scope_is_401(start: Callable[..., Any], meter: Meter) -> None:
    keys = ApiKeys(meter)
    _key, token = keys.create("admin")
    revoked, revoked_token = keys.create("admin")
    keys.revoke(revoked.id)
    _app, client = start()
    for scope in ROUTES:
        missing = call(client, scope)
        body = assert_problem(missing, 401, "unauthorized")
        assert missing.headers["www-authenticate"] == 'Bearer realm="metering"'
        assert "an API key is required" in body["detail"]
        for wrong in (
            "mk_0123456789ab_" + "A" * 43,  # well formed, unknown
            token[:-1] + ("B" if token[-1] == "A" else "A"),  # a known id, another secret
            revoked_token,
            "not-a-key",
            "",
        ):
            refused = call(client, scope, wrong)
            assert_problem(refused, 401, "unauthorized")
            assert refused.headers["www-authenticate"] == (
                'Bearer realm="metering", error="invalid_token"'
            )
        basic = client.request(
            ROUTES[scope][0],
            ROUTES[scope][1],
            json=ROUTES[scope][2],
            headers={"Authorization": f"Basic {token}"},
        )
        assert_problem(basic, 401, "unauthorized")
    assert meter.count_results() == 0  # nothing stored, nothing charged
    for scope in ROUTES:
        assert call(client, scope, token).status_code in (200, 202)


def test_the_wrong_scope_is_403_and_admin_may_do_everything(
    start: Callable[..., Any], meter: Meter
) -> None:
    keys = ApiKeys(meter)
    tokens = {scope: keys.create(scope, name=f"{scope} key")[1] for scope in ROUTES}
    _app, client = start()
    allowed = {
        "ingest": {"ingest"},
        "read": {"read"},
        "admin": {"ingest", "read", "admin"},
    }
    for key_scope, token in tokens.items():
        for route_scope in ROUTES:
            answer = call(client, route_scope, token)
            if route_scope in allowed[key_scope]:
                assert answer.status_code in (200, 202), (key_scope, route_scope, answer.text)
                continue
            body = assert_problem(answer, 403, "forbidden")
            assert f"has scope {key_scope}; this route needs {route_scope}" in body["detail"]
            assert answer.headers["www-authenticate"] == (
                f'Bearer realm="metering", error="insufficient_scope", scope="{route_scope}"'
            )


def test_a_revoked_key_stops_working_at_once(
    start: Callable[..., Any], meter: Meter, db_url: str
) -> None:
    """Revoked by the command line (its own engine and connections): the very
    next request is refused; nothing in the API remembers the key."""
    key, token = ApiKeys(meter).create("read")
    _app, client = start()
    for _ in range(3):
        assert call(client, "read", token).status_code == 200
    revoked = CliRunner().invoke(main, ["--database", db_url, "apikeys", "revoke", key.id])
    assert revoked.exit_code == 0, revoked.output
    assert_problem(call(client, "read", token), 401, "unauthorized")
    # And through the library, in this process, for another key.
    other, other_token = ApiKeys(meter).create("ingest")
    assert call(client, "ingest", other_token).status_code == 202
    ApiKeys(meter).revoke(other.id)
    assert_problem(call(client, "ingest", other_token), 401, "unauthorized")


def test_no_key_nor_any_piece_of_one_is_stored(start: Callable[..., Any], meter: Meter) -> None:
    keys = ApiKeys(meter)
    tokens = [keys.create(scope, name="stored?")[1] for scope in ("ingest", "read", "admin")]
    _app, client = start()
    for token, scope in zip(tokens, ("ingest", "read", "admin"), strict=True):
        assert call(client, scope, token).status_code in (200, 202)  # last use, rate counters
    keys.revoke(tokens[0][:15])
    with meter.sql_engine.connect() as connection:
        stored = {
            table.name: [tuple(row) for row in connection.execute(select(table))]
            for table in metadata.sorted_tables
        }
    api_rows = stored["api_keys"]
    assert len(api_rows) == 3
    values = [str(value) for rows in stored.values() for row in rows for value in row]
    for token in tokens:
        secret = token[16:]
        pieces = {secret[i : i + 8] for i in range(len(secret) - 7)}
        for value in values:
            assert token not in value
            assert not any(piece in value for piece in pieces), value
        digest = hashlib.sha256(token.encode()).hexdigest()
        assert any(row[0] == token[:15] and row[1] == digest for row in api_rows)


def test_the_last_use_is_recorded_about_once_a_minute(
    start: Callable[..., Any], meter: Meter
) -> None:
    keys = ApiKeys(meter)
    key, token = keys.create("read")
    assert keys.get(key.id).last_used_at is None
    _app, client = start()
    assert call(client, "read", token).status_code == 200
    assert keys.get(key.id).last_used_at == NOW
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    clock.advance(seconds=30)
    assert call(client, "read", token).status_code == 200
    assert keys.get(key.id).last_used_at == NOW
    clock.advance(seconds=31)
    assert call(client, "read", token).status_code == 200
    assert keys.get(key.id).last_used_at == NOW + timedelta(seconds=61)


def test_a_noisy_key_gets_429_and_another_key_goes_on(
    start: Callable[..., Any], meter: Meter
) -> None:
    keys = ApiKeys(meter)
    _noisy, noisy = keys.create("read", name="noisy")
    _quiet, quiet = keys.create("read", name="quiet")
    _app, client = start(api_rate=ApiRate(3, "1m"))
    assert meter.get_limit(RATE_LIMIT) == Limit(
        RATE_LIMIT, maximum=3, period="1m", algorithm="token_bucket"
    )
    for remaining in (2, 1, 0):
        answer = call(client, "read", noisy)
        assert answer.status_code == 200
        assert answer.headers["ratelimit-policy"] == f'"{RATE_LIMIT}";q=3;w=60'
        assert answer.headers["ratelimit"].startswith(f'"{RATE_LIMIT}";r={remaining};t=')
    assert call(client, "read").status_code == 401  # no key: refused, charged to nobody
    for _ in range(3):
        denied = call(client, "read", noisy)
        body = assert_problem(denied, 429, "rate-limited")
        assert body["detail"] == ("this API key sent too many requests: retry after 20 seconds")
        assert denied.headers["retry-after"] == "20"  # a token every 20 s
        assert denied.headers["ratelimit"].startswith(f'"{RATE_LIMIT}";r=0;t=')
        assert denied.headers["ratelimit-policy"] == f'"{RATE_LIMIT}";q=3;w=60'
    assert call(client, "read", quiet).status_code == 200
    assert call(client, "ingest", noisy).status_code == 429  # the key is spent, not the route
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    clock.advance(seconds=20)
    assert call(client, "read", noisy).status_code == 200


@pytest.mark.postgres
def test_a_key_whose_charge_meets_the_database_down_gets_a_503_problem(
    serve_api: Serve, postgres_server: PostgresServer, pg_url: str, tmp_path: Path
) -> None:
    """The database goes away after the key was checked, while its request is
    charged (its counter locked meanwhile: the charge's connection is cut and
    no other is let in): a 503 problem, as every route answers; back, the key
    goes on."""
    with Meter(pg_url, clock=FrozenClock(NOW)) as meter:
        _key, token = ApiKeys(meter).create("read")
        settings = Settings(
            meter.url, f"sqla+sqlite:///{tmp_path}/broker.db", api_rate=ApiRate(9, "1m")
        )
        client = http_client(base_url=serve_api(create_api(settings, meter=meter)), timeout=30)
        name = make_url(pg_url).database
        with (
            client,
            meter.sql_engine.connect() as blocker,
            psycopg.connect(_libpq(postgres_server.url()), autocommit=True) as admin,
        ):
            assert call(client, "read", token).status_code == 200  # its last use written
            blocker.execute(
                text("SELECT 1 FROM counters WHERE limit_name = :l FOR UPDATE"), {"l": RATE_LIMIT}
            )
            blocker_pid = blocker.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(call, client, "read", token)
                charge = _blocked_by(admin, blocker_pid)
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                try:
                    admin.execute("SELECT pg_terminate_backend(%s)", [charge])
                    refused = answer.result()
                finally:
                    admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            blocker.rollback()
            assert_problem(refused, 503, "database-unavailable")
            assert refused.headers["retry-after"] == "5"
            assert call(client, "read", token).status_code == 200


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _blocked_by(admin: psycopg.Connection[Any], blocker: int) -> int:
    """The backend that waits for ``blocker``'s lock (polled, not slept for)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [blocker]
        ).fetchone()
        if row is not None:
            return int(row[0])
        assert time.monotonic() < deadline, "the charge never waited for the locked counter"
        time.sleep(0.002)


def test_without_keys_the_api_is_open_until_one_is_created(
    start: Callable[..., Any], meter: Meter
) -> None:
    """``METERING_API_AUTH=auto``: a first ``metering serve`` works; once a key
    exists (even revoked) a request without one is 401, from the next request."""
    _app, client = start(api_rate=ApiRate(1, "1h"))
    for _ in range(3):  # unmetered: no key to charge
        assert call(client, "read").status_code == 200
    assert_problem(call(client, "read", "mk_0123456789ab_" + "A" * 43), 401, "unauthorized")
    key, _token = ApiKeys(meter).create("read")
    ApiKeys(meter).revoke(key.id)
    assert_problem(call(client, "read"), 401, "unauthorized")


def test_a_key_another_process_creates_closes_the_api_within_a_second(
    start: Callable[..., Any], meter: Meter
) -> None:
    """Another process's key is a row this process did not write: an open API
    looks again once a second (on the database's clock)."""
    _app, client = start()
    assert call(client, "read").status_code == 200
    meter.database.run(lambda c: ApiKeyStore(c).insert("mk_0123456789ab", "0" * 64, "read", "", 0))
    assert call(client, "read").status_code == 200  # "no key" still believed
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    clock.advance(seconds=1)
    assert_problem(call(client, "read"), 401, "unauthorized")
    clock.advance(seconds=-5)  # and for good, whatever the clock does
    assert_problem(call(client, "read"), 401, "unauthorized")


def test_required_refuses_everything_until_there_is_a_key(
    start: Callable[..., Any], meter: Meter
) -> None:
    _app, client = start(api_auth="required")
    for scope in ROUTES:
        assert_problem(call(client, scope), 401, "unauthorized")
    _key, token = ApiKeys(meter).create("admin")
    assert call(client, "admin", token).status_code == 200


def test_a_key_not_checked_for_the_database_is_503(start: Callable[..., Any], meter: Meter) -> None:
    _key, token = ApiKeys(meter).create("read")
    app, client = start()

    def down(_token: str) -> None:
        raise DatabaseUnavailable("database unavailable: connection refused")

    app.state.auth.keys.authenticate = down
    assert_problem(call(client, "read", token), 503, "database-unavailable")


def test_the_schema_declares_401_403_and_429_as_problems(start: Callable[..., Any]) -> None:
    _app, client = start()
    schema = client.get("/openapi.json").json()
    guarded = [
        (path, method, operation)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        if path.startswith("/v1/")
    ]
    assert {(path, method) for path, method, _ in guarded} >= {
        ("/v1/events", "post"),
        ("/v1/check", "post"),
        ("/v1/subjects/{subject}/usage", "get"),
        ("/v1/webhooks/endpoints", "get"),
        ("/v1/limits/{name}", "put"),
    }
    for _path, _method, operation in guarded:
        for status in ("401", "403", "429"):
            content = operation["responses"][status]["content"]
            assert content == {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}
