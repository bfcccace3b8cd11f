"""Subjects' time zones (`metering.domain.zones`).

* ``subject_time_zones``: each change of a subject's zone, at the instant it was
  made; the windows it gives follow from the whole history, so none is deleted.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "subject_time_zones",
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("since_us", sa.BigInteger, autoincrement=False, nullable=False),
        sa.Column("time_zone", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("subject", "since_us"),
    )


def downgrade() -> None:
    op.drop_table("subject_time_zones")
