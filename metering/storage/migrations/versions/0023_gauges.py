"""Gauges: ``limits.aggregation`` is ``sum`` (costs add up, every limit so
far), ``max`` or ``latest`` (each event reports a level).

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "limits",
        sa.Column("aggregation", sa.String(8), nullable=False, server_default="sum"),
    )


def downgrade() -> None:
    with op.batch_alter_table("limits") as batch:
        batch.drop_column("aggregation")
