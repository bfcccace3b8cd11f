"""A cancelled reservation names what a reset dropped from its hold in ``given_back``.

A cancel after a reset releases the charges the reset dropped from the hold off the reports;
it now names them in ``reservations.given_back`` (their whole cost), as a commit of fewer
units names what it releases, so a void after it and the audit read one form. Cancels
settled before name them here, from their results: each consumed charge of cost above 0 on a
counter (subject, limit, window start) the hold no longer names, unless named already.
Voids' cancels (``settled_by`` void) are left alone: their events are voided. Downgrade
keeps the entries: 0047's code excludes those charges by the state anyway.

Revision ID: 0048
Revises: 0047
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0048"
down_revision = "0047"
branch_labels = None
depends_on = None

# A result's and a charge's outcomes that consumed something (`corrections.VOIDABLE` at 0048).
_CONSUMED = ("allowed", "overage")
_CANCELLED = sa.text(
    "SELECT r.id, r.charges, r.given_back, s.outcome, s.charges FROM reservations r "
    "JOIN results s ON s.event_id = r.id "
    "WHERE r.state = 'cancelled' AND r.settled_by = 'cancel'"
)


def upgrade() -> None:
    bind = op.get_bind()
    named = []
    for reservation_id, held, given_back, outcome, charges in bind.execute(_CANCELLED):
        entries = _named(held, given_back, outcome, charges)
        if entries is not None:
            named.append({"reservation": reservation_id, "given_back": entries})
    if named:
        rows = sa.table("reservations", sa.column("id"), sa.column("given_back", sa.Text))
        bind.execute(
            rows.update()
            .where(rows.c.id == sa.bindparam("reservation"))
            .values(given_back=sa.bindparam("given_back")),
            named,
        )


def _named(held: str, given_back: str | None, outcome: str, charges: str) -> str | None:
    """``given_back`` with the charges a reset dropped from the hold added
    (None: none to add)."""
    if outcome not in _CONSUMED:
        return None
    holds = {(row[0], row[1], row[3]) for row in json.loads(held)}
    entries: list[list[Any]] = json.loads(given_back) if given_back else []
    known = {(entry[0], entry[1], entry[2]) for entry in entries}
    added = []
    for row in json.loads(charges):
        counter = (row[0], row[1], row[9] if row[9] is not None else 0)  # a bucket: no window
        if row[4] in _CONSUMED and row[2] > 0 and counter not in holds | known:
            added.append([*counter, row[2]])
    if not added:
        return None
    return json.dumps(entries + added, separators=(",", ":"))


def downgrade() -> None:
    pass
