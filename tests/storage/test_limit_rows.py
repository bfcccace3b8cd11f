"""`bare_limits` reads a SQLite file's limits as the database stack does, or
answers None and leaves them to a `Meter`; `metering limits list` on such a
file imports no SQLAlchemy."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from metering import Meter
from metering.domain.limits import Limit, spend_limit
from metering.storage.health import sqlite_file
from metering.storage.limit_rows import bare_limits, bare_sqlite_path

LIMITS = [
    Limit("calls", maximum=100, period="1h", thresholds=(50, 80), thresholds_units=(90,)),
    Limit("api", maximum=10, period="10s", algorithm="token_bucket", enforcement="shadow"),
    Limit("seats", maximum=5, period="1mo", window="calendar", distinct="user"),
    Limit("disk", maximum=500, period="1d", aggregation="latest"),
    Limit("routes", maximum=500, period="1d", dimensions=("region", "route")),
    Limit("paced", maximum=1_000, period="1d", pacing=True, burst="5%", lateness="1h"),
    Limit("runaway", maximum=100_000, period="1d", breaker="10x", breaker_floor=0.1),
    Limit("zeta", maximum=3, period="1d", forecast_lead="24h"),
    spend_limit("spend", "50", "USD", "1mo", window="calendar", enforcement="soft"),
]


def test_a_migrated_file_lists_what_a_meter_lists(sqlite_url: str) -> None:
    assert bare_limits(sqlite_url) == []
    with Meter(sqlite_url) as meter:
        meter.set_limits(LIMITS)
        expected = meter.list_limits()
    listed = bare_limits(sqlite_url)
    assert listed == expected
    names = [limit.name for limit in expected if not limit.name.startswith("metering.")]
    assert names == sorted(limit.name for limit in LIMITS)


def test_what_the_bare_read_cannot_answer_is_none(sqlite_url: str, tmp_path: Path) -> None:
    assert bare_limits(f"sqlite:///{tmp_path / 'missing.db'}") is None
    assert not (tmp_path / "missing.db").exists()  # nothing created
    assert bare_limits("sqlite:///:memory:") is None
    assert bare_limits(f"{sqlite_url}?timeout=5") is None
    assert bare_limits("postgresql://localhost/metering") is None
    not_a_database = tmp_path / "notes.db"
    not_a_database.write_text("not a database")
    assert bare_limits(f"sqlite:///{not_a_database}") is None
    path = bare_sqlite_path(sqlite_url)
    assert path is not None
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE alembic_version SET version_num = '0006'")
    assert bare_limits(sqlite_url) is None  # a Meter upgrades it first


def test_a_plain_url_gives_the_path_sqlalchemy_gives() -> None:
    for url in ("sqlite:///metering.db", "sqlite:////var/lib/m.db", "sqlite+pysqlite:///a/b.db"):
        assert bare_sqlite_path(url) == sqlite_file(url)
    assert bare_sqlite_path("sqlite:///metering.db") == Path("metering.db")
    assert bare_sqlite_path("sqlite:////var/lib/m.db") == Path("/var/lib/m.db")
    assert bare_sqlite_path("sqlite+pysqlite:///a/b.db") == Path("a/b.db")
    assert bare_sqlite_path("sqlite:///file:x.db?mode=ro&uri=true") is None
    assert bare_sqlite_path("sqlite:///caf%C3%A9.db") is None


@pytest.mark.slow
def test_limits_list_on_a_sqlite_file_imports_no_database_stack(sqlite_url: str) -> None:
    with Meter(sqlite_url) as meter:
        meter.set_limits(LIMITS[:2])
    script = (
        "import sys\n"
        "from metering.cli import main\n"
        "try:\n"
        "    main(['limits', 'list'])\n"
        "except SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        "stack = ('sqlalchemy', 'psycopg', 'metering.meter')\n"
        "print(sorted(name for name in stack if name in sys.modules))\n"
    )
    env = {**os.environ, "METERING_DATABASE_URL": sqlite_url}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    lines = done.stdout.splitlines()
    assert "calls" in done.stdout and "api" in done.stdout
    assert lines[-1] == "[]"
