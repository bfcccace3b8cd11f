"""Rejected messages: queued input that could not become an event.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rejected_messages",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("event_id", sa.String(128), nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("raw", sa.Text, nullable=False),
        sa.Column("received_at_us", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_rejected_messages_received_at_us", "rejected_messages", ["received_at_us"])


def downgrade() -> None:
    op.drop_index("ix_rejected_messages_received_at_us", table_name="rejected_messages")
    op.drop_table("rejected_messages")
