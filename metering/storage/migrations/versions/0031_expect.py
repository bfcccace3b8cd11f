"""``metering_expect``: a check that ends the transaction when it fails.

``metering_expect(ok)`` returns true when ``ok`` is, and otherwise raises
(SQLSTATE ``MX001``), aborting the transaction it runs in. The hot path's
speculative write (`metering.storage.hot.speculative`) sends it before its
writes, in the same pipeline: the rows it locks must still hold what the
decision was made on, or nothing after it runs. PostgreSQL only.

Revision ID: 0031
Revises: 0030
"""

from __future__ import annotations

from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

_FUNCTION = """
CREATE OR REPLACE FUNCTION metering_expect(ok boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'the rows changed since they were cached' USING ERRCODE = 'MX001';
    END IF;
    RETURN true;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS metering_expect(boolean)")
