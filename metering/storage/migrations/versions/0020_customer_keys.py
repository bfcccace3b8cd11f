"""Customer keys and the usage page.

* ``api_keys.subject``: a read key that sees only this subject (NULL: every
  subject, as before).
* ``secrets``: secrets the product makes for itself, by name; ``portal``
  signs the usage page's links.

Revision ID: 0020
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("subject", sa.String(200), nullable=True))
    op.create_table(
        "secrets",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(128), nullable=False),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("secrets")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("subject")
