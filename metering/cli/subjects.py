"""``metering subjects set|show|list``: a subject's own settings (its time zone).

``metering subjects set org-42 --timezone Asia/Kolkata`` aligns org-42's calendar windows
of days and months on its local midnight, from the end of each current window on
(`metering.domain.zones`); an unknown zone name is refused and changes nothing.
"""

from __future__ import annotations

import json
from typing import Final

import click

from metering.allowances.zones import SubjectZone
from metering.cli.context import SentenceGroup, current_meter
from metering.cli.options import format_option
from metering.cli.output import echo_listing, when

SUBJECT_COLUMNS: Final = ("subject", "time zone", "since")


def describe_zone(found: SubjectZone) -> str:
    since = "" if found.since is None else f" since {when(found.since)}"
    return f"{found.subject}: time zone {found.time_zone}{since}"


def _echo(found: SubjectZone, fmt: str, prefix: str = "") -> None:
    if fmt == "json":
        click.echo(json.dumps(found.to_dict(), indent=2))
    else:
        click.echo(prefix + describe_zone(found))


@click.group(cls=SentenceGroup)
def subjects() -> None:
    """A subject's own settings: its time zone."""


@subjects.command("set")
@click.argument("subject")
@click.option(
    "--timezone",
    "time_zone",
    required=True,
    metavar="ZONE",
    help="An IANA time zone (Asia/Kolkata, UTC): days and months start at its midnight.",
)
@format_option
def subjects_set(subject: str, time_zone: str, fmt: str) -> None:
    """Give SUBJECT a time zone, from the end of each current window on."""
    _echo(current_meter().set_time_zone(subject, time_zone), fmt, "set ")


@subjects.command("show")
@click.argument("subject")
@format_option
def subjects_show(subject: str, fmt: str) -> None:
    """SUBJECT's time zone (UTC when it was never given one)."""
    _echo(current_meter().subject_zone(subject), fmt)


@subjects.command("list")
@format_option
def subjects_list(fmt: str) -> None:
    """The subjects given a time zone."""
    found = current_meter().subject_zones()
    echo_listing(found, fmt, "no subject has a time zone", SUBJECT_COLUMNS, _row)


def _row(found: SubjectZone) -> list[object]:
    return [found.subject, found.time_zone, when(found.since)]
