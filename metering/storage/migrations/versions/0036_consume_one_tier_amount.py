"""``metering_consume_one`` prices a charge by its window's total in one call, without queries.

Migration 0034's function, but a price by the window's total (element 20) is found by
``metering_tiered_amount``: `money.tiered_amount` in exact numerics, both window prices
and their rounding in one PL/pgSQL call whose tiers are read by index (0034's
``metering_window_price`` ran a query over them per call, twice a charge, and rounded in
two more calls); a spend charge's priced charges (21) are summed by index too, not by a
query. The amounts are those of 0034. PostgreSQL only.

Revision ID: 0036
Revises: 0035
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None

# `money.tiered_amount` of a price as element 20 spells it [currency, model,
# flat fee, tiers, package, per package, per unit], on a counter that held
# ``p_used``: the rounded (half to even) window prices after and before.
_TIERED_AMOUNT = """
CREATE OR REPLACE FUNCTION metering_tiered_amount(p_price jsonb, p_used numeric, p_cost numeric)
RETURNS numeric LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    model text := p_price ->> 1;
    tiers jsonb := p_price -> 3;
    last int := coalesce(jsonb_array_length(p_price -> 3), 0) - 1;
    rounded numeric[] := ARRAY[0, 0];
    total numeric; found numeric; start numeric; up numeric; each numeric; tier_end numeric;
    whole numeric; twice numeric; j int; k int;
BEGIN
    IF p_cost <= 0 THEN
        RETURN 0;
    END IF;
    FOR j IN 1..2 LOOP
        total := CASE WHEN j = 1 THEN p_used ELSE p_used + p_cost END;
        found := 0;
        start := 0;
        IF model = 'per_unit' THEN  -- the charge on its own
            found := CASE WHEN j = 1 THEN 0 ELSE p_cost * (p_price ->> 6)::numeric END;
        ELSIF total <= 0 THEN
            found := 0;
        ELSIF model = 'package' THEN
            found := div(total + (p_price ->> 4)::numeric - 1, (p_price ->> 4)::numeric)
                * (p_price ->> 5)::numeric;
        ELSE
            FOR k IN 0..last LOOP
                up := (tiers -> k ->> 0)::numeric;
                each := (tiers -> k ->> 1)::numeric;
                IF model = 'graduated' THEN
                    tier_end := CASE WHEN up IS NULL THEN total ELSE least(total, up) END;
                    IF tier_end > start THEN
                        found := found + (tier_end - start) * each;
                    END IF;
                    EXIT WHEN up IS NULL OR total <= up;
                    start := up;
                ELSE  -- volume: the highest of n times its tier's price over n up to the total
                    IF up IS NULL OR total <= up THEN
                        found := greatest(found, total * each);
                        EXIT;
                    END IF;
                    found := greatest(found, up * each);
                END IF;
            END LOOP;
        END IF;
        whole := div(found, 1000000);
        twice := 2 * (found - whole * 1000000);
        IF twice > 1000000 OR (twice = 1000000 AND mod(whole, 2) = 1) THEN
            whole := whole + 1;
        END IF;
        rounded[j] := whole;
    END LOOP;
    RETURN rounded[2] - rounded[1] + CASE WHEN p_used <= 0 THEN (p_price ->> 2)::numeric ELSE 0 END;
END
$fn$
"""

_ONE_CALL = (
    (
        "    amount numeric; spent numeric;",
        "    amount numeric; spent numeric; sk int;",
    ),
    (
        """        IF costs[i] <= 0 THEN
            amount := 0;
        ELSIF c -> 20 ->> 1 = 'per_unit' THEN
            amount := metering_round_micro(costs[i] * (c -> 20 ->> 6)::numeric);
        ELSE
            amount := metering_round_micro(metering_window_price(c -> 20, cused[i] + costs[i]))
                - metering_round_micro(metering_window_price(c -> 20, cused[i]));
        END IF;
        IF costs[i] > 0 AND cused[i] <= 0 THEN
            amount := amount + (c -> 20 ->> 2)::numeric;
        END IF;
""",
        """        amount := metering_tiered_amount(c -> 20, cused[i], costs[i]);
""",
    ),
    (
        """        FOR t IN SELECT * FROM jsonb_array_elements(c -> 21) LOOP
            spent := spent + (pricev[t::int]::jsonb ->> 1)::numeric;
        END LOOP;
""",
        """        FOR sk IN 0..jsonb_array_length(c -> 21) - 1 LOOP
            spent := spent + (pricev[(c -> 21 ->> sk)::int]::jsonb ->> 1)::numeric;
        END LOOP;
""",
    ),
)


def _consume_one_0034() -> str:
    path = Path(__file__).with_name("0034_consume_one_tiers_breakers.py")
    spec = importlib.util.spec_from_file_location("consume_one_tiers_0034", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.with_tiers(module._consume_one_0033()))


def with_one_call(function: str) -> str:
    """``function`` (migration 0034's) pricing a charge in one `_TIERED_AMOUNT` call."""
    replaced = function
    for old, new in _ONE_CALL:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_TIERED_AMOUNT)
        op.execute(with_one_call(_consume_one_0034()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_consume_one_0034())
        op.execute("DROP FUNCTION metering_tiered_amount(jsonb, numeric, numeric)")
