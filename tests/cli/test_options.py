"""The options and callbacks several commands share (`cli/options.py`): charges
split from the right, metadata as KEY=VALUE, times and seconds checked, one
way to give charges, and decorators stacked in the order written."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import click
import pytest

from metering.cli.options import (
    chosen_charges,
    parse_charge,
    parse_charges,
    parse_datetime,
    parse_meta,
    parse_seconds,
    stacked,
)

CONTEXT = click.Context(click.Command("x"))
SINCE = click.Option(["--since"])
TIMEOUT = click.Option(["--timeout"], type=float)


def test_a_charge_is_split_from_the_right() -> None:
    assert parse_charge("org:calls:3") == ("org", "calls", 3)
    assert parse_charge("urn:org:7:calls:1") == ("urn:org:7", "calls", 1)
    assert parse_charges(CONTEXT, SINCE, ["a:b:1", "c:d:2"]) == [("a", "b", 1), ("c", "d", 2)]
    with pytest.raises(click.BadParameter, match="is not SUBJECT:LIMIT:COST"):
        parse_charge("org:calls")
    with pytest.raises(click.BadParameter, match="cost 'x' in 'org:calls:x' is not a whole number"):
        parse_charge("org:calls:x")


def test_metadata_is_key_equals_value_and_none_when_empty() -> None:
    assert parse_meta(CONTEXT, SINCE, ["route=/a=b", "user="]) == {"route": "/a=b", "user": ""}
    assert parse_meta(CONTEXT, SINCE, []) is None
    for bad in ("route", "=x"):
        with pytest.raises(click.BadParameter, match="is not KEY=VALUE"):
            parse_meta(CONTEXT, SINCE, [bad])


def test_a_time_option_is_rfc_3339_naive_meaning_utc() -> None:
    assert parse_datetime(CONTEXT, SINCE, "2026-11-22T12:00") == datetime(
        2026, 11, 22, 12, tzinfo=UTC
    )
    assert parse_datetime(CONTEXT, SINCE, "2026-11-22") == datetime(2026, 11, 22, tzinfo=UTC)
    assert parse_datetime(CONTEXT, SINCE, None) is None
    with pytest.raises(click.BadParameter, match="is not an RFC 3339 time"):
        parse_datetime(CONTEXT, SINCE, "yesterday")


def test_seconds_are_finite_from_zero_to_the_maximum() -> None:
    parse = parse_seconds(60)
    assert parse(CONTEXT, TIMEOUT, 0.5) == 0.5
    assert parse(CONTEXT, TIMEOUT, 60) == 60
    for bad in (-1, 61, float("nan"), float("inf")):
        with pytest.raises(click.BadParameter):
            parse(CONTEXT, TIMEOUT, bad)


def test_charges_come_as_arguments_or_as_options_never_both() -> None:
    assert chosen_charges("org", "calls", None, []) == [("org", "calls", 1)]
    assert chosen_charges("org", "calls", 4, []) == [("org", "calls", 4)]
    assert chosen_charges(None, None, None, [("a", "b", 2)]) == [("a", "b", 2)]
    with pytest.raises(click.UsageError, match="not both"):
        chosen_charges("org", None, None, [("a", "b", 2)])
    with pytest.raises(click.UsageError, match="give SUBJECT and LIMIT"):
        chosen_charges("org", None, None, [])


def test_stacked_decorators_apply_as_written_top_down() -> None:
    applied: list[str] = []

    def mark(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
        def decorate(func: Callable[[], str]) -> Callable[[], str]:
            applied.append(name)
            return lambda: f"{name}({func()})"

        return decorate

    @stacked(mark("top"), mark("bottom"))
    def command() -> str:
        return "command"

    assert applied == ["bottom", "top"]  # the one nearest the function first, as written
    assert command() == "top(bottom(command))"
