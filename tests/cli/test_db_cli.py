"""``metering db upgrade`` (`cli/db.py`): a new SQLite file gets the schema at
the current revision, again harmlessly; the URL is shown without its password."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from metering.cli import main
from metering.storage.health import DatabaseProbe
from metering.storage.schema_revision import SCHEMA_REVISION


def test_upgrade_makes_the_schema_of_a_new_file_and_says_where(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    for _ in range(2):
        result = CliRunner().invoke(main, ["--database", url, "db", "upgrade"])
        assert result.exit_code == 0, result.output
        assert result.output == f"schema at revision {SCHEMA_REVISION} ({url})\n"
    probe = DatabaseProbe(url)
    try:
        assert probe.schema().at_head
    finally:
        probe.close()


def test_upgrade_of_an_unreachable_server_is_one_error_line_without_the_password() -> None:
    url = "postgresql://user:s3cret@127.0.0.1:1/none?connect_timeout=2"
    result = CliRunner().invoke(main, ["--database", url, "db", "upgrade"])
    assert result.exit_code == 1
    assert "s3cret" not in result.output
    assert result.output.startswith("error:") and result.output.count("\n") == 1
