"""``metering_consume_one`` neither reads nor writes a held seat's row when told it is held.

A seat charge may carry (element 23) the stamp its window's held values were known at
(`metering.engine.seats.HeldCache`): when the counter row the function locks shows that
stamp, the value is held (any change of the set since would have moved it) and its row is
neither read nor upserted. Otherwise it is read under the counter's lock as before, and a
held one is not upserted either; the function answers the stamps it found values held at
(a fifth element, only to a caller that sent element 23). Downgrade restores 0041's
function. PostgreSQL only.

Revision ID: 0042
Revises: 0041
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None

_SKIP: tuple[tuple[str, str], ...] = (
    (
        "    seatv text[]; live bigint;",
        "    seatv text[]; live bigint; heldat bigint[]; cstamp bigint[]; seatheld boolean[];\n"
        "    learn boolean := false; learned text[] := '{}';",
    ),
    (  # a seat charge carries every element to 23: no breaker is a JSON null
        "brk[i] := c -> 22;",
        "brk[i] := nullif(c -> 22, 'null');",
    ),
    (
        "               c2.tat_rem, c2.tat_scale, c2.granted\n        INTO r FROM counters AS c2",
        "               c2.tat_rem, c2.tat_scale, c2.granted, c2.seats_stamp\n"
        "        INTO r FROM counters AS c2",
    ),
    (
        "            tscale[i] := r.tat_scale; cgranted[i] := r.granted;\n",
        "            tscale[i] := r.tat_scale; cgranted[i] := r.granted;"
        " cstamp[i] := r.seats_stamp;\n",
    ),
    (
        """    -- A seat held in the window costs 0 (`seat_cost`), read under the counter's lock.
    FOR i IN 1..n LOOP
        CONTINUE WHEN seatv[i] IS NULL;
        SELECT d.live_events INTO live FROM distinct_values AS d
        WHERE d.subject = subjects[i] AND d.limit_name = names[i]
          AND d.window_start_us = wss[i] AND d.value = seatv[i];
        IF live > 0 THEN
""",
        """    -- A seat held in the window costs 0 (`seat_cost`): held if the locked
    -- counter shows the stamp the caller knew it held at, else read under the lock.
    FOR i IN 1..n LOOP
        CONTINUE WHEN seatv[i] IS NULL;
        c := p_charges -> (i - 1);
        heldat[i] := (c ->> 23)::bigint;
        learn := learn OR jsonb_array_length(c) > 23;
        IF found_c[i] AND heldat[i] = cstamp[i] THEN
            seatheld[i] := true;
        ELSE
            SELECT d.live_events INTO live FROM distinct_values AS d
            WHERE d.subject = subjects[i] AND d.limit_name = names[i]
              AND d.window_start_us = wss[i] AND d.value = seatv[i];
            seatheld[i] := coalesce(live > 0, false);
            IF seatheld[i] AND cstamp[i] IS NOT NULL THEN
                learned := learned || (i::text || ':' || cstamp[i]::text);
            END IF;
        END IF;
        IF seatheld[i] THEN
""",
    ),
    (
        "        CONTINUE WHEN seatv[i] IS NULL OR NOT allowed OR NOT fits[i];\n"
        "        INSERT INTO distinct_values",
        "        CONTINUE WHEN seatv[i] IS NULL OR seatheld[i] OR NOT allowed OR NOT fits[i];\n"
        "        INSERT INTO distinct_values",
    ),
    (
        "    RETURN ARRAY['ok', v_outcome, v_denied, v_charges];",
        "    IF learn THEN  -- the charges' positions from 1 and the stamps they were held at\n"
        "        RETURN ARRAY['ok', v_outcome, v_denied, v_charges,"
        " array_to_string(learned, ',')];\n"
        "    END IF;\n"
        "    RETURN ARRAY['ok', v_outcome, v_denied, v_charges];",
    ),
)


def consume_one_0041() -> str:
    """Migration 0041's function (0039's: 0041 did not change it)."""
    path = Path(__file__).with_name("0039_seat_rows_held.py")
    spec = importlib.util.spec_from_file_location("seat_rows_held_0039", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.held(module._consume_one_0038()))


def skipping(function: str) -> str:
    """``function`` (migration 0041's) skipping a held seat's row."""
    replaced = function
    for old, new in _SKIP:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(skipping(consume_one_0041()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(consume_one_0041())
