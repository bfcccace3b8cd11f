"""A limit's dimension history keeps its seat key too.

``limit_dimensions.distinct_key``: the limit's ``distinct`` in that era; a change of it
appends an era as a change of dimensions does. The audit reads it to leave the ``used`` of
a seat limit's hour with a voided event unknown after the limit is deleted or made plain.
Each defined limit's last era takes its seat key now (older eras and deleted limits' stay
NULL: not known). Downgrade drops the column.

Revision ID: 0049
Revises: 0048
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0049"
down_revision = "0048"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("limit_dimensions") as batch:
        batch.add_column(sa.Column("distinct_key", sa.String(64), nullable=True))
    op.execute(
        "UPDATE limit_dimensions SET distinct_key = "
        "(SELECT l.distinct_key FROM limits l WHERE l.name = limit_dimensions.limit_name) "
        "WHERE tick = (SELECT max(d.tick) FROM limit_dimensions d "
        "WHERE d.limit_name = limit_dimensions.limit_name)"
    )


def downgrade() -> None:
    with op.batch_alter_table("limit_dimensions") as batch:
        batch.drop_column("distinct_key")
