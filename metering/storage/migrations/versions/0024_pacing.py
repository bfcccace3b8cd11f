"""Pacing: ``limits.pacing_burst`` is a paced limit's burst (units, or a
percentage like ``5%``); NULL for every limit that is not paced.

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("limits", sa.Column("pacing_burst", sa.String(24), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("limits") as batch:
        batch.drop_column("pacing_burst")
