"""Webhooks: endpoints, once-per-window marks, the outbox, deliveries and attempts.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _serial() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("secret", sa.Text, nullable=False),
        sa.Column("previous_secret", sa.Text, nullable=True),
        sa.Column("previous_expires_at_us", sa.BigInteger, nullable=True),
        sa.Column("types", sa.Text, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("disabled_reason", sa.Text, nullable=True),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "webhook_marks",
        sa.Column("limit_name", sa.String(64), primary_key=True),
        sa.Column("subject", sa.String(200), primary_key=True),
        sa.Column("window_start_us", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(32), primary_key=True),
        sa.Column("window_end_us", sa.BigInteger, nullable=False),
        sa.Column("maximum", sa.BigInteger, nullable=False),
        sa.Column("event_id", sa.String(128), nullable=True),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.Column("due_at_us", sa.BigInteger, nullable=True),
    )
    op.create_index("ix_webhook_marks_due_at_us", "webhook_marks", ["due_at_us"])
    op.create_table(
        "webhook_messages",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", _serial(), primary_key=True),
        sa.Column("message_id", sa.String(40), nullable=False),
        sa.Column("endpoint_id", sa.String(32), nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at_us", sa.BigInteger, nullable=True),
        sa.Column("claim_token", sa.String(32), nullable=True),
        sa.Column("claimed_until_us", sa.BigInteger, nullable=True),
        sa.Column("last_status_code", sa.Integer, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.Column("updated_at_us", sa.BigInteger, nullable=False),
    )
    op.create_index(
        "ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at_us"]
    )
    op.create_index("ix_webhook_deliveries_endpoint", "webhook_deliveries", ["endpoint_id"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", _serial(), primary_key=True),
        sa.Column("delivery_id", sa.BigInteger, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("attempted_at_us", sa.BigInteger, nullable=False),
        sa.Column("status_code", sa.Integer, nullable=True),
        sa.Column("duration_ms", sa.Integer, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("next_attempt_at_us", sa.BigInteger, nullable=True),
    )
    op.create_index("ix_webhook_attempts_delivery_id", "webhook_attempts", ["delivery_id"])


def downgrade() -> None:
    op.drop_index("ix_webhook_attempts_delivery_id", table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_deliveries_endpoint", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_messages")
    op.drop_index("ix_webhook_marks_due_at_us", table_name="webhook_marks")
    op.drop_table("webhook_marks")
    op.drop_table("webhook_endpoints")
