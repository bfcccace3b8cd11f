"""API keys for the HTTP API (``metering apikeys``).

A key is stored as its id (the visible ``mk_...`` start of the key) and the
SHA-256 of the whole key; the key itself never. Rows are never deleted:
a revoked key keeps its row, with ``revoked_at_us`` set.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.Column("revoked_at_us", sa.BigInteger, nullable=True),
        sa.Column("last_used_at_us", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
