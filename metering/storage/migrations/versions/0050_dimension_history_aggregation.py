"""A limit's dimension history keeps its aggregation too.

``limit_dimensions.aggregation``: the limit's ``aggregation`` in that era (``sum``, or a
gauge's ``max`` or ``latest``); a change of it appends an era as a change of dimensions
does. The audit reads it to leave alone the counters of a limit that was a gauge in some
era (a level, not a sum). Each defined limit's last era takes its aggregation now (older
eras and deleted limits' stay NULL: not known). Downgrade drops the column.

Revision ID: 0050
Revises: 0049
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0050"
down_revision = "0049"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("limit_dimensions") as batch:
        batch.add_column(sa.Column("aggregation", sa.String(8), nullable=True))
    op.execute(
        "UPDATE limit_dimensions SET aggregation = "
        "(SELECT l.aggregation FROM limits l WHERE l.name = limit_dimensions.limit_name) "
        "WHERE tick = (SELECT max(d.tick) FROM limit_dimensions d "
        "WHERE d.limit_name = limit_dimensions.limit_name)"
    )


def downgrade() -> None:
    with op.batch_alter_table("limit_dimensions") as batch:
        batch.drop_column("aggregation")
