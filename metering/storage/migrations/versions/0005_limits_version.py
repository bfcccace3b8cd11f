"""A version number for the limits, so processes can cache them.

Every change to ``limits`` increments ``limits_version.version`` in the same
transaction. The hot path reads it with its other statements and reloads
its cached limits when it moved, so a change applies at once everywhere.

Counters are updated in place all day: on PostgreSQL their pages keep 30 %
free (fillfactor 70), so an update fits beside the old row version and
skips the indexes (a HOT update).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "limits_version",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("version", sa.BigInteger, nullable=False),
    )
    op.bulk_insert(table, [{"id": 1, "version": 1}])
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE counters SET (fillfactor = 70)")
        op.execute("ALTER TABLE current_windows SET (fillfactor = 70)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE counters RESET (fillfactor)")
        op.execute("ALTER TABLE current_windows RESET (fillfactor)")
    op.drop_table("limits_version")
