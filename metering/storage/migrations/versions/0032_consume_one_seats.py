"""``metering_consume_one`` decides seats too.

Migration 0030's function, with a charge's optional seat: element 12 its
value (`metering.domain.distinct.value_of`), element 13 its row's first
three fields at cost 0. Under the counter's lock the function reads the
value's live events in the window (``distinct_values``): a value with one
costs 0 (a seat held: it always fits, with no overage), else the charge
costs its 1 (`seat_cost`); a charge that consumed adds its event to the
value's live events, inserting its first row
(`metering.storage.distinct.DistinctStore.add`). PostgreSQL only.

Revision ID: 0032
Revises: 0031
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

_SEATS = (
    (
        "wss bigint[]; wes bigint[]; prefixes text[];",
        "wss bigint[]; wes bigint[]; prefixes text[];\n    seatv text[]; live bigint;",
    ),
    (
        "tokens[i] := (c ->> 6)::bigint; prefixes[i] := c ->> 9;",
        "tokens[i] := (c ->> 6)::bigint; prefixes[i] := c ->> 9;\n        seatv[i] := c ->> 12;",
    ),
    (
        "    -- The figures of every charge (`_window`, `_bucket`).",
        """    -- A seat held in the window costs 0 (`seat_cost`), read under the counter's lock.
    FOR i IN 1..n LOOP
        CONTINUE WHEN seatv[i] IS NULL;
        SELECT d.live_events INTO live FROM distinct_values AS d
        WHERE d.subject = subjects[i] AND d.limit_name = names[i]
          AND d.window_start_us = wss[i] AND d.value = seatv[i];
        IF live > 0 THEN
            costs[i] := 0;
            prefixes[i] := (p_charges -> (i - 1)) ->> 13;
        END IF;
    END LOOP;
    -- The figures of every charge (`_window`, `_bucket`).""",
    ),
    (  # a cost of 0 (a seat held) always fits and adds no overage, as `rules._window`
        "fits[i] := enfs[i] = 'soft' OR cused[i] + costs[i] <= maxs[i];",
        "fits[i] := enfs[i] = 'soft' OR cused[i] + costs[i] <= maxs[i] OR costs[i] = 0;",
    ),
    (
        "f8[i] := greatest(cused[i] + costs[i] - maxs[i], 0);",
        "f8[i] := CASE WHEN costs[i] = 0 THEN 0\n"
        "                      ELSE greatest(cused[i] + costs[i] - maxs[i], 0) END;",
    ),
    (
        "    INSERT INTO results (event_id,",
        """    -- A consumed seat charge counts its event (a shadow's would-deny does not).
    FOREACH i IN ARRAY p_order LOOP
        CONTINUE WHEN seatv[i] IS NULL OR NOT allowed OR NOT fits[i];
        INSERT INTO distinct_values AS d (subject, limit_name, window_start_us, value,
            live_events)
        VALUES (subjects[i], names[i], wss[i], seatv[i], 1)
        ON CONFLICT (subject, limit_name, window_start_us, value)
        DO UPDATE SET live_events = d.live_events + 1;
    END LOOP;
    INSERT INTO results (event_id,""",
    ),
)


def _consume_one_0030() -> str:
    path = Path(__file__).with_name("0030_billing_month.py")
    spec = importlib.util.spec_from_file_location("billing_month_0030", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module._with_month(module._consume_one_0028()))


def with_seats(function: str) -> str:
    """``function`` (migration 0030's) deciding seats."""
    replaced = function
    for old, new in _SEATS:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(with_seats(_consume_one_0030()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_consume_one_0030())
