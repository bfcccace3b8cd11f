"""Initial schema: limits, counters, current first-use windows, results ledger.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "limits",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("maximum", sa.BigInteger, nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("algorithm", sa.String(16), nullable=False),
        sa.Column("window", sa.String(16), nullable=False),
        sa.Column("enforcement", sa.String(8), nullable=False),
        sa.Column("thresholds", sa.Text, nullable=False),
        sa.Column("lateness", sa.String(16), nullable=False),
        sa.Column("updated_at_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "counters",
        sa.Column("limit_name", sa.String(64), primary_key=True),
        sa.Column("subject", sa.String(200), primary_key=True),
        sa.Column("window_start_us", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("window_end_us", sa.BigInteger, nullable=False),
        sa.Column("used", sa.BigInteger, nullable=False),
        sa.Column("denied_count", sa.BigInteger, nullable=False),
        sa.Column("denied_cost", sa.BigInteger, nullable=False),
        sa.Column("first_denied_at_us", sa.BigInteger, nullable=True),
        sa.Column("tat_us", sa.BigInteger, nullable=True),
        sa.Column("tat_rem", sa.BigInteger, nullable=False),
        sa.Column("tat_scale", sa.BigInteger, nullable=False),
        sa.Column("updated_at_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "current_windows",
        sa.Column("limit_name", sa.String(64), primary_key=True),
        sa.Column("subject", sa.String(200), primary_key=True),
        sa.Column("window_start_us", sa.BigInteger, nullable=True),
        sa.Column("window_end_us", sa.BigInteger, nullable=True),
    )
    op.create_table(
        "results",
        sa.Column("event_id", sa.String(128), primary_key=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("fingerprint", sa.Text, nullable=False),
        sa.Column("occurred_at_us", sa.BigInteger, nullable=False),
        sa.Column("decided_at_us", sa.BigInteger, nullable=False),
        sa.Column("denied_by", sa.Text, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("charges", sa.Text, nullable=False),
        sa.Column("metadata", sa.Text, nullable=True),
    )
    op.create_index("ix_results_decided_at_us", "results", ["decided_at_us"])


def downgrade() -> None:
    op.drop_index("ix_results_decided_at_us", table_name="results")
    for table in ("results", "current_windows", "counters", "limits"):
        op.drop_table(table)
