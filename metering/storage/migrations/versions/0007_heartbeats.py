"""Heartbeats of workers and beat, for `metering status`.

Beat answers no ping, and the embedded broker (kombu's SQL transport) has no
broadcast for Celery's ping either, so each worker and beat write when they
were last alive here, about every 10 s.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "heartbeats",
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("seen_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("role", "name"),
    )


def downgrade() -> None:
    op.drop_table("heartbeats")
