"""``metering_consume_one`` draws a lone grant in force from its sums' read.

A charge its own room pays reads only the grants' sum in force at the event. One
that draws reads, in one statement, the sums at the event and at the window's end,
the count of live grants not expired and, when one alone is left and in force, its
id, use and low threshold: its draw needs no ordered read (a statement fewer). Any
other set of grants is drawn in order as before. Decisions, rows and lock order are
0044's. Downgrade restores 0044's function. PostgreSQL only.

Revision ID: 0045
Revises: 0044
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0045"
down_revision = "0044"
branch_labels = None
depends_on = None

_LONE: tuple[tuple[str, str], ...] = (
    (
        " g record;",
        " g record;\n    glive bigint; gnow bigint; gone text; gone_used bigint;"
        " gone_low bigint; gone_sent boolean;",
    ),
    (  # a grant expired by the event is in force neither then nor at the window's end
        """            SELECT coalesce(sum(g2.amount - g2.used) FILTER (
                       WHERE g2.effective_from_us <= p_at
                         AND (g2.expires_at_us IS NULL OR p_at < g2.expires_at_us)), 0),
                   coalesce(sum(g2.amount - g2.used) FILTER (
                       WHERE g2.effective_from_us <= wes[i]
                         AND (g2.expires_at_us IS NULL OR wes[i] < g2.expires_at_us)), 0)
            INTO gavail, gavail_end FROM grants AS g2
            WHERE g2.limit_name = names[i] AND g2.subject = subjects[i] AND g2.used < g2.amount;
""",
        """            wanted := greatest(costs[i] - own_room, 0);
            IF wanted = 0 THEN  -- its own room pays: the sum in force now alone
                SELECT coalesce(sum(g2.amount - g2.used), 0) INTO gavail FROM grants AS g2
                WHERE g2.limit_name = names[i] AND g2.subject = subjects[i]
                  AND g2.used < g2.amount AND g2.effective_from_us <= p_at
                  AND (g2.expires_at_us IS NULL OR p_at < g2.expires_at_us);
            ELSE  -- the sums now and at the window's end, the lone live grant's row
                SELECT coalesce(sum(g2.amount - g2.used) FILTER (
                           WHERE g2.effective_from_us <= p_at), 0),
                       coalesce(sum(g2.amount - g2.used) FILTER (
                           WHERE g2.effective_from_us <= wes[i]
                             AND (g2.expires_at_us IS NULL OR wes[i] < g2.expires_at_us)), 0),
                       count(*), count(*) FILTER (WHERE g2.effective_from_us <= p_at),
                       min(g2.grant_id), min(g2.used), min(g2.low_at), bool_or(g2.low_sent)
                INTO gavail, gavail_end, glive, gnow, gone, gone_used, gone_low, gone_sent
                FROM grants AS g2
                WHERE g2.limit_name = names[i] AND g2.subject = subjects[i]
                  AND g2.used < g2.amount
                  AND (g2.expires_at_us IS NULL OR p_at < g2.expires_at_us);
            END IF;
""",
    ),
    (
        "            wanted := greatest(costs[i] - own_room, 0);\n            gdrawn[i] := 0;\n",
        "            gdrawn[i] := 0;\n",
    ),
    (
        """            IF wanted > 0 AND (costs[i] <= room OR enfs[i] = 'soft') THEN
                FOR g IN""",
        """            IF wanted > 0 AND (costs[i] <= room OR enfs[i] = 'soft') AND glive = 1
               AND gnow = 1 THEN  -- the lone grant (all gavail) read with the sums
                taken := least(gavail, wanted);
                draws_t[i] := '[' || to_jsonb(gone)::text || ',' || taken::text || ']';
                gids := gids || gone; gamts := gamts || taken; gused := gused || gone_used;
                glow[i] := gone_low IS NOT NULL AND NOT gone_sent AND gavail - taken <= gone_low;
                gdrawn[i] := taken;
            ELSIF wanted > 0 AND (costs[i] <= room OR enfs[i] = 'soft') THEN
                FOR g IN""",
    ),
)


def consume_one_0044() -> str:
    """Migration 0044's function."""
    path = Path(__file__).with_name("0044_consume_one_leaner_shapes.py")
    spec = importlib.util.spec_from_file_location("consume_one_leaner_shapes_0044", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.leaner(module.consume_one_0043()))


def lone(function: str) -> str:
    """``function`` (migration 0044's) drawing a lone grant in force from its sums' read."""
    replaced = function
    for old, new in _LONE:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(lone(consume_one_0044()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(consume_one_0044())
