"""Reservations, and the counters indexes reports use.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_counters_window_start_us", "counters", ["window_start_us"])
    op.create_index("ix_counters_subject", "counters", ["subject", "limit_name", "window_start_us"])
    op.create_table(
        "reservations",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("state", sa.String(12), nullable=False),
        sa.Column("charges", sa.Text, nullable=False),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.Column("expires_at_us", sa.BigInteger, nullable=False),
        sa.Column("settled_at_us", sa.BigInteger, nullable=True),
        sa.Column("settled_by", sa.String(16), nullable=True),
    )
    op.create_index("ix_reservations_state_expires", "reservations", ["state", "expires_at_us"])


def downgrade() -> None:
    op.drop_index("ix_reservations_state_expires", table_name="reservations")
    op.drop_table("reservations")
    op.drop_index("ix_counters_subject", table_name="counters")
    op.drop_index("ix_counters_window_start_us", table_name="counters")
