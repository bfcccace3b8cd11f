"""``metering db upgrade``."""

from __future__ import annotations

import click
from sqlalchemy.engine import make_url

from metering.cli.context import AppState, SentenceGroup
from metering.storage.connections import normalise_url, upgrade_schema
from metering.storage.schema_revision import SCHEMA_REVISION


@click.group(cls=SentenceGroup)
def db() -> None:
    """Database schema."""


@db.command()
@click.pass_obj
def upgrade(state: AppState) -> None:
    """Create or migrate the schema to the current revision (SQLite or PostgreSQL)."""
    upgrade_schema(state.url)
    where = make_url(normalise_url(state.url)).render_as_string(hide_password=True)
    click.echo(f"schema at revision {SCHEMA_REVISION} ({where})")
