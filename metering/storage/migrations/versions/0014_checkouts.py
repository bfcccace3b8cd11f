"""Floating licenses: ``checkouts`` and their per-subject lock rows, ``license_pools``.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkouts",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("cost", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(12), nullable=False),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.Column("ttl_us", sa.BigInteger, nullable=False),
        sa.Column("expires_at_us", sa.BigInteger, nullable=False),
        sa.Column("released_at_us", sa.BigInteger, nullable=True),
        sa.Column("released_by", sa.String(16), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_checkouts_pair_state", "checkouts", ["subject", "limit_name", "state"])
    op.create_index("ix_checkouts_state_expires", "checkouts", ["state", "expires_at_us"])
    op.create_table(
        "license_pools",
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("denied_at_us", sa.BigInteger, nullable=True),
        sa.Column("updated_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("subject", "limit_name"),
    )


def downgrade() -> None:
    op.drop_table("license_pools")
    op.drop_index("ix_checkouts_state_expires", table_name="checkouts")
    op.drop_index("ix_checkouts_pair_state", table_name="checkouts")
    op.drop_table("checkouts")
