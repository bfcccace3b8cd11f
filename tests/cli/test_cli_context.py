"""The command line's one error path (`metering/cli/context.py`): a usage
error is one ``error:`` line with a hint (a negative number named as the
argument it was meant for, a global option given after the command, the
nearest command or defined limit); the database URL is chosen once, the
`Meter` opened on first use and closed with the command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from metering import Limit, Meter
from metering.cli import main
from metering.cli.context import MAX_ERROR_CHARS, AppState, current_meter, data_directory

Run = Callable[..., Result]


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite file (a copy of the session's template)."""
    return sqlite_url


@pytest.fixture
def run(url: str) -> Run:
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(main, ["--database", url, *args])

    return invoke


def assert_one_line_error(result: Result, *needles: str) -> str:
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["grants", "add", "org-1", "api", "-5"],
            "error: AMOUNT must be a whole number of at least 1, got -5",
        ),
        (
            ["entitlements", "set", "org-1", "api", "-5"],
            "error: MAXIMUM must be a whole number of at least 1, got -5",
        ),
        (
            ["webhooks", "replay", "-3"],
            "error: DELIVERY_IDS must be a whole number of at least 1, got -3",
        ),
        (
            ["consume", "-5", "api"],
            "error: -5 is not an option; an argument that starts with '-' goes after '--' "
            "(metering ... -- -5) (see 'metering consume --help')",
        ),
    ],
    ids=["grant amount", "entitlement maximum", "delivery ids", "a subject"],
)
def test_a_negative_number_is_named_as_the_argument_it_was_meant_for(
    run: Run, url: str, args: list[str], message: str
) -> None:
    run("limits", "set", "api", "--max", "5", "--period", "1h")
    assert assert_one_line_error(run(*args)) == message
    with Meter(url) as meter:
        assert meter.grants() == [] and meter.counters() == []


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["status", "--database", "sqlite:///x.db"], "metering --database URL status ..."),
        (["limits", "list", "--database=sqlite:///x.db"], "metering --database URL limits list"),
        (["report", "overage", "--database", "x"], "metering --database URL report overage"),
    ],
)
def test_a_global_option_after_the_command_says_where_it_goes(
    run: Run, args: list[str], shown: str
) -> None:
    line = assert_one_line_error(run(*args))
    assert line.startswith(
        "error: --database is an option of metering itself: give it before the command ("
    )
    assert shown in line


def test_an_unknown_option_is_still_click_s_message(run: Run) -> None:
    line = assert_one_line_error(run("consume", "v", "api", "--bogus"))
    assert line == (
        "error: No such option '--bogus'. Did you mean '--cost'? (see 'metering consume --help')"
    )


def test_an_unknown_command_suggests_the_nearest(run: Run) -> None:
    assert_one_line_error(run("limts"), "no such command 'limts'; did you mean 'limits'?")
    assert_one_line_error(run("repot"), "did you mean 'report'")
    line = assert_one_line_error(run("xyzzy"), "no such command 'xyzzy'")
    assert "did you mean" not in line
    assert_one_line_error(run("limits", "lst"), "'list'")


def test_an_unknown_limit_suggests_the_nearest_defined_ones(run: Run, url: str) -> None:
    with Meter(url) as meter:
        meter.set_limit(Limit("send_message", 5, "1m"))
    assert_one_line_error(
        run("limits", "delete", "sendmessage"),
        "unknown limit 'sendmessage': did you mean 'send_message'?",
    )
    line = assert_one_line_error(run("limits", "delete", "nope"), "no limit 'nope' to delete")
    assert "limits set" not in line
    assert_one_line_error(run("consume", "org-1", "send_mesage"), "did you mean 'send_message'?")
    assert_one_line_error(run("consume", "org-1", "nope"), "define it with `metering limits set`")
    with Meter(url) as meter:
        assert [limit.name for limit in meter.list_limits()] == ["send_message"]


def test_the_meter_is_opened_on_first_use_and_closed_with_the_command(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[Meter] = []
    real_close = Meter.close

    def close(meter: Meter) -> None:
        closed.append(meter)
        real_close(meter)

    @click.command()
    def probe() -> None:
        first, again = current_meter(), current_meter()
        assert first is again and first.url == url
        opened.append(first)

    monkeypatch.setattr(Meter, "close", close)
    opened: list[Meter] = []
    with click.Context(probe, obj=AppState(url)) as root:
        with root.scope():
            probe.invoke(root)
        assert len(opened) == 1 and closed == []  # open until the command's context ends
    assert closed == opened
    unset = click.Context(probe)
    with pytest.raises(click.ClickException, match="no database configured"), unset.scope():
        current_meter()


def test_the_data_directory_is_metering_home_or_made_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("METERING_HOME", raising=False)
    assert data_directory() == tmp_path / ".metering" and (tmp_path / ".metering").is_dir()
    monkeypatch.setenv("METERING_HOME", str(tmp_path / "home" / "deep"))
    assert data_directory() == tmp_path / "home" / "deep"


def test_a_library_error_is_one_line_cut_to_its_bound(run: Run) -> None:
    line = assert_one_line_error(run("consume", "org", "x" * 5000))
    assert len(line) <= len("error: ") + MAX_ERROR_CHARS + 3
