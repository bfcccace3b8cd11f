"""``metering quarantine list|release``: the subjects a limit's runaway
breaker holds to its quarantine maximum (docs/breaker.md), and ending one."""

from __future__ import annotations

import json
from typing import Final

import click

from metering.cli.context import SentenceGroup, current_meter
from metering.cli.options import format_option
from metering.cli.output import echo_listing, when_us
from metering.storage.breakers import Quarantine

QUARANTINE_COLUMNS: Final = ("limit", "subject", "quarantined at")


@click.group(cls=SentenceGroup)
def quarantine() -> None:
    """The subjects a limit's breaker holds: list them, release one."""


@quarantine.command("list")
@format_option
def quarantine_list(fmt: str) -> None:
    """Every quarantined subject, by limit."""
    found = current_meter().quarantines()
    echo_listing(found, fmt, "no subject is quarantined", QUARANTINE_COLUMNS, _row)


@quarantine.command("release")
@click.argument("subject")
@click.argument("limit")
@format_option
def quarantine_release(subject: str, limit: str, fmt: str) -> None:
    """End SUBJECT's quarantine on LIMIT; its baseline starts again."""
    ended = current_meter().release_quarantine(subject, limit)
    if fmt == "json":
        click.echo(json.dumps(ended.to_dict(), indent=2))
    else:
        click.echo(f"released {ended.subject} on {ended.limit}")


def _row(found: Quarantine) -> list[object]:
    return [found.limit, found.subject, when_us(found.quarantined_at_us)]
