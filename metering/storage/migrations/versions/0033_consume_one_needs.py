"""``metering_consume_one`` decides subjects with a time zone and dimensions too.

Migration 0032's function, with a charge's optional elements (worked out by
`metering.engine.one_trip`): 16 the billing month (`zones.billing_month`) of
a counter it creates for a zoned subject (its calendar windows come aligned);
for a first-use window, the month of one opening at the event, so a counter
of an older window with no row is declined (``zone``); 17 the [key, value]
pairs of a limit with dimensions: a consumed charge adds its cost and event
to their hourly rollups (`metering.domain.rollups.rollup_deltas`). PostgreSQL only.

Revision ID: 0033
Revises: 0032
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

_ZONES = (
    (
        "wanted bigint; taken bigint; drawn bigint; g record; pricev text[];",
        "wanted bigint; taken bigint; drawn bigint; g record; pricev text[];\n    monthv text[];",
    ),
    (
        "        pricev[i] := c ->> 15;",
        "        pricev[i] := c ->> 15; monthv[i] := c ->> 16;",
    ),
    (
        "    -- A seat held in the window costs 0 (`seat_cost`), read under the counter's lock.",
        """    -- A zone's first-use month is known for a window opening at the event only.
    FOR i IN 1..n LOOP
        IF monthv[i] IS NOT NULL AND kinds[i] = 'f' AND NOT found_c[i] AND wss[i] <> p_at THEN
            RETURN ARRAY['zone'];
        END IF;
    END LOOP;
    -- A seat held in the window costs 0 (`seat_cost`), read under the counter's lock.""",
    ),
    (
        "    -- A consumed priced charge's amount in the spend rollups",
        """    -- A consumed charge's cost and event by its dimensions (`rollups.rollup_deltas`).
    FOREACH i IN ARRAY p_order LOOP
        CONTINUE WHEN NOT allowed OR NOT fits[i] OR (p_charges -> (i - 1)) ->> 17 IS NULL;
        INSERT INTO usage_rollups AS u (subject, limit_name, dimension, hour_start_us, value,
            used, events)
        SELECT subjects[i], names[i], d ->> 0, p_at - mod(p_at, 3600000000), d ->> 1,
            costs[i], 1
        FROM jsonb_array_elements((p_charges -> (i - 1)) -> 17) AS d
        ON CONFLICT (subject, limit_name, dimension, hour_start_us, value)
        DO UPDATE SET used = u.used + excluded.used, events = u.events + excluded.events;
    END LOOP;
    -- A consumed priced charge's amount in the spend rollups""",
    ),
    (
        "            CASE WHEN wes[i] = 0 THEN NULL\n",
        "            CASE WHEN wes[i] = 0 THEN NULL WHEN monthv[i] IS NOT NULL THEN monthv[i]\n",
    ),
)


def _consume_one_0032() -> str:
    path = Path(__file__).with_name("0032_consume_one_seats.py")
    spec = importlib.util.spec_from_file_location("consume_one_seats_0032", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.with_seats(module._consume_one_0030()))


def with_zones(function: str) -> str:
    """``function`` (migration 0032's) deciding zoned subjects and dimensions."""
    replaced = function
    for old, new in _ZONES:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(with_zones(_consume_one_0032()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_consume_one_0032())
