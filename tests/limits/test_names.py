"""`LimitNames` (`metering/limits/names.py`): the names no limit has, read again
once when a name is missing; None while the limits cannot be read."""

from __future__ import annotations

from pathlib import Path

from metering import Limit, Meter
from metering.limits.names import LimitNames


def test_unknown_names_come_in_order_once_each(sqlite_url: str) -> None:
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("calls", maximum=5, period="1h"))
    names = LimitNames(sqlite_url)
    try:
        assert names.unknown(["seats", "calls", "api", "seats"]) == ["seats", "api"]
        assert names.unknown(["calls"]) == []
        assert names.unknown([]) == []
    finally:
        names.close()


def test_a_limit_defined_since_is_known_on_the_next_question(sqlite_url: str) -> None:
    names = LimitNames(sqlite_url)
    try:
        assert names.unknown(["calls"]) == ["calls"]
        with Meter(sqlite_url) as meter:
            meter.set_limit(Limit("calls", maximum=5, period="1h"))
        assert names.unknown(["calls"]) == []
    finally:
        names.close()


def test_no_answer_from_a_database_that_is_not_there(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    names = LimitNames(f"sqlite:///{missing}")
    try:
        assert names.unknown(["calls"]) is None
        assert not missing.exists()  # reading creates nothing
    finally:
        names.close()
