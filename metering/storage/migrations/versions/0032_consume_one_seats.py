"""``metering_consume_one`` decides seats, grants and flat prices too.

Migration 0030's function, with a charge's optional elements: 12 a seat's
value (`metering.domain.distinct.value_of`), 13 its row's first three
fields at cost 0, 14 whether the subject has grants on the limit, 15 a
priced charge's [currency, amount] (the spend charges come with the event,
added by `metering.engine.one_trip`).

* Seats: under the counter's lock the value's live events are read; a held
  value costs 0 (it always fits, with no overage), else 1 (`seat_cost`); a
  consumed charge adds its event to the value's live events.
* Grants (`metering.domain.grants.fit_window`): the own allowance pays
  first, then the grants active at the event in draw order, read unlocked;
  each draw is written only if the grant's ``used`` is still what was read,
  else the statement fails and writes nothing (the fast path decides). A
  draw that leaves a grant at its low threshold, or a granted pair with
  thresholds, declines (``notify``).
* Prices: a consumed priced charge's row carries its price, and its amount
  goes to the spend rollups (`metering.domain.rollups.spend_deltas`).

PostgreSQL only.

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

# A charge on a (limit, subject) with grants (`rules._window` with a pot,
# `grants.fit_window`): its window's own usage is ``used`` less what grants
# paid in it; the own allowance pays first, then the grants active at the
# event, by priority, earliest expiry, earliest start and id. A pair with
# thresholds is declined (``notify``).
_GRANT_FIGURES = """        ELSIF gflag[i] THEN
            IF (p_charges -> (i - 1)) ->> 10 IS NOT NULL THEN
                RETURN ARRAY['notify'];
            END IF;
            SELECT coalesce(sum(d.amount), 0) INTO drawn FROM grant_draws AS d
            WHERE d.subject = subjects[i] AND d.limit_name = names[i]
              AND d.window_start_us = wss[i];
            own_used := cused[i] - drawn;
            own_room := CASE WHEN own_used < maxs[i] THEN maxs[i] - own_used ELSE 0 END;
            SELECT coalesce(sum(g2.amount - g2.used) FILTER (
                       WHERE g2.effective_from_us <= p_at
                         AND (g2.expires_at_us IS NULL OR p_at < g2.expires_at_us)), 0),
                   coalesce(sum(g2.amount - g2.used) FILTER (
                       WHERE g2.effective_from_us <= wes[i]
                         AND (g2.expires_at_us IS NULL OR wes[i] < g2.expires_at_us)), 0)
            INTO gavail, gavail_end FROM grants AS g2
            WHERE g2.limit_name = names[i] AND g2.subject = subjects[i] AND g2.used < g2.amount;
            room := CASE WHEN enfs[i] = 'soft' OR own_used <= maxs[i]
                         THEN own_room + gavail ELSE 0 END;
            fits[i] := enfs[i] = 'soft' OR costs[i] <= room OR costs[i] = 0;
            wanted := greatest(costs[i] - own_room, 0);
            drawn := 0;
            glow[i] := false;
            IF costs[i] <= room OR enfs[i] = 'soft' THEN
                FOR g IN SELECT g2.grant_id, g2.amount - g2.used AS left_, g2.used, g2.low_at,
                                g2.low_sent
                         FROM grants AS g2
                         WHERE g2.limit_name = names[i] AND g2.subject = subjects[i]
                           AND g2.used < g2.amount AND g2.effective_from_us <= p_at
                           AND (g2.expires_at_us IS NULL OR p_at < g2.expires_at_us)
                         ORDER BY g2.priority, coalesce(g2.expires_at_us, 4611686018427387904),
                                  g2.effective_from_us, g2.grant_id COLLATE "C" LOOP
                    EXIT WHEN wanted <= 0;
                    taken := least(g.left_, wanted);
                    draws_t[i] := concat_ws(',', draws_t[i],
                        '[' || to_jsonb(g.grant_id)::text || ',' || taken::text || ']');
                    gi := gi || i; gids := gids || g.grant_id; gamts := gamts || taken;
                    gused := gused || g.used;
                    glow[i] := glow[i] OR (g.low_at IS NOT NULL AND NOT g.low_sent
                                           AND g.left_ - taken <= g.low_at);
                    wanted := wanted - taken;
                    drawn := drawn + taken;
                END LOOP;
            END IF;
            f1[i] := cused[i];
            f2[i] := cused[i] + costs[i];
            f3[i] := room;
            f4[i] := greatest(room - costs[i], 0);
            f5[i] := wes[i];
            f6[i] := wes[i];
            f7[i] := CASE WHEN NOT fits[i] AND costs[i] <= maxs[i] + gavail_end THEN wes[i] END;
            f8[i] := CASE WHEN costs[i] = 0 THEN 0
                          ELSE greatest(own_used + costs[i] - drawn - maxs[i], 0) END;
            f10[i] := greatest(own_used - maxs[i], 0);
"""

_SEATS = (
    (
        "wss bigint[]; wes bigint[]; prefixes text[];",
        "wss bigint[]; wes bigint[]; prefixes text[];\n    seatv text[]; live bigint;\n"
        "    gflag boolean[]; glow boolean[]; draws_t text[]; gi int[] := '{}';\n"
        "    gids text[] := '{}'; gamts bigint[] := '{}'; gused bigint[] := '{}';\n"
        "    own_used bigint; own_room bigint; gavail bigint; gavail_end bigint; room bigint;\n"
        "    wanted bigint; taken bigint; drawn bigint; g record; pricev text[];",
    ),
    (
        "tokens[i] := (c ->> 6)::bigint; prefixes[i] := c ->> 9;",
        "tokens[i] := (c ->> 6)::bigint; prefixes[i] := c ->> 9;\n"
        "        seatv[i] := c ->> 12; gflag[i] := coalesce((c ->> 14)::boolean, false);\n"
        "        pricev[i] := c ->> 15;",
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
        "        ELSE\n            fits[i] := enfs[i] = 'soft'",
        _GRANT_FIGURES + "        ELSE\n            fits[i] := enfs[i] = 'soft'",
    ),
    (
        "            cused[i] := cused[i] + costs[i];",
        """            IF glow[i] THEN
                RETURN ARRAY['notify'];  -- a grant left at its low threshold: `grants_low`
            END IF;
            IF draws_t[i] IS NOT NULL OR pricev[i] IS NOT NULL THEN
                row_text := row_text || ',[' || coalesce(draws_t[i], '') || ']';
            END IF;
            IF pricev[i] IS NOT NULL THEN  -- a consumed priced charge's (currency, amount)
                row_text := row_text || ',' || pricev[i];
            END IF;
            cused[i] := cused[i] + costs[i];""",
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
    -- The draws, in grant id order; a grant drawn on meanwhile fails the statement.
    IF allowed THEN
        FOR k IN SELECT u.n FROM unnest(gids) WITH ORDINALITY AS u(id, n)
                 ORDER BY u.id COLLATE "C" LOOP
            UPDATE grants SET used = used + gamts[k]
            WHERE grant_id = gids[k] AND used = gused[k];
            IF NOT FOUND THEN
                RAISE EXCEPTION 'a grant was drawn on concurrently' USING ERRCODE = 'MX001';
            END IF;
            INSERT INTO grant_draws AS d (subject, limit_name, window_start_us, grant_id, amount)
            VALUES (subjects[gi[k]], names[gi[k]], wss[gi[k]], gids[k], gamts[k])
            ON CONFLICT (subject, limit_name, window_start_us, grant_id)
            DO UPDATE SET amount = d.amount + excluded.amount;
        END LOOP;
    END IF;
    -- A consumed priced charge's amount in the spend rollups (`rollups.spend_deltas`).
    FOREACH i IN ARRAY p_order LOOP
        CONTINUE WHEN pricev[i] IS NULL OR NOT allowed OR NOT fits[i];
        INSERT INTO usage_rollups AS u (subject, limit_name, dimension, hour_start_us, value,
            used, events)
        VALUES (subjects[i], names[i], '$spend', p_at - mod(p_at, 3600000000),
            pricev[i]::jsonb ->> 0, (pricev[i]::jsonb ->> 1)::bigint, 1)
        ON CONFLICT (subject, limit_name, dimension, hour_start_us, value)
        DO UPDATE SET used = u.used + excluded.used, events = u.events + excluded.events;
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
