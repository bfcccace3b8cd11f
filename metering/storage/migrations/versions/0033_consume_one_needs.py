"""``metering_consume_one`` decides zoned subjects, dimensions, pacing, gauges too.

Migration 0032's function, with a charge's optional elements (from
`metering.engine.one_trip`): 16 the billing month (`zones.billing_month`) of a
counter it creates for a zoned subject; a first-use window's is that of one
opening at the event (an older window's counter with no row: ``zone``); 17 the
[key, value] pairs a consumed charge is rolled up by (`rollups.rollup_deltas`);
18 a paced limit's burst in units (`rules._paced`; never with grants); 19 a
gauge's aggregation, ``max`` or ``latest`` (`rules._gauge`). PostgreSQL only.

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

# A paced window (`rules._paced` with no grants): a hard or shadow window's
# allowance is its pace (`pacing.paced_maximum`); a denial retries when back
# on pace (`pacing.paced_retry_us`), else at the next window if it fits one.
_PACED = """        ELSIF pacev[i] IS NOT NULL THEN
            span := wes[i] - wss[i];
            pace := least(maxs[i], div(maxs[i]::numeric * least(greatest(p_at - wss[i], 0), span),
                span)::bigint + pacev[i]);
            room := CASE WHEN enfs[i] = 'soft' THEN maxs[i] ELSE pace END;
            fits[i] := enfs[i] = 'soft' OR cused[i] + costs[i] <= room OR costs[i] = 0;
            ahead[i] := enfs[i] = 'soft' AND pace < cused[i] + costs[i]
                AND cused[i] + costs[i] <= maxs[i];
            f1[i] := cused[i];
            f2[i] := cused[i] + costs[i];
            f3[i] := greatest(room - cused[i], 0);
            f4[i] := greatest(room - cused[i] - costs[i], 0);
            f5[i] := wes[i];
            f6[i] := wes[i];
            f7[i] := NULL;
            IF NOT fits[i] THEN
                wanted := cused[i] + costs[i];
                IF wanted <= maxs[i] THEN
                    back := CASE WHEN wanted <= pacev[i] THEN wss[i]
                        ELSE wss[i] + div((wanted - pacev[i])::numeric * span + maxs[i] - 1,
                                          maxs[i])::bigint END;
                    IF p_at < back AND back < wes[i] THEN
                        f7[i] := back;
                    END IF;
                END IF;
                IF f7[i] IS NULL AND costs[i] <= maxs[i] THEN
                    f7[i] := wes[i];
                END IF;
            END IF;
            f8[i] := CASE WHEN costs[i] = 0 THEN 0
                          ELSE greatest(cused[i] + costs[i] - maxs[i], 0) END;
            f10[i] := greatest(cused[i] - maxs[i], 0);
"""

# A gauge's report (`rules._gauge`, `windows.gauge_level`): hard and shadow fit
# iff the level is at most the maximum; ``max`` keeps the peak, ``latest`` the
# report unless older than the level's instant (kept in ``tat_us``).
_GAUGE = """        ELSIF gaugev[i] IS NOT NULL THEN
            IF gaugev[i] = 'max' THEN
                f2[i] := greatest(cused[i], costs[i]); glevel_at[i] := NULL;
            ELSIF tat[i] IS NULL OR p_at >= tat[i] THEN
                f2[i] := costs[i]; glevel_at[i] := p_at;
            ELSE
                f2[i] := cused[i]; glevel_at[i] := tat[i];
            END IF;
            fits[i] := enfs[i] = 'soft' OR costs[i] <= maxs[i];
            f1[i] := cused[i];
            f3[i] := greatest(maxs[i] - cused[i], 0);
            f4[i] := greatest(maxs[i] - f2[i], 0);
            f5[i] := wes[i];
            f6[i] := wes[i];
            f7[i] := NULL;
            f8[i] := CASE WHEN enfs[i] = 'soft' AND f2[i] > maxs[i] THEN f2[i] - maxs[i] ELSE 0 END;
            f10[i] := greatest(cused[i] - maxs[i], 0);
"""

_PLAIN = "        ELSE\n            fits[i] := enfs[i] = 'soft' OR cused[i] + costs[i] <= maxs[i]"

_NEEDS = (
    (
        "wanted bigint; taken bigint; drawn bigint; g record; pricev text[];",
        "wanted bigint; taken bigint; drawn bigint; g record; pricev text[];\n"
        "    monthv text[]; pacev bigint[]; ahead boolean[];\n"
        "    span bigint; pace bigint; back bigint; gaugev text[]; glevel_at bigint[];",
    ),
    (
        "        pricev[i] := c ->> 15;",
        "        pricev[i] := c ->> 15; monthv[i] := c ->> 16;"
        " pacev[i] := (c ->> 18)::bigint; ahead[i] := false;\n"
        "        gaugev[i] := c ->> 19;",
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
    (_PLAIN, _PACED + _GAUGE + _PLAIN),
    (  # a gauge's thresholds are crossed from its level before (`notices_for`)
        "            IF costs[i] <> 0 AND c ->> 10 IS NOT NULL THEN\n"
        "                -- The thresholds `notices_for` would cross.\n"
        "                before_used := f2[i] - costs[i];",
        "            IF (CASE WHEN gaugev[i] IS NULL THEN costs[i] <> 0 ELSE f2[i] <> f1[i] END)\n"
        "               AND c ->> 10 IS NOT NULL THEN\n"
        "                -- The thresholds `notices_for` would cross.\n"
        "                before_used := CASE WHEN gaugev[i] IS NULL THEN f2[i] - costs[i]"
        " ELSE f1[i] END;",
    ),
    (
        "            IF enfs[i] = 'soft' AND 0 < f8[i] AND f8[i] <= costs[i]"
        " AND costs[i] <> 0 THEN",
        "            IF enfs[i] = 'soft' AND (CASE WHEN gaugev[i] IS NULL\n"
        "                   THEN 0 < f8[i] AND f8[i] <= costs[i] AND costs[i] <> 0\n"
        "                   ELSE 0 < f8[i] AND f1[i] <= maxs[i] AND f2[i] <> f1[i] END) THEN",
    ),
    (
        "            cused[i] := cused[i] + costs[i];",
        """            IF gaugev[i] IS NOT NULL THEN  -- a level, not a sum (`rules._apply`)
                otat := tat[i];
                tat[i] := coalesce(glevel_at[i], tat[i]);
                changed[i] := f2[i] <> cused[i] OR tat[i] IS DISTINCT FROM otat;
                cused[i] := f2[i];
            ELSE
                cused[i] := cused[i] + costs[i];
            END IF;""",
    ),
    (
        "            changed[i] := costs[i] <> 0 OR (kinds[i] = 'b'",
        "            changed[i] := changed[i] OR (gaugev[i] IS NULL AND costs[i] <> 0)\n"
        "                OR (kinds[i] = 'b'",
    ),
    (
        "            o := CASE WHEN f8[i] > 0 THEN 'overage' ELSE 'allowed' END;",
        "            o := CASE WHEN f8[i] > 0 THEN 'overage'\n"
        "                      WHEN ahead[i] AND costs[i] <> 0 THEN 'ahead_of_pace'"
        " ELSE 'allowed' END;",
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


def with_needs(function: str) -> str:
    """``function`` (migration 0032's) deciding zoned subjects, dimensions, pacing, gauges."""
    replaced = function
    for old, new in _NEEDS:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(with_needs(_consume_one_0032()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_consume_one_0032())
