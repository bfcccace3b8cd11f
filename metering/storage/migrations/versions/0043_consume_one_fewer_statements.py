"""``metering_consume_one`` runs no statement it does not need, and appends its rollups.

A charge's grant draws are summed as drawn (no query per counter written); the draws'
update and the grants' ordered read run only when something is drawn; a consumed
charge's dimensions and spend go to ``usage_rollup_deltas`` (appended, no key, no lock,
as the batches' since 0040) instead of upserting ``usage_rollups``; the result's reset
tick is read in its insert's plan (the column's SQL default is parsed at every call).
Decisions, rows and lock order are 0042's. Downgrade restores 0042's function.

Revision ID: 0043
Revises: 0042
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0043"
down_revision = "0042"
branch_labels = None
depends_on = None

_SUMMED = (
    "        gsum := CASE WHEN allowed THEN (SELECT coalesce(sum(u.a), 0)"
    " FROM unnest(gi, gamts)\n"
    "                                        AS u(ci, a) WHERE u.ci = i) ELSE 0 END;\n"
)
_UPSERTING = (
    "        INSERT INTO usage_rollups AS u (subject, limit_name, dimension, hour_start_us,"
    " value,\n            used, events)\n"
)
_APPENDING = (
    "        INSERT INTO usage_rollup_deltas (subject, limit_name, dimension, hour_start_us,\n"
    "            value, used, events)\n"
)
_UPSERTED = """        ON CONFLICT (subject, limit_name, dimension, hour_start_us, value)
        DO UPDATE SET used = u.used + excluded.used, events = u.events + excluded.events;
"""
_LEANER: tuple[tuple[str, str], ...] = (
    ("draws_t text[]; gi int[] := '{}';", "draws_t text[]; gdrawn bigint[];"),
    (
        "            IF costs[i] <= room OR enfs[i] = 'soft' THEN\n                FOR g IN",
        "            IF wanted > 0 AND (costs[i] <= room OR enfs[i] = 'soft') THEN\n"
        "                FOR g IN",
    ),
    ("gi := gi || i; gids := gids || g.grant_id;", "gids := gids || g.grant_id;"),
    (
        "                END LOOP;\n            END IF;\n            f1[i] := cused[i];",
        "                END LOOP;\n            END IF;\n            gdrawn[i] := drawn;\n"
        "            f1[i] := cused[i];",
    ),
    (  # the counters updated, then created: the same sum each
        _SUMMED + "        UPDATE counters",
        "        gsum := CASE WHEN allowed THEN coalesce(gdrawn[i], 0) ELSE 0 END;\n"
        "        UPDATE counters",
    ),
    (
        _SUMMED + "        INSERT INTO counters",
        "        gsum := CASE WHEN allowed THEN coalesce(gdrawn[i], 0) ELSE 0 END;\n"
        "        INSERT INTO counters",
    ),
    (
        "    IF allowed THEN\n        FOR k IN",
        "    IF allowed AND cardinality(gids) > 0 THEN\n        FOR k IN",
    ),
    (
        _UPSERTING + "        SELECT",
        _APPENDING + "        SELECT",
    ),
    (
        "        FROM jsonb_array_elements((p_charges -> (i - 1)) -> 17) AS d\n" + _UPSERTED,
        "        FROM jsonb_array_elements((p_charges -> (i - 1)) -> 17) AS d;\n",
    ),
    (
        _UPSERTING + "        VALUES",
        _APPENDING + "        VALUES",
    ),
    (
        "            pricev[i]::jsonb ->> 0, (pricev[i]::jsonb ->> 1)::bigint, 1)\n" + _UPSERTED,
        "            pricev[i]::jsonb ->> 0, (pricev[i]::jsonb ->> 1)::bigint, 1);\n",
    ),
    (  # the column's default, `metering_reset_tick()`, in the statement's cached plan
        "        denied_by, reason, charges, metadata)\n",
        "        denied_by, reason, charges, metadata, reset_tick)\n",
    ),
    (
        "v_charges,\n        p_metadata);\n",
        "v_charges,\n"
        "        p_metadata, coalesce((SELECT t.tick FROM reset_clock AS t WHERE t.id = 1), 0));\n",
    ),
)


def consume_one_0042() -> str:
    """Migration 0042's function."""
    path = Path(__file__).with_name("0042_consume_one_held_seats.py")
    spec = importlib.util.spec_from_file_location("consume_one_held_seats_0042", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.skipping(module.consume_one_0041()))


def leaner(function: str) -> str:
    """``function`` (migration 0042's) without the statements it does not need."""
    replaced = function
    for old, new in _LEANER:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(leaner(consume_one_0042()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(consume_one_0042())
