"""Tables that fit: the real `metering` command (a process of its own,
forked from one that imported the CLI: `forked_metering`) in a
pseudo-terminal of 80 and 100 columns wraps no subject, limit or id;
columns zero in every row fold away; headers shorten before cells do;
piped, the table is plain."""

from __future__ import annotations

import fcntl
import functools
import os
import pty
import re
import struct
import subprocess
import termios
from collections.abc import Callable
from pathlib import Path

import pytest

from metering import Limit, Meter
from metering.cli.tables import _compact, _wrap, table

SUBJECTS = ("org-acme-corporation", "alice@example.com", "org:globex")
LIMITS = ("api_calls_monthly", "exports_shadow", "send_message", "calls", "spend")
RESERVATION = "reservation-0001"
# A terminal's styles (bold headers): not text.
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('tables')}/tables.db"
    with Meter(url) as meter:
        meter.set_limits(
            [
                Limit(
                    "api_calls_monthly",
                    1_000_000,
                    "1mo",
                    window="calendar",
                    enforcement="soft",
                    thresholds=(80, 100),
                ),
                Limit("send_message", 5, "1m"),
                Limit("exports_shadow", 3, "1d", window="calendar", enforcement="shadow"),
                Limit("calls", 100_000, "1mo", window="calendar"),
                Limit("spend", 5, "1mo", window="calendar", currency="USD"),
            ]
        )
        meter.set_price("calls", "0.002", "USD")
        meter.consume("org-acme-corporation", "api_calls_monthly", cost=1_234_567)
        for number in range(7):
            meter.consume("org:globex", "send_message", event_id=f"message-{number}")
            meter.consume("alice@example.com", "exports_shadow", event_id=f"export-{number}")
        meter.consume("org:globex", "calls", cost=20)
        meter.consume("org:globex", "calls", cost=10)
        meter.void("message-0", "sent twice by a retrying client")
        meter.reserve(charges=[("org:globex", "calls", 5)], event_id=RESERVATION)
    return url


@pytest.fixture
def in_terminal(forked_metering: Path) -> Callable[..., str]:
    return functools.partial(_in_terminal, forked_metering)


def _in_terminal(metering: Path, database: str, columns: int, *args: str) -> str:
    """What `metering ARGS` shows in a pseudo-terminal ``columns`` wide."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {
        **os.environ,
        "COLUMNS": str(columns),
        "NO_COLOR": "1",
        "METERING_DATABASE_URL": database,
    }
    process = subprocess.Popen(
        [metering, *args],
        stdin=follower,
        stdout=follower,
        stderr=subprocess.DEVNULL,  # a progress bar, when a terminal
        env=env,
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert process.wait(timeout=60) == 0, shown.decode()
    return ESCAPES.sub("", shown.decode().replace("\r\n", "\n"))


COMMANDS = {
    "overage": (["report", "overage"], SUBJECTS, LIMITS[:3]),
    "usage": (["report", "usage", "--subject", "org:globex"], ("org:globex",), LIMITS[2:]),
    "counters": (["counters"], SUBJECTS, LIMITS),
    "limits": (["limits", "list"], (), LIMITS),
    "corrections": (["corrections", "list"], ("message-0",), ()),
    "reservations": (["reservations", "list"], (RESERVATION,), ()),
}


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 100])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_name_wraps_in_a_terminal(
    in_terminal: Callable[..., str], database: str, name: str, columns: int
) -> None:
    args, subjects, limits = COMMANDS[name]
    shown = in_terminal(database, columns, *args)
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= columns, shown
    for whole in (*subjects, *limits):
        assert any(whole in line for line in lines), (whole, shown)


@pytest.mark.slow
def test_zero_columns_fold_away_and_headers_shorten_before_cells(
    in_terminal: Callable[..., str], database: str
) -> None:
    wide = in_terminal(database, 100, "report", "overage")
    header = next(line for line in wide.splitlines() if "subject" in line)
    assert "overdraft" not in header and "granted" not in header
    assert "zero in every row: granted, overdraft" in wide
    assert "1,234,567" in wide  # cells whole at 100 columns
    narrow = in_terminal(database, 80, "report", "overage")
    assert "max" in narrow and "maximum" not in narrow


@pytest.mark.slow
def test_piped_output_is_the_plain_table(forked_metering: Path, database: str) -> None:
    env = {**os.environ, "METERING_DATABASE_URL": database}
    piped = subprocess.run(
        [forked_metering, "report", "overage"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert "1,234,567" in piped and "org-acme-corporation" in piped
    assert not {"│", "━", "─", "\x1b"} & set(piped)
    assert all(line == line.rstrip() for line in piped.splitlines())
    rows = piped.splitlines()[3:-1]  # after the title and the header, before the caption
    assert len(rows) == 5 and not any(row.startswith(" ") for row in rows), piped  # no cell wraps


def test_a_table_gives_up_rules_zeros_headers_then_cells() -> None:
    rows = [["org:globex", "send_message", "1,234,567", "0", "2026-11-29 10:00\u201310:01"]]
    columns = ["subject", "limit", "maximum", "granted", "window (UTC)"]
    numeric = {"maximum", "granted"}
    ruled = table(columns, rows, numeric=numeric, width=100)
    assert ruled.box is not None and ruled.show_edge
    assert [str(c.header) for c in ruled.columns] == ["subject", "limit", "maximum", "window (UTC)"]
    narrow = table(columns, rows, numeric=numeric, width=50)
    assert not narrow.show_edge
    assert [c.no_wrap for c in narrow.columns] == [True, True, True, False]
    squeezed = table(columns, rows, numeric=numeric, width=40)
    assert [str(c.header) for c in squeezed.columns][2] == "max"
    assert [str(cell) for cell in squeezed.columns[2].cells] == ["1.2M"]


def test_cells_wrap_between_words_and_numbers_compact_down() -> None:
    assert _wrap("2026-11-29 00:19:23\u201300:20:23", 10) == "2026-11-29\n00:19:23\u2013\n00:20:23"
    assert [_compact(n) for n in ("1,234,567", "234,567", "999,999", "9,999", "123.5")] == [
        "1.2M",
        "234k",
        "999k",
        "9,999",
        "123",
    ]
    assert _compact("0.05 USD") == "0.05"  # the limit's name says it is money
