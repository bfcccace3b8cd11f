"""API keys: ``metering apikeys`` through click's CliRunner on a SQLite file,
the service's rules, and the settings of the API's keys.

The HTTP side (401, 403, 429, revocation, the table's contents on
PostgreSQL too) is in tests/api/test_api_auth.py.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner, Result

from metering import FrozenClock, Meter
from metering.apikeys import ApiKeys, key_id_of, token_hash
from metering.cli import main
from metering.errors import ConfigurationError, InvalidInput, UnknownApiKey
from metering.settings import DEFAULT_API_RATE, ApiRate, Settings, api_rate, auth_mode, parse_rate

Run = Callable[..., Result]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite database (a copy of the session's template)."""
    return sqlite_url


@pytest.fixture
def run(url: str) -> Run:
    """``metering --database URL ARGS...``, its exit code checked."""
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> Result:
        result = runner.invoke(main, ["--database", url, *args])
        assert result.exit_code == code, (result.output, result.exception)
        return result

    return invoke


def rows(url: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        return connection.execute("SELECT * FROM api_keys").fetchall()


def test_create_prints_the_key_once_alone_on_stdout(run: Run, url: str) -> None:
    created = run("apikeys", "create", "--scope", "ingest", "--name", "billing service")
    [token] = created.stdout.splitlines()
    assert token.startswith("mk_") and len(token) == 3 + 12 + 1 + 43
    key_id = token[:15]
    assert created.stderr == (
        f"created {key_id} (scope ingest): store the key now, it is not shown again\n"
    )
    listed = run("apikeys", "list", "--format", "json")
    assert token not in listed.output and token[16:] not in listed.output
    [shown] = json.loads(listed.stdout)
    assert shown["id"] == key_id
    assert (shown["scope"], shown["name"], shown["revoked_at"], shown["last_used_at"]) == (
        "ingest",
        "billing service",
        None,
        None,
    )
    table = run("apikeys", "list").stdout
    assert key_id in table and "billing service" in table and "active" in table
    assert token[16:] not in table
    # Stored: the id and the hash, never the key.
    [(stored_id, stored_hash, *_rest)] = rows(url)
    assert (stored_id, stored_hash) == (key_id, token_hash(token))


def test_revoke_by_id_and_again(run: Run) -> None:
    token = run("apikeys", "create", "--scope", "read").stdout.strip()
    key_id = token[:15]
    assert run("apikeys", "revoke", key_id).stdout == f"revoked {key_id}\n"
    assert run("apikeys", "revoke", key_id).stdout == f"{key_id} was already revoked\n"
    [shown] = json.loads(run("apikeys", "list", "--format", "json").stdout)
    assert shown["revoked_at"] is not None
    assert "revoked " in run("apikeys", "list").stdout


def test_a_whole_key_names_its_id(run: Run) -> None:
    token = run("apikeys", "create", "--scope", "admin").stdout.strip()
    assert run("apikeys", "revoke", token).stdout == f"revoked {token[:15]}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create",), "error: Missing option '--scope'"),
        (("create", "--scope", "owner"), "error: Invalid value for '--scope': 'owner'"),
        (("create", "--scope", "read", "--name", "x" * 201), "error: name: must be at most 200"),
        (("create", "--scope", "read", "--name", "tab\there"), "error: name: 'tab\\there' has"),
        (("revoke",), "error: Missing argument 'ID'"),
        (("revoke", "key-1"), "error: id: 'key-1' is not an API key id"),
        (("revoke", "mk_0123456789ab"), "error: unknown API key 'mk_0123456789ab'"),
        (("revoke", "mk_0123456789AB"), "error: id: 'mk_0123456789AB' is not an API key id"),
    ],
)
def test_bad_input_is_one_line_and_stores_nothing(
    run: Run, url: str, args: tuple[str, ...], message: str
) -> None:
    run("apikeys", "list")  # the schema exists
    result = run("apikeys", *args, code=1)
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(message), line
    assert rows(url) == []


def test_an_empty_listing_says_so(run: Run) -> None:
    assert run("apikeys", "list").stdout == "no API keys\n"
    assert json.loads(run("apikeys", "list", "--format", "json").stdout) == []


# -- the service ---------------------------------------------------------------


@pytest.fixture
def meter(url: str) -> Meter:
    return Meter(url, clock=FrozenClock(NOW))


def test_authenticate_knows_the_token_and_nothing_like_it(meter: Meter) -> None:
    keys = ApiKeys(meter)
    key, token = keys.create("read", name=" reports ")
    assert key.name == "reports" and key.created_at == NOW
    found = keys.authenticate(token)
    assert found is not None and found.id == key.id and found.allows("read")
    secret = token[16:]
    flipped = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    other_id = "mk_" + ("0" * 12 if key.id != "mk_" + "0" * 12 else "1" * 12)
    for wrong in (
        "",
        token[:-1],
        token + "x",
        f"{key.id}_{flipped}",  # the right id, another secret
        f"{other_id}_{secret}",  # the right secret, another id
        token.upper(),
        " " + token,
    ):
        assert keys.authenticate(wrong) is None, wrong
    meter.close()


def test_scopes_admin_includes_ingest_and_read(meter: Meter) -> None:
    keys = ApiKeys(meter)
    grants = {}
    for scope in ("ingest", "read", "admin"):
        key, _token = keys.create(scope)
        grants[scope] = {s for s in ("ingest", "read", "admin") if key.allows(s)}
    assert grants == {
        "ingest": {"ingest"},
        "read": {"read"},
        "admin": {"ingest", "read", "admin"},
    }
    with pytest.raises(InvalidInput, match="scope: must be one of ingest, read, admin"):
        keys.create("owner")
    meter.close()


def test_last_use_is_written_at_most_once_a_minute(meter: Meter, url: str) -> None:
    keys = ApiKeys(meter)
    key, token = keys.create("ingest")
    assert keys.get(key.id).last_used_at is None
    clock = meter.clock
    assert isinstance(clock, FrozenClock)
    keys.authenticate(token)
    assert keys.get(key.id).last_used_at == NOW
    clock.advance(seconds=59)
    keys.authenticate(token)
    assert keys.get(key.id).last_used_at == NOW  # no write within the minute
    clock.advance(seconds=1)
    keys.authenticate(token)
    assert keys.get(key.id).last_used_at == NOW + timedelta(seconds=60)
    meter.close()


def test_a_revoked_key_no_longer_authenticates(meter: Meter) -> None:
    keys = ApiKeys(meter)
    key, token = keys.create("admin")
    assert keys.revoke(key.id) is True
    assert keys.authenticate(token) is None
    assert keys.revoke(key.id) is False
    assert keys.get(key.id).revoked_at == NOW
    assert not keys.get(key.id).allows("read")
    assert keys.any_exist()
    with pytest.raises(UnknownApiKey):
        keys.revoke("mk_ffffffffffff")
    with pytest.raises(InvalidInput):
        key_id_of("mk_")
    meter.close()


# -- settings ---------------------------------------------------------------------


def test_the_api_settings_and_their_defaults() -> None:
    assert Settings.from_env({}).api_auth == "auto"
    assert Settings.from_env({}).api_rate == DEFAULT_API_RATE == ApiRate(6000, "1m")
    assert auth_mode({"METERING_API_AUTH": " Required "}) == "required"
    assert api_rate({"METERING_API_RATE": "off"}) is None
    assert parse_rate("600/1m") == ApiRate(600, "1m")
    assert parse_rate("120/60s") == ApiRate(120, "1m")
    assert parse_rate(" 10 / 1s ") == ApiRate(10, "1s")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"METERING_API_AUTH": "off"}, "METERING_API_AUTH must be auto or required"),
        ({"METERING_API_RATE": "600"}, "METERING_API_RATE must be N/PERIOD"),
        ({"METERING_API_RATE": "x/1m"}, "METERING_API_RATE must be N/PERIOD"),
        ({"METERING_API_RATE": "-1/1m"}, "METERING_API_RATE must be N/PERIOD"),
        ({"METERING_API_RATE": "0/1m"}, "N must be from 1"),
        ({"METERING_API_RATE": "5/1mo"}, "the period must be in s, m, h, d or w"),
        ({"METERING_API_RATE": "5/soon"}, "is not a period"),
        ({"METERING_API_RATE": "9" * 40 + "/1m"}, "METERING_API_RATE must be N/PERIOD"),
    ],
)
def test_bad_api_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env(env)
