"""``metering_consume_one`` prices tiers and flat fees by the locked counter's total.

Migration 0033's function, with a charge's optional elements (from
`metering.engine.one_trip`): 20 a price by the window's total, [currency, model,
flat fee, tiers, package, per package, per unit], whose amount is
`money.tiered_amount` of the counter's used before the event, in exact numerics
(`metering_window_price`, `metering_round_micro`); 21 a spend charge's priced
charges (positions from 1), whose amounts it costs (`money.spend_charges`).
Both are set before the charges are judged: all or nothing. PostgreSQL only.

Revision ID: 0034
Revises: 0033
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

# `money.round_micro`: micro-minor units to minor units, half to even.
_ROUND_MICRO = """
CREATE OR REPLACE FUNCTION metering_round_micro(p_micro numeric) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    whole numeric := div(p_micro, 1000000);
    twice numeric := 2 * (p_micro - div(p_micro, 1000000) * 1000000);
BEGIN
    IF twice > 1000000 OR (twice = 1000000 AND mod(whole, 2) = 1) THEN
        RETURN whole + 1;
    END IF;
    RETURN whole;
END
$fn$
"""

# `money.window_price`: a window's total's price in micro-minor units, flat fee
# excluded, of a price as element 20 spells it.
_WINDOW_PRICE = """
CREATE OR REPLACE FUNCTION metering_window_price(p_price jsonb, p_total numeric)
RETURNS numeric LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    model text := p_price ->> 1;
    t jsonb;
    up numeric;
    each numeric;
    tier_end numeric;
    found numeric := 0;
    start numeric := 0;
BEGIN
    IF p_total <= 0 THEN
        RETURN 0;
    END IF;
    IF model = 'package' THEN
        RETURN div(p_total + (p_price ->> 4)::numeric - 1, (p_price ->> 4)::numeric)
            * (p_price ->> 5)::numeric;
    ELSIF model = 'per_unit' THEN
        RETURN p_total * (p_price ->> 6)::numeric;
    END IF;
    FOR t IN SELECT * FROM jsonb_array_elements(p_price -> 3) LOOP
        up := (t ->> 0)::numeric;
        each := (t ->> 1)::numeric;
        IF model = 'graduated' THEN
            tier_end := CASE WHEN up IS NULL THEN p_total ELSE least(p_total, up) END;
            IF tier_end > start THEN
                found := found + (tier_end - start) * each;
            END IF;
            EXIT WHEN up IS NULL OR p_total <= up;
            start := up;
        ELSE  -- volume: the highest of n times its tier's price over n up to the total
            IF up IS NULL OR p_total <= up THEN
                RETURN greatest(found, p_total * each);
            END IF;
            found := greatest(found, up * each);
        END IF;
    END LOOP;
    RETURN found;
END
$fn$
"""

_TIERS = (
    (
        "    span bigint; pace bigint; back bigint; gaugev text[]; glevel_at bigint[];",
        "    span bigint; pace bigint; back bigint; gaugev text[]; glevel_at bigint[];\n"
        "    amount numeric; spent numeric;",
    ),
    (
        "    -- The figures of every charge (`_window`, `_bucket`).",
        """    -- A price by the window's total: `money.tiered_amount` of the counter's
    -- used before the event; then each spend charge the sum of its priced
    -- charges' amounts (`money.spend_charges`), its row's cost with it.
    FOR i IN 1..n LOOP
        c := p_charges -> (i - 1);
        CONTINUE WHEN c ->> 20 IS NULL;
        IF costs[i] <= 0 THEN
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
        pricev[i] := '[' || (c -> 20 -> 0)::text || ',' || amount::bigint::text || ']';
    END LOOP;
    FOR i IN 1..n LOOP
        c := p_charges -> (i - 1);
        CONTINUE WHEN c ->> 21 IS NULL;
        spent := 0;
        FOR t IN SELECT * FROM jsonb_array_elements(c -> 21) LOOP
            spent := spent + (pricev[t::int]::jsonb ->> 1)::numeric;
        END LOOP;
        prefixes[i] := left(prefixes[i], length(prefixes[i]) - length(costs[i]::text))
            || spent::bigint::text;
        costs[i] := spent::bigint;
    END LOOP;
    -- The figures of every charge (`_window`, `_bucket`).""",
    ),
)


def _consume_one_0033() -> str:
    path = Path(__file__).with_name("0033_consume_one_needs.py")
    spec = importlib.util.spec_from_file_location("consume_one_needs_0033", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.with_needs(module._consume_one_0032()))


def with_tiers(function: str) -> str:
    """``function`` (migration 0033's) pricing tiers and flat fees itself."""
    replaced = function
    for old, new in _TIERS:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_ROUND_MICRO)
        op.execute(_WINDOW_PRICE)
        op.execute(with_tiers(_consume_one_0033()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_consume_one_0033())
        op.execute("DROP FUNCTION metering_window_price(jsonb, numeric)")
        op.execute("DROP FUNCTION metering_round_micro(numeric)")
