"""Usage beyond a reservation: a commit of more than was reserved.

* ``overdrafts``: per event and counter, the units of a commit's real usage
  that a hard limit had no room for, recorded and billed anyway (the
  overage report's ``overdraft``).

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "overdrafts",
        sa.Column("event_id", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("window_start_us", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("units", sa.BigInteger, nullable=False),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("event_id", "subject", "limit_name"),
    )
    op.create_index(
        "ix_overdrafts_counter", "overdrafts", ["subject", "limit_name", "window_start_us"]
    )


def downgrade() -> None:
    op.drop_index("ix_overdrafts_counter", table_name="overdrafts")
    op.drop_table("overdrafts")
