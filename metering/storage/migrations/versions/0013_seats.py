"""Seats: limits that count distinct values.

* ``limits.distinct_key``: the metadata key whose distinct values a limit
  counts per window (NULL: a sum, as before).
* ``distinct_values``: per window of such a limit, each value and how many
  live events carried it (`metering.storage.distinct`).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("limits") as batch:
        batch.add_column(sa.Column("distinct_key", sa.String(64), nullable=True))
    op.create_table(
        "distinct_values",
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("window_start_us", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("value", sa.String(200), nullable=False),
        sa.Column("live_events", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("subject", "limit_name", "window_start_us", "value"),
        sa.CheckConstraint("live_events >= 0", name="ck_distinct_values_live_events"),
    )


def downgrade() -> None:
    op.drop_table("distinct_values")
    with op.batch_alter_table("limits") as batch:
        batch.drop_column("distinct_key")
