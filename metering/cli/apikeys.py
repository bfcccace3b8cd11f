"""``metering apikeys``: keys of the HTTP API (create, list, revoke).

``create`` prints the key once, alone on stdout (``KEY=$(metering apikeys
create --scope ingest)``), and a note on stderr; only its hash is stored.
``list`` never shows a key, only its id (the key's first characters).
"""

from __future__ import annotations

from typing import Final

import click

from metering.apikeys import SCOPES, ApiKey, ApiKeys
from metering.cli.context import SentenceGroup, current_meter
from metering.cli.options import format_option
from metering.cli.output import echo_listing, when

KEY_COLUMNS: Final = ("id", "scope", "subject", "name", "created", "last used", "state")


def _keys() -> ApiKeys:
    return ApiKeys(current_meter())


@click.group(cls=SentenceGroup)
def apikeys() -> None:
    """API keys of the HTTP API (`metering serve`): Authorization: Bearer <key>."""


@apikeys.command("create")
@click.option(
    "--scope",
    required=True,
    type=click.Choice(SCOPES),
    help="ingest: send usage; read: decisions and usage; admin: everything.",
)
@click.option("--name", default="", help="What the key is for (up to 200 characters).")
@click.option(
    "--subject",
    default=None,
    help="A customer's key (read only): sees this subject alone, every other one is 404.",
)
def create(scope: str, name: str, subject: str | None) -> None:
    """Create a key; prints it once (only its hash is stored)."""
    key, token = _keys().create(scope, name, subject=subject)
    click.echo(token)
    only = f", subject {key.subject}" if key.subject is not None else ""
    click.echo(
        f"created {key.id} (scope {key.scope}{only}): store the key now, it is not shown again",
        err=True,
    )


def _row(key: ApiKey) -> list[object]:
    state = f"revoked {when(key.revoked_at)}" if key.revoked_at else "active"
    return [
        key.id,
        key.scope,
        key.subject,
        key.name or None,
        when(key.created_at),
        when(key.last_used_at),
        state,
    ]


@apikeys.command("list")
@format_option
def list_keys(fmt: str) -> None:
    """List keys, revoked ones too (never the keys themselves)."""
    found = _keys().list()
    echo_listing(found, fmt, "no API keys", KEY_COLUMNS, _row, numeric=())


@apikeys.command("revoke")
@click.argument("key_id", metavar="ID")
def revoke(key_id: str) -> None:
    """Revoke a key (by its id, mk_ and 12 hex digits): refused from the next request on."""
    keys = _keys()
    if keys.revoke(key_id):
        click.echo(f"revoked {keys.get(key_id).id}")
    else:
        click.echo(f"{keys.get(key_id).id} was already revoked")
