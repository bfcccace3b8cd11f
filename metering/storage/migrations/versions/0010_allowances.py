"""Entitlements, grants, corrections, absolute thresholds.

* ``limits.thresholds_units``: absolute thresholds, beside the percentages.
* ``entitlements``: a subject's own maximum for a limit, effective-dated;
  rows are history and are never updated (a NULL maximum: back to the
  limit's default from then on).
* ``grants``: top-ups, with what was used of each, never more than the
  amount (a check the hot path relies on); ``grant_draws`` what each window
  drew on each grant, so a window's own usage is its counter's ``used``
  less its draws.
* ``corrections``: voided events; one per event id.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("limits") as batch:
        batch.add_column(
            sa.Column("thresholds_units", sa.Text, nullable=False, server_default="[]")
        )
    op.create_table(
        "entitlements",
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("effective_from_us", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("maximum", sa.BigInteger, nullable=True),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("subject", "limit_name", "effective_from_us"),
    )
    op.create_table(
        "grants",
        sa.Column("grant_id", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("used", sa.BigInteger, nullable=False),
        sa.Column("effective_from_us", sa.BigInteger, nullable=False),
        sa.Column("expires_at_us", sa.BigInteger, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("grant_id"),
        sa.CheckConstraint("used >= 0 AND used <= amount", name="ck_grants_used"),
    )
    op.create_index("ix_grants_subject_limit", "grants", ["subject", "limit_name"])
    op.create_table(
        "grant_draws",
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("window_start_us", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("grant_id", sa.String(128), nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("subject", "limit_name", "window_start_us", "grant_id"),
    )
    op.create_table(
        "corrections",
        sa.Column("correction_id", sa.String(128), nullable=False),
        sa.Column("event_id", sa.String(128), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("charges", sa.Text, nullable=False),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("correction_id"),
        sa.UniqueConstraint("event_id", name="uq_corrections_event_id"),
    )
    op.create_index("ix_corrections_created_at_us", "corrections", ["created_at_us"])


def downgrade() -> None:
    op.drop_index("ix_corrections_created_at_us", table_name="corrections")
    op.drop_table("corrections")
    op.drop_table("grant_draws")
    op.drop_index("ix_grants_subject_limit", table_name="grants")
    op.drop_table("grants")
    op.drop_table("entitlements")
    with op.batch_alter_table("limits") as batch:
        batch.drop_column("thresholds_units")
