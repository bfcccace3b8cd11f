"""Recurring grants, grant priorities, ``grant.low``, per-subject alert thresholds.

* ``grants.priority``: grants are drawn by priority (lowest first), then by
  expiry; ``grants.schedule_id`` and ``issue_number`` name the recurring
  grant an issue belongs to; ``low_at`` is what left (or less) announces
  ``grant.low`` and ``low_sent`` that it was announced (once per issue).
* ``grant_schedules``: recurring grants, with their last issue and when the
  next one is due (NULL: never again).
* ``alert_thresholds``: one subject's thresholds for one limit, replacing
  the limit's (JSON lists of percentages and of amounts).

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("grants") as batch:
        batch.add_column(sa.Column("priority", sa.Integer, nullable=False, server_default="100"))
        batch.add_column(sa.Column("schedule_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("issue_number", sa.Integer, nullable=True))
        batch.add_column(sa.Column("low_at", sa.BigInteger, nullable=True))
        batch.add_column(
            sa.Column("low_sent", sa.Boolean, nullable=False, server_default=sa.false())
        )
    op.create_table(
        "grant_schedules",
        sa.Column("schedule_id", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("every", sa.String(32), nullable=False),
        sa.Column("calendar", sa.Boolean, nullable=False),
        sa.Column("rollover_max", sa.BigInteger, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("until_us", sa.BigInteger, nullable=True),
        sa.Column("low_units", sa.BigInteger, nullable=True),
        sa.Column("low_percent", sa.Integer, nullable=True),
        sa.Column("last_issue", sa.Integer, nullable=False),
        sa.Column("next_issue_us", sa.BigInteger, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("schedule_id"),
    )
    op.create_index(
        "ix_grant_schedules_subject_limit", "grant_schedules", ["subject", "limit_name"]
    )
    op.create_table(
        "alert_thresholds",
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("thresholds", sa.Text, nullable=False),
        sa.Column("thresholds_units", sa.Text, nullable=False),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("limit_name", "subject"),
    )


def downgrade() -> None:
    op.drop_table("alert_thresholds")
    op.drop_index("ix_grant_schedules_subject_limit", table_name="grant_schedules")
    op.drop_table("grant_schedules")
    with op.batch_alter_table("grants") as batch:
        for name in ("low_sent", "low_at", "issue_number", "schedule_id", "priority"):
            batch.drop_column(name)
