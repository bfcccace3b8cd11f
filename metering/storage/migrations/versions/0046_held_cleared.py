"""A reservation says whether a reset dropped some of its charges from the hold.

``reservations.hold_cleared``: set by a reset that drops a held reservation's charges on the
counters it clears, so a settle knows, from the row it locks, that the dropped charges' units
and money are to be found in the result. Rows held at the upgrade are set from their results:
a consumed charge of the result whose subject and limit the hold no longer names. Downgrade
drops the column.

Revision ID: 0046
Revises: 0045
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0046"
down_revision = "0045"
branch_labels = None
depends_on = None

# A result's and a charge's outcomes that consumed something (`corrections.VOIDABLE` at 0046).
_CONSUMED = ("allowed", "overage")
_HELD = sa.text(
    "SELECT r.id, r.charges, s.outcome, s.charges FROM reservations r "
    "JOIN results s ON s.event_id = r.id WHERE r.state = 'held'"
)


def upgrade() -> None:
    op.add_column(
        "reservations",
        sa.Column("hold_cleared", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    bind = op.get_bind()
    cleared = [
        {"reservation": reservation_id}
        for reservation_id, held, outcome, charges in bind.execute(_HELD)
        if _dropped(held, outcome, charges)
    ]
    if cleared:
        rows = sa.table("reservations", sa.column("id"), sa.column("hold_cleared", sa.Boolean))
        bind.execute(
            rows.update().where(rows.c.id == sa.bindparam("reservation")).values(hold_cleared=True),
            cleared,
        )


def _dropped(held: str, outcome: str, charges: str) -> bool:
    """Whether the result consumed on a counter the hold no longer names."""
    if outcome not in _CONSUMED:
        return False
    holds = {(row[0], row[1]) for row in json.loads(held)}
    return any(row[4] in _CONSUMED and (row[0], row[1]) not in holds for row in json.loads(charges))


def downgrade() -> None:
    with op.batch_alter_table("reservations") as batch:
        batch.drop_column("hold_cleared")
