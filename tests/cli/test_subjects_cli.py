"""`metering subjects set|show|list`: a subject's time zone set, shown and listed (text
and JSON); an unknown zone one line on stderr, exit 1, nothing stored; `metering
counters` and `metering usage` show a zoned window's local label beside its UTC
instants. CliRunner on SQLite."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from metering import FrozenClock, Limit, Meter
from metering.cli import main


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite database (a copy of the session's template)."""
    return sqlite_url


def run(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--database", url, *args])
    return result.exit_code, result.output


def test_a_zone_is_set_shown_and_listed(url: str) -> None:
    code, out = run(url, "subjects", "set", "org-42", "--timezone", "Asia/Kolkata")
    assert code == 0 and out.startswith("set org-42: time zone Asia/Kolkata since ")
    code, out = run(url, "subjects", "show", "org-42", "--format", "json")
    shown = json.loads(out)
    assert (shown["subject"], shown["time_zone"]) == ("org-42", "Asia/Kolkata")
    code, out = run(url, "subjects", "show", "org-7")
    assert (code, out) == (0, "org-7: time zone UTC\n")
    code, out = run(url, "subjects", "list")
    assert code == 0 and "org-42" in out and "Asia/Kolkata" in out
    assert "subjects" in run(url, "--help")[1]


def test_an_unknown_zone_is_one_line_and_stores_nothing(url: str) -> None:
    code, out = run(url, "subjects", "set", "org-42", "--timezone", "Asia/Atlantis")
    assert code == 1
    assert out.startswith("error: time_zone: 'Asia/Atlantis' is not an IANA time zone")
    assert out.count("\n") == 1
    assert run(url, "subjects", "list")[1] == "no subject has a time zone\n"


def test_counters_show_the_local_label(url: str) -> None:
    with Meter(url, clock=FrozenClock(datetime(2026, 3, 20, tzinfo=UTC))) as meter:
        meter.set_limit(Limit("daily", maximum=5, period="1d", window="calendar"))
        meter.set_time_zone("org-berlin", "Europe/Berlin")
        meter.clock.set(datetime(2026, 3, 29, 12, tzinfo=UTC))  # type: ignore[attr-defined]
        meter.consume("org-berlin", "daily", 2)
    code, out = run(url, "counters", "--subject", "org-berlin")
    assert code == 0 and "(local 2026-03-29 Europe/Berlin)" in out
    code, out = run(url, "counters", "--subject", "org-berlin", "--format", "json")
    [counter] = json.loads(out)
    assert counter["window_start"] == "2026-03-28T23:00:00+00:00"
    assert counter["time_zone"] == "Europe/Berlin"
    assert counter["local_window"] == "2026-03-29 Europe/Berlin"


def test_usage_shows_the_local_label(url: str) -> None:
    """The CLI reads the system clock: the zone is set long before, in force now."""
    with Meter(url, clock=FrozenClock(datetime(2020, 1, 1, tzinfo=UTC))) as meter:
        meter.set_limit(Limit("daily", maximum=5, period="1d", window="calendar"))
        meter.set_limit(Limit("hourly", maximum=5, period="1h", window="calendar"))
        meter.set_time_zone("org-berlin", "Europe/Berlin")
    for limit in ("daily", "hourly"):
        assert run(url, "consume", "org-berlin", limit)[0] == 0
    code, out = run(url, "usage", "org-berlin", "--format", "json")
    found = {usage["limit"]: usage for usage in json.loads(out)}
    assert found["daily"]["time_zone"] == "Europe/Berlin"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d Europe/Berlin", found["daily"]["local_window"])
    # An hour is aligned in UTC, whatever the subject's zone.
    assert (found["hourly"]["time_zone"], found["hourly"]["local_window"]) == (None, None)
    code, out = run(url, "usage", "org-berlin")
    assert code == 0 and f"(local {found['daily']['local_window']})" in out
