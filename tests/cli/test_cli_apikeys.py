"""``metering apikeys create|list|revoke`` (`metering/cli/apikeys.py`) through
click's CliRunner on a SQLite file: the key printed once, alone on stdout;
listed without it; revoked by id or by the whole key; a read key of one
subject; bad input one line that stores nothing."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

from metering.apikeys import token_hash
from metering.cli import main

Run = Callable[..., Result]


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite file (a copy of the session's template)."""
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


def test_a_read_key_of_one_subject_is_created_and_listed(url: str) -> None:
    runner = CliRunner()
    made = runner.invoke(
        main, ["--database", url, "apikeys", "create", "--scope", "read", "--subject", "org-1"]
    )
    assert made.exit_code == 0, made.output
    assert "subject org-1" in made.stderr
    listed = runner.invoke(main, ["--database", url, "apikeys", "list", "--format", "json"])
    assert '"subject": "org-1"' in listed.output
    bad = runner.invoke(
        main, ["--database", url, "apikeys", "create", "--scope", "ingest", "--subject", "org-1"]
    )
    assert bad.exit_code != 0
    assert bad.output.strip().startswith("error:") and "Traceback" not in bad.output
