"""Room for HOT updates in the rows a batch updates in place: grants, draws, breakers.

A paying grant's batch updates its grants' ``used`` and its windows' draws, and
a breaker's batch every stepped breaker, none of them an indexed column. On
PostgreSQL their pages now keep half their room free (fillfactor 50, as the
counters keep 30 %: migration 0005), so an update fits beside the old row version
and skips the primary key (a HOT update). Rows already written move as they are
updated; nothing is rewritten. SQLite has no fillfactor: nothing changes there.

Revision ID: 0035
Revises: 0034
"""

from __future__ import annotations

from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None

TABLES = ("grants", "grant_draws", "breakers")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
