"""``metering_consume_one`` prices tiers and flat fees, and steps runaway breakers.

Migration 0033's function, with a charge's optional elements (`metering.engine.one_trip`):
20 a price by the window's total [currency, model, flat fee, tiers, package, per package,
per unit]: `money.tiered_amount` of the locked counter's used, in exact numerics; 21 a spend
charge's priced charges (positions from 1), whose amounts it costs, before the charges are
judged; 22 a breaker [factor, floor, quarantine maximum, enforcement]: its row locked after
the counters, a quarantined charge held to it, unpaid, unpaced; a consumed charge steps it
as `breaker.step`, in the same float8 operations and libm ``exp`` (`metering_decayed`); a
trip is declined (``notify``: its notice carries a signed link). PostgreSQL only.

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

# `breaker._decayed`: PostgreSQL's float8 ``exp`` and product are C's, but
# raise where the result is 0 (an underflow), which Python's are.
_DECAYED = """
CREATE OR REPLACE FUNCTION metering_decayed(p_rate double precision, p_gap bigint, p_tau bigint)
RETURNS double precision LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    x double precision;
BEGIN
    IF p_gap <= 0 THEN
        RETURN p_rate;
    ELSIF p_gap > 4320000000000 OR p_rate = 0 THEN
        RETURN 0.0;
    END IF;
    x := CAST(-p_gap AS double precision) / CAST(p_tau * 1000000 AS double precision);
    IF x > -600 AND p_rate > 1e-30 THEN
        RETURN p_rate * exp(x);
    END IF;
    BEGIN
        RETURN p_rate * exp(x);
    EXCEPTION WHEN numeric_value_out_of_range THEN
        RETURN 0.0;
    END;
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


_BREAKERS = (
    (
        "    amount numeric; spent numeric;",
        "    amount numeric; spent numeric;\n"
        "    brk jsonb[]; bfound boolean[]; bstep boolean[]; bshort double precision[];\n"
        "    blong double precision[]; bat bigint[]; bsince bigint[]; bover bigint[];\n"
        "    bq bigint[]; short_r double precision; long_r double precision;\n"
        "    bound double precision; since bigint;",
    ),
    (
        "        gaugev[i] := c ->> 19;",
        "        gaugev[i] := c ->> 19; brk[i] := c -> 22; bstep[i] := false;",
    ),
    (
        "    -- A zone's first-use month is known for a window opening at the event only.",
        """    -- The breakers, locked after the counters (`Breakers.read`); a quarantined
    -- charge is held to its quarantine: hard (or shadow), unpaced, unpaid.
    FOREACH i IN ARRAY p_order LOOP
        CONTINUE WHEN brk[i] IS NULL;
        SELECT b.short_rate, b.long_rate, b.rate_at_us, b.since_us, b.over_since_us,
               b.quarantined_at_us
        INTO r FROM breakers AS b
        WHERE b.limit_name = names[i] AND b.subject = subjects[i] FOR UPDATE;
        bfound[i] := FOUND;
        IF FOUND THEN
            bshort[i] := r.short_rate; blong[i] := r.long_rate; bat[i] := r.rate_at_us;
            bsince[i] := r.since_us; bover[i] := r.over_since_us;
            bq[i] := r.quarantined_at_us;
        ELSE
            bshort[i] := 0.0; blong[i] := 0.0; bat[i] := p_now; bsince[i] := p_now;
            bover[i] := NULL; bq[i] := NULL;
        END IF;
        IF bq[i] IS NOT NULL THEN
            maxs[i] := (brk[i] ->> 2)::bigint; enfs[i] := brk[i] ->> 3;
            pacev[i] := NULL; gflag[i] := false;
        END IF;
    END LOOP;
    -- A zone's first-use month is known for a window opening at the event only.""",
    ),
    (
        "    -- Write as `PostgresHotStore.write`: counters updated, counters created",
        """    -- A consumed charge steps its breaker (`breaker.step`, float8 as Python's
    -- floats); one that trips is declined: its notice carries a signed link.
    FOR i IN 1..n LOOP
        CONTINUE WHEN brk[i] IS NULL OR NOT allowed OR NOT fits[i];
        short_r := metering_decayed(bshort[i], p_now - bat[i], 60);
        long_r := metering_decayed(blong[i], p_now - bat[i], 86400);
        bshort[i] := short_r + CAST(greatest(costs[i], 0) AS double precision) / 60.0::float8;
        blong[i] := long_r + CAST(greatest(costs[i], 0) AS double precision) / 86400.0::float8;
        bat[i] := greatest(bat[i], p_now);
        bstep[i] := true;
        CONTINUE WHEN bq[i] IS NOT NULL;
        IF brk[i] ->> 1 IS NOT NULL THEN
            long_r := greatest(long_r, (brk[i] ->> 1)::double precision);
        ELSIF p_now - bsince[i] < 86400000000 THEN
            bover[i] := NULL;
            CONTINUE;
        END IF;
        bound := (brk[i] ->> 0)::double precision * long_r;
        IF bshort[i] <= bound THEN
            bover[i] := NULL;
            CONTINUE;
        END IF;
        since := CASE WHEN bover[i] IS NOT NULL AND short_r > bound THEN bover[i] ELSE p_now END;
        IF p_now - since >= 60000000 THEN
            RETURN ARRAY['notify'];  -- it trips: `limit.quarantined`
        END IF;
        bover[i] := since;
    END LOOP;
    -- Write as `PostgresHotStore.write`: counters updated, counters created""",
    ),
    (
        "    -- A consumed charge's cost and event by its dimensions (`rollups.rollup_deltas`).",
        """    -- The breakers stepped (`BreakerStore.write`).
    FOREACH i IN ARRAY p_order LOOP
        CONTINUE WHEN NOT coalesce(bstep[i], false);
        INSERT INTO breakers AS b (limit_name, subject, short_rate, long_rate, rate_at_us,
            since_us, over_since_us, quarantined_at_us)
        VALUES (names[i], subjects[i], bshort[i], blong[i], bat[i], bsince[i], bover[i], bq[i])
        ON CONFLICT (subject, limit_name) DO UPDATE SET short_rate = excluded.short_rate,
            long_rate = excluded.long_rate, rate_at_us = excluded.rate_at_us,
            since_us = excluded.since_us, over_since_us = excluded.over_since_us,
            quarantined_at_us = excluded.quarantined_at_us;
    END LOOP;
    -- A consumed charge's cost and event by its dimensions (`rollups.rollup_deltas`).""",
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
    """``function`` (migration 0033's) pricing tiers and flat fees, stepping breakers."""
    replaced = function
    for old, new in (*_TIERS, *_BREAKERS):
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_ROUND_MICRO)
        op.execute(_WINDOW_PRICE)
        op.execute(_DECAYED)
        op.execute(with_tiers(_consume_one_0033()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_consume_one_0033())
        op.execute("DROP FUNCTION metering_window_price(jsonb, numeric)")
        op.execute("DROP FUNCTION metering_round_micro(numeric)")
        op.execute("DROP FUNCTION metering_decayed(double precision, bigint, bigint)")
