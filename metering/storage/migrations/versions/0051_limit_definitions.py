"""A limit's default maximum and enforcement keep their history, for past periods' reports.

``limit_definitions``: per limit, its maximum and enforcement from an instant on, a row per
change of either (`metering.storage.limits.LimitStore.record_definitions`). Each limit at the
upgrade gets a row with its definition now from the beginning (``effective_from_us`` 0: its
creation is not known), so every report reads as before. Downgrade drops the table.

Revision ID: 0051
Revises: 0050
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0051"
down_revision = "0050"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "limit_definitions",
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("effective_from_us", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("maximum", sa.BigInteger, nullable=False),
        sa.Column("enforcement", sa.String(8), nullable=False),
        sa.PrimaryKeyConstraint("limit_name", "effective_from_us"),
    )
    op.execute(
        "INSERT INTO limit_definitions (limit_name, effective_from_us, maximum, enforcement) "
        "SELECT name, 0, maximum, enforcement FROM limits"
    )


def downgrade() -> None:
    op.drop_table("limit_definitions")
