"""A batch's rollups appended: ``usage_rollup_deltas``, no key and no index.

The hot path's batches insert what they add to the usage rollups into this table instead of
upserting ``usage_rollups``; readers sum both, and `metering.storage.rollups.compact_rollups`
(run by ``metering.prune``) folds the deltas into the rollups. Downgrade folds what is left,
then drops the table.

Revision ID: 0040
Revises: 0039
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None

_KEY = "subject, limit_name, dimension, hour_start_us, value"


def upgrade() -> None:
    op.create_table(
        "usage_rollup_deltas",
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("dimension", sa.String(64), nullable=False),
        sa.Column("hour_start_us", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("value", sa.String(200), nullable=False),
        sa.Column("used", sa.BigInteger(), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.execute(
        f"INSERT INTO usage_rollups ({_KEY}, used, events) "
        f"SELECT {_KEY}, sum(used), sum(events) FROM usage_rollup_deltas WHERE true "
        f"GROUP BY {_KEY} ORDER BY {_KEY} "
        f"ON CONFLICT ({_KEY}) DO UPDATE SET used = usage_rollups.used + excluded.used, "
        "events = usage_rollups.events + excluded.events"
    )
    op.drop_table("usage_rollup_deltas")
