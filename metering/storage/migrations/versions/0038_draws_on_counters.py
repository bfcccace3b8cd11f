"""A window's grant draws kept on its counter row: ``counters.granted``; ``grant_draws`` dropped.

What a window drew on grants is the window's own (its own usage is ``used`` less it) and
changes only under its counter's lock, so it is a column of the counter: a paying batch
writes the counter (as every batch does) and its grants, not a draw row per window and
grant too. Filled from ``grant_draws``' sums per window; ``metering_consume_one`` reads the
column and adds to it in its counter's update or insert. The draws per grant of a window
are not kept (a void gives back what its correction records). Downgrade puts each
window's draws on the grant of its pair drawn most (their split per grant is not kept).

Revision ID: 0038
Revises: 0037
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None

_ON_COUNTER: tuple[tuple[str, str], ...] = (
    (
        "    found_c boolean[]; cused bigint[];",
        "    found_c boolean[]; cgranted bigint[]; gsum bigint; cused bigint[];",
    ),
    (
        "               c2.tat_rem, c2.tat_scale\n        INTO r FROM counters AS c2",
        "               c2.tat_rem, c2.tat_scale, c2.granted\n        INTO r FROM counters AS c2",
    ),
    (
        """            tscale[i] := r.tat_scale;
        ELSE""",
        """            tscale[i] := r.tat_scale; cgranted[i] := r.granted;
        ELSE""",
    ),
    (
        """            trem[i] := 0; tscale[i] := 1;
        END IF;""",
        """            trem[i] := 0; tscale[i] := 1; cgranted[i] := 0;
        END IF;""",
    ),
    (
        """            SELECT coalesce(sum(d.amount), 0) INTO drawn FROM grant_draws AS d
            WHERE d.subject = subjects[i] AND d.limit_name = names[i]
              AND d.window_start_us = wss[i];
""",
        """            drawn := cgranted[i];
""",
    ),
    (
        """        CONTINUE WHEN NOT found_c[i] OR NOT changed[i];
        UPDATE counters SET used = cused[i], denied_count = dcount[i], denied_cost = dcost[i],
            first_denied_at_us = fdat[i], tat_us = tat[i], tat_rem = trem[i],
            tat_scale = tscale[i], updated_at_us = p_now,""",
        """        CONTINUE WHEN NOT found_c[i] OR NOT changed[i];
        gsum := CASE WHEN allowed THEN (SELECT coalesce(sum(u.a), 0) FROM unnest(gi, gamts)
                                        AS u(ci, a) WHERE u.ci = i) ELSE 0 END;
        UPDATE counters SET used = cused[i], denied_count = dcount[i], denied_cost = dcost[i],
            first_denied_at_us = fdat[i], tat_us = tat[i], tat_rem = trem[i],
            tat_scale = tscale[i], updated_at_us = p_now, granted = granted + gsum,""",
    ),
    (
        """        CONTINUE WHEN found_c[i];
        INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used,
            denied_count, denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale,
            updated_at_us, rate, rate_at_us,
            billing_month)
        VALUES (names[i], subjects[i], wss[i], wes[i], cused[i], dcount[i], dcost[i], fdat[i],
            tat[i], trem[i], tscale[i], p_now,""",
        """        CONTINUE WHEN found_c[i];
        gsum := CASE WHEN allowed THEN (SELECT coalesce(sum(u.a), 0) FROM unnest(gi, gamts)
                                        AS u(ci, a) WHERE u.ci = i) ELSE 0 END;
        INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used,
            denied_count, denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale,
            updated_at_us, granted, rate, rate_at_us,
            billing_month)
        VALUES (names[i], subjects[i], wss[i], wes[i], cused[i], dcount[i], dcost[i], fdat[i],
            tat[i], trem[i], tscale[i], p_now, gsum,""",
    ),
    (
        "            INSERT INTO grant_draws AS d"
        " (subject, limit_name, window_start_us, grant_id, amount)\n"
        """            VALUES (subjects[gi[k]], names[gi[k]], wss[gi[k]], gids[k], gamts[k])
            ON CONFLICT (subject, limit_name, window_start_us, grant_id)
            DO UPDATE SET amount = d.amount + excluded.amount;
""",
        "",
    ),
)


def _consume_one_0036() -> str:
    path = Path(__file__).with_name("0036_consume_one_tier_amount.py")
    spec = importlib.util.spec_from_file_location("consume_one_tier_amount_0036", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.with_one_call(module._consume_one_0034()))


def on_counter(function: str) -> str:
    """``function`` (migration 0036's) with the window's draws on its counter row."""
    replaced = function
    for old, new in _ON_COUNTER:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    op.add_column(
        "counters", sa.Column("granted", sa.BigInteger(), nullable=False, server_default="0")
    )
    op.execute(
        "UPDATE counters SET granted = (SELECT sum(d.amount) FROM grant_draws AS d"
        " WHERE d.subject = counters.subject AND d.limit_name = counters.limit_name"
        " AND d.window_start_us = counters.window_start_us)"
        " WHERE EXISTS (SELECT 1 FROM grant_draws AS d WHERE d.subject = counters.subject"
        " AND d.limit_name = counters.limit_name"
        " AND d.window_start_us = counters.window_start_us)"
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(on_counter(_consume_one_0036()))
    op.drop_table("grant_draws")


def downgrade() -> None:
    op.create_table(
        "grant_draws",
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("window_start_us", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("grant_id", sa.String(128), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("subject", "limit_name", "window_start_us", "grant_id"),
    )
    op.execute(
        "INSERT INTO grant_draws (subject, limit_name, window_start_us, grant_id, amount)"
        " SELECT c.subject, c.limit_name, c.window_start_us,"
        " (SELECT g.grant_id FROM grants AS g WHERE g.subject = c.subject"
        " AND g.limit_name = c.limit_name ORDER BY g.used DESC, g.grant_id LIMIT 1), c.granted"
        " FROM counters AS c WHERE c.granted > 0 AND EXISTS (SELECT 1 FROM grants AS g"
        " WHERE g.subject = c.subject AND g.limit_name = c.limit_name)"
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE grant_draws SET (fillfactor = 50)")
        op.execute(_consume_one_0036())
    with op.batch_alter_table("counters") as batch:
        batch.drop_column("granted")
