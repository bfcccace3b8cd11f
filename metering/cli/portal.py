"""``metering portal link SUBJECT --ttl 1h``: a signed link to a customer's usage page.

The link holds the subject and an expiry, signed with a secret kept in the
database (made on first use); never an API key. It is made under
``--base-url``, else ``METERING_PUBLIC_URL``, else a local server. Prints the link alone on
stdout (``LINK=$(metering portal link org-1)``). ``metering portal rotate
--grace 1d`` signs with a new secret; links made before work until the grace ends.
"""

from __future__ import annotations

import click

from metering.cli.context import SentenceGroup, current_meter
from metering.cli.output import when
from metering.domain.links import parse_ttl
from metering.usage.portal import parse_grace


@click.group(cls=SentenceGroup)
def portal() -> None:
    """The usage page customers open (GET /portal, docs/portal.md)."""


@portal.command("link")
@click.argument("subject")
@click.option("--ttl", default="1h", show_default=True, help="How long it works: 30m, 1h, 7d.")
@click.option(
    "--base-url",
    default=None,
    help="Where `metering serve` answers the customer "
    "[default: METERING_PUBLIC_URL, else http://127.0.0.1:8000].",
)
def link(subject: str, ttl: str, base_url: str | None) -> None:
    """Print a link to SUBJECT's usage page that works for --ttl."""
    click.echo(current_meter().portal_link(subject, parse_ttl(ttl), base_url=base_url))


@portal.command("rotate")
@click.option(
    "--grace",
    default="1d",
    show_default=True,
    help="How long links made before still work: 0, 30m, 1h, 7d (31 days at most).",
)
def rotate(grace: str) -> None:
    """Sign links with a new secret; links made before work until --grace ends."""
    until = current_meter().rotate_portal_secret(parse_grace(grace))
    click.echo(f"rotated: links made before now work until {when(until)}")
