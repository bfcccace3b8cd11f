"""``metering_consume_one`` reaches fewer expressions on its common shapes' paths.

PL/pgSQL compiles each expression a call reaches again in every transaction, so the
body is cut where a path reaches one it can share or need not: the figures every
non-bucket kind shares (used, window end) set once before the kind's branch; defaults
a NULL already gives (`ahead`, `bstep`, `glow`) not written; a charge's JSON element
read after the check that skips it; a grant charge's draws kept in `gdrawn` as drawn;
a single draw updates its grant without the draws' sort. Decisions, rows and lock
order are 0043's. Downgrade restores 0043's function. PostgreSQL only.

Revision ID: 0044
Revises: 0043
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0044"
down_revision = "0043"
branch_labels = None
depends_on = None

_SHARED = """            f1[i] := cused[i];
            f2[i] := cused[i] + costs[i];
"""
_WINDOW_END = """            f5[i] := wes[i];
            f6[i] := wes[i];
"""
_LEANER: tuple[tuple[str, str], ...] = (
    (  # no default where a NULL reads the same: each default is evaluated every call
        "    learn boolean := false; learned text[] := '{}';",
        "    learn boolean; learned text[];",
    ),
    (
        "    gids text[] := '{}'; gamts bigint[] := '{}'; gused bigint[] := '{}';",
        "    gids text[]; gamts bigint[]; gused bigint[];",
    ),
    ("    denied text[] := '{}';\n", "    denied text[];  -- NULL while nothing is denied\n"),
    ("    any_overage boolean := false;\n", "    any_overage boolean;\n"),
    ("    rows_text text[] := '{}';\n", "    rows_text text[];\n"),
    ("    allowed := cardinality(denied) = 0;", "    allowed := denied IS NULL;"),
    (
        "    v_charges := '[' || array_to_string(rows_text, ',') || ']';",
        "    v_charges := '[' || coalesce(array_to_string(rows_text, ','), '') || ']';",
    ),
    (
        "v_charges, array_to_string(learned, ',')];",
        "v_charges,\n            coalesce(array_to_string(learned, ','), '')];",
    ),
    ("drawn bigint; g record;", "g record;"),
    ("cgranted bigint[]; gsum bigint; cused", "cgranted bigint[]; cused"),
    ("    seatv text[]; live bigint; heldat bigint[];", "    seatv text[]; live bigint;"),
    (
        "pacev[i] := (c ->> 18)::bigint; ahead[i] := false;",
        "pacev[i] := (c ->> 18)::bigint;",
    ),
    ("brk[i] := nullif(c -> 22, 'null'); bstep[i] := false;", "brk[i] := nullif(c -> 22, 'null');"),
    (
        "        c := p_charges -> (i - 1);\n"
        "        heldat[i] := (c ->> 23)::bigint;\n"
        "        learn := learn OR jsonb_array_length(c) > 23;\n"
        "        IF found_c[i] AND heldat[i] = cstamp[i] THEN\n",
        "        c := p_charges -> (i - 1);\n"
        "        learn := learn OR jsonb_array_length(c) > 23;\n"
        "        IF found_c[i] AND (c ->> 23)::bigint = cstamp[i] THEN\n",
    ),
    (
        "        c := p_charges -> (i - 1);\n        CONTINUE WHEN c ->> 20 IS NULL;\n",
        "        CONTINUE WHEN (p_charges -> (i - 1)) ->> 20 IS NULL;\n"
        "        c := p_charges -> (i - 1);\n",
    ),
    (
        "        c := p_charges -> (i - 1);\n        CONTINUE WHEN c ->> 21 IS NULL;\n",
        "        CONTINUE WHEN (p_charges -> (i - 1)) ->> 21 IS NULL;\n"
        "        c := p_charges -> (i - 1);\n",
    ),
    (  # every kind but a bucket: used before and the window's end, set once
        "            f10[i] := 0;\n        ELSIF gflag[i] THEN\n",
        "            f10[i] := 0;\n        ELSE  -- every kind but a bucket (its branches below)\n"
        "            f1[i] := cused[i];\n" + _WINDOW_END + "        IF gflag[i] THEN\n",
    ),
    (
        "            drawn := cgranted[i];\n            own_used := cused[i] - drawn;\n",
        "            own_used := cused[i] - cgranted[i];\n",
    ),
    (
        "            wanted := greatest(costs[i] - own_room, 0);\n"
        "            drawn := 0;\n            glow[i] := false;\n",
        "            wanted := greatest(costs[i] - own_room, 0);\n            gdrawn[i] := 0;\n",
    ),
    (
        "                    drawn := drawn + taken;\n",
        "                    gdrawn[i] := gdrawn[i] + taken;\n",
    ),
    (
        "            gdrawn[i] := drawn;\n" + _SHARED + "            f3[i] := room;\n",
        "            f2[i] := cused[i] + costs[i];\n            f3[i] := room;\n",
    ),
    (
        "            f4[i] := greatest(room - costs[i], 0);\n" + _WINDOW_END,
        "            f4[i] := greatest(room - costs[i], 0);\n",
    ),
    (
        "ELSE greatest(own_used + costs[i] - drawn - maxs[i], 0) END;",
        "ELSE greatest(own_used + costs[i] - gdrawn[i] - maxs[i], 0) END;",
    ),
    (
        _SHARED + "            f3[i] := greatest(room - cused[i], 0);\n"
        "            f4[i] := greatest(room - cused[i] - costs[i], 0);\n" + _WINDOW_END,
        "            f2[i] := cused[i] + costs[i];\n"
        "            f3[i] := greatest(room - cused[i], 0);\n"
        "            f4[i] := greatest(room - cused[i] - costs[i], 0);\n",
    ),
    (
        "            fits[i] := enfs[i] = 'soft' OR costs[i] <= maxs[i];\n"
        "            f1[i] := cused[i];\n",
        "            fits[i] := enfs[i] = 'soft' OR costs[i] <= maxs[i];\n",
    ),
    (
        "            f4[i] := greatest(maxs[i] - f2[i], 0);\n" + _WINDOW_END,
        "            f4[i] := greatest(maxs[i] - f2[i], 0);\n",
    ),
    (
        "OR cused[i] + costs[i] <= maxs[i] OR costs[i] = 0;\n" + _SHARED,
        "OR cused[i] + costs[i] <= maxs[i] OR costs[i] = 0;\n"
        "            f2[i] := cused[i] + costs[i];\n",
    ),
    (
        "            f4[i] := greatest(maxs[i] - cused[i] - costs[i], 0);\n" + _WINDOW_END,
        "            f4[i] := greatest(maxs[i] - cused[i] - costs[i], 0);\n",
    ),
    (
        "            f10[i] := greatest(cused[i] - maxs[i], 0);\n        END IF;\n"
        "        IF NOT fits[i] AND enfs[i] <> 'shadow' THEN",
        "            f10[i] := greatest(cused[i] - maxs[i], 0);\n        END IF;\n        END IF;\n"
        "        IF NOT fits[i] AND enfs[i] <> 'shadow' THEN",
    ),
    (
        "        IF consumed THEN\n            c := p_charges -> (i - 1);\n",
        "        IF consumed THEN\n",
    ),
    (
        "               AND c ->> 10 IS NOT NULL THEN\n",
        "               AND (p_charges -> (i - 1)) ->> 10 IS NOT NULL THEN\n"
        "                c := p_charges -> (i - 1);\n",
    ),
    (
        "                row_text := row_text || ',[' || coalesce(draws_t[i], '') || ']';\n"
        "            END IF;\n"
        "            IF pricev[i] IS NOT NULL THEN"
        "  -- a consumed priced charge's (currency, amount)\n"
        "                row_text := row_text || ',' || pricev[i];\n"
        "            END IF;\n",
        "                -- a consumed priced charge's (currency, amount) after its draws\n"
        "                row_text := row_text || ',[' || coalesce(draws_t[i], '') || ']'\n"
        "                    || coalesce(',' || pricev[i], '');\n"
        "            END IF;\n",
    ),
    (
        "        CONTINUE WHEN wstate[i] <> 1;\n",
        "        CONTINUE WHEN wstate[i] IS DISTINCT FROM 1;\n",
    ),
    (
        "        CONTINUE WHEN wstate[i] <> 2;\n",
        "        CONTINUE WHEN wstate[i] IS DISTINCT FROM 2;\n",
    ),
    ("        wstate[i] := 0;\n        IF kinds[i] = 'c' THEN", "        IF kinds[i] = 'c' THEN"),
    (
        "        gsum := CASE WHEN allowed THEN coalesce(gdrawn[i], 0) ELSE 0 END;\n"
        "        UPDATE counters",
        "        UPDATE counters",
    ),
    (
        "tat_scale = tscale[i], updated_at_us = p_now, granted = granted + gsum,",
        "tat_scale = tscale[i], updated_at_us = p_now,\n"
        "            granted = granted + CASE WHEN allowed THEN coalesce(gdrawn[i], 0) ELSE 0 END,",
    ),
    (
        "        gsum := CASE WHEN allowed THEN coalesce(gdrawn[i], 0) ELSE 0 END;\n"
        "        INSERT INTO counters",
        "        INSERT INTO counters",
    ),
    (
        "tat[i], trem[i], tscale[i], p_now, gsum,",
        "tat[i], trem[i], tscale[i], p_now,\n"
        "            CASE WHEN allowed THEN coalesce(gdrawn[i], 0) ELSE 0 END,",
    ),
    (
        "    IF allowed AND cardinality(gids) > 0 THEN\n        FOR k IN",
        "    IF allowed AND cardinality(gids) = 1 THEN  -- one draw: no order to keep\n"
        "        UPDATE grants SET used = used + gamts[1]\n"
        "        WHERE grant_id = gids[1] AND used = gused[1];\n"
        "        IF NOT FOUND THEN\n"
        "            RAISE EXCEPTION 'a grant was drawn on concurrently' USING ERRCODE = 'MX001';\n"
        "        END IF;\n"
        "    ELSIF allowed AND cardinality(gids) > 1 THEN\n        FOR k IN",
    ),
)


def consume_one_0043() -> str:
    """Migration 0043's function."""
    path = Path(__file__).with_name("0043_consume_one_fewer_statements.py")
    spec = importlib.util.spec_from_file_location("consume_one_fewer_statements_0043", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.leaner(module.consume_one_0042()))


def leaner(function: str) -> str:
    """``function`` (migration 0043's) reaching fewer expressions a call."""
    replaced = function
    for old, new in _LEANER:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(leaner(consume_one_0043()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(consume_one_0043())
