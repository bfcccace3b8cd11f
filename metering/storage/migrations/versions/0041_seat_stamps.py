"""A seat window's held values stamped: ``counters.seats_stamp``, new at each change of the set.

A trigger on ``distinct_values`` writes a new random stamp on the window's counter whenever
a value takes a seat (a row inserted held), leaves or takes one again (an update) or a held
row goes (a delete), whatever writes it; a stamp is never reused, so one a process has seen
names one state of the set, even in a database restored from a backup. Rows start without
one (NULL: the set is unknown). Downgrade drops the triggers and the column.

Revision ID: 0041
Revises: 0040
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0041"
down_revision = "0040"
branch_labels = None
depends_on = None

# 64 random bits of a version 4 uuid (60 of them random).
_PG_STAMP = "('x' || translate(gen_random_uuid()::text, '-', ''))::bit(64)::bigint"
_PG_FUNCTION = f"""
CREATE FUNCTION metering_seats_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE counters AS c SET seats_stamp = {_PG_STAMP}
    FROM (SELECT DISTINCT limit_name, subject, window_start_us FROM moved) AS m
    WHERE c.subject = m.subject AND c.limit_name = m.limit_name
      AND c.window_start_us = m.window_start_us;
    RETURN NULL;
END $$
"""
# (trigger, event, transition table): every row an update touches, held or not.
_PG_TRIGGERS = (
    ("seats_taken", "INSERT", "NEW"),
    ("seats_changed", "UPDATE", "NEW"),
    ("seats_freed", "DELETE", "OLD"),
)
_SQLITE_SET = (
    "UPDATE counters SET seats_stamp = random() WHERE subject = {0}.subject "
    "AND limit_name = {0}.limit_name AND window_start_us = {0}.window_start_us;"
)
_SQLITE_TRIGGERS = (
    ("seats_taken", "INSERT", "NEW.live_events > 0", "NEW"),
    ("seats_changed", "UPDATE", "(OLD.live_events > 0) <> (NEW.live_events > 0)", "NEW"),
    ("seats_freed", "DELETE", "OLD.live_events > 0", "OLD"),
)


def upgrade() -> None:
    op.add_column("counters", sa.Column("seats_stamp", sa.BigInteger(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        for name, event, table in _PG_TRIGGERS:
            op.execute(
                f"CREATE TRIGGER {name} AFTER {event} ON distinct_values "
                f"REFERENCING {table} TABLE AS moved "
                "FOR EACH STATEMENT EXECUTE FUNCTION metering_seats_stamp()"
            )
    else:
        for name, event, when, row in _SQLITE_TRIGGERS:
            op.execute(
                f"CREATE TRIGGER {name} AFTER {event} ON distinct_values WHEN {when} "
                f"BEGIN {_SQLITE_SET.format(row)} END"
            )


def downgrade() -> None:
    for name, *_ in _PG_TRIGGERS:
        op.execute(f"DROP TRIGGER {name} ON distinct_values" if _pg() else f"DROP TRIGGER {name}")
    if _pg():
        op.execute("DROP FUNCTION metering_seats_stamp()")
    with op.batch_alter_table("counters") as batch:
        batch.drop_column("seats_stamp")


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"
