"""One round trip for the usual single event on PostgreSQL: ``metering_consume_one``.

A server-side function that decides one event by exactly the lean rules of
`metering.domain.rules.decide` (`_window`, `_bucket`) and writes what the
hot path would write (counters, first-use windows, the results row), in one
autocommit statement. What it cannot decide it declines, writing nothing,
and Python takes the usual path (see `metering.storage.hot.one_trip`).

A no-op on SQLite.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# The parameters: the limits' version Python's cache holds; the event's id,
# fingerprint, time, decision time and metadata (as stored); its charges in
# event order, each a JSON array:
#   [0 limit, 1 subject, 2 cost, 3 kind ("b" bucket, "c" calendar, "f" first use),
#    4 maximum (the subject's own), 5 enforcement ("hard", "soft", "shadow"),
#    6 a bucket's token in scaled microseconds, 7 a calendar window's start,
#    8 a calendar window's end or a first-use period in microseconds,
#    9 the row's first three fields as compact JSON, 10 percent thresholds,
#    11 unit thresholds (10 and 11 null when the limit has none)];
# and the charges' positions (1-based) in lock order: (limit, subject) sorted
# as Python sorts (COLLATE "C").
#
# It answers a text array: {"ok", outcome, denied_by, charges} or one
# declining code: "stale" (the version moved), "old" (before the subject's
# current first-use window), "notify" (a charge would produce a
# notification). An id that already has a result fails the results insert
# (unique violation on results_pkey), last, so the statement writes nothing:
# no lookup is paid for on every event for the rare repeat.
CONSUME_ONE = r"""
CREATE OR REPLACE FUNCTION metering_consume_one(
    p_version bigint, p_event_id text, p_fingerprint text, p_at bigint, p_now bigint,
    p_metadata text, p_charges jsonb, p_order int[]
) RETURNS text[] LANGUAGE plpgsql AS $fn$
DECLARE
    n int := jsonb_array_length(p_charges);
    c jsonb;
    i int;
    k int;
    names text[]; subjects text[]; costs bigint[]; kinds text[]; maxs bigint[];
    enfs text[]; tokens bigint[]; wss bigint[]; wes bigint[]; prefixes text[];
    -- first-use windows: 0 unchanged, 1 new row, 2 row moved
    wstate int[];
    -- counters
    found_c boolean[]; cused bigint[]; dcount bigint[]; dcost bigint[]; fdat bigint[];
    tat bigint[]; trem bigint[]; tscale bigint[]; changed boolean[];
    -- figures
    fits boolean[]; f1 bigint[]; f2 bigint[]; f3 bigint[]; f4 bigint[]; f5 bigint[];
    f6 bigint[]; f7 bigint[]; f8 bigint[]; f10 bigint[]; newtat numeric[];
    r record;
    v_version bigint;
    cap numeric; tok numeric; now_scaled numeric; base numeric; avail numeric; x numeric;
    applied numeric;
    denied text[] := '{}';
    allowed boolean;
    consumed boolean;
    any_overage boolean := false;
    o text;
    row_text text;
    rows_text text[] := '{}';
    before_used bigint;
    otat bigint; orem bigint; oscale bigint;
    t jsonb;
    v_outcome text;
    v_denied text;
    v_charges text;
BEGIN
    SELECT version INTO v_version FROM limits_version WHERE id = 1;
    IF v_version IS DISTINCT FROM p_version THEN
        RETURN ARRAY['stale'];
    END IF;
    FOR i IN 1..n LOOP
        c := p_charges -> (i - 1);
        names[i] := c ->> 0; subjects[i] := c ->> 1; costs[i] := (c ->> 2)::bigint;
        kinds[i] := c ->> 3; maxs[i] := (c ->> 4)::bigint; enfs[i] := c ->> 5;
        tokens[i] := (c ->> 6)::bigint; prefixes[i] := c ->> 9;
        wstate[i] := 0;
        IF kinds[i] = 'c' THEN
            wss[i] := (c ->> 7)::bigint; wes[i] := (c ->> 8)::bigint;
        ELSIF kinds[i] = 'b' THEN
            wss[i] := 0; wes[i] := 0;
        END IF;
    END LOOP;
    -- Lock the first-use windows, then the counters, each in sorted order
    -- (as `PostgresHotStore.read`); nothing is inserted before every lock is held.
    FOREACH i IN ARRAY p_order LOOP
        CONTINUE WHEN kinds[i] <> 'f';
        SELECT w.window_start_us, w.window_end_us INTO r FROM current_windows AS w
        WHERE w.limit_name = names[i] AND w.subject = subjects[i] FOR UPDATE;
        IF NOT FOUND THEN
            wstate[i] := 1;
            wss[i] := p_at; wes[i] := p_at + ((p_charges -> (i - 1)) ->> 8)::bigint;
        ELSIF r.window_start_us IS NOT NULL AND p_at < r.window_start_us THEN
            RETURN ARRAY['old'];
        ELSIF r.window_start_us IS NOT NULL AND p_at < r.window_end_us THEN
            wss[i] := r.window_start_us; wes[i] := r.window_end_us;
        ELSE
            wstate[i] := 2;
            wss[i] := p_at; wes[i] := p_at + ((p_charges -> (i - 1)) ->> 8)::bigint;
        END IF;
    END LOOP;
    FOREACH i IN ARRAY p_order LOOP
        SELECT c2.used, c2.denied_count, c2.denied_cost, c2.first_denied_at_us, c2.tat_us,
               c2.tat_rem, c2.tat_scale
        INTO r FROM counters AS c2
        WHERE c2.limit_name = names[i] AND c2.subject = subjects[i]
          AND c2.window_start_us = wss[i]
        FOR UPDATE;
        IF FOUND THEN
            found_c[i] := true;
            cused[i] := r.used; dcount[i] := r.denied_count; dcost[i] := r.denied_cost;
            fdat[i] := r.first_denied_at_us; tat[i] := r.tat_us; trem[i] := r.tat_rem;
            tscale[i] := r.tat_scale;
        ELSE
            found_c[i] := false;
            cused[i] := 0; dcount[i] := 0; dcost[i] := 0; fdat[i] := NULL; tat[i] := NULL;
            trem[i] := 0; tscale[i] := 1;
        END IF;
        changed[i] := false;
    END LOOP;
    -- The figures of every charge (`_window`, `_bucket`).
    FOR i IN 1..n LOOP
        IF kinds[i] = 'b' THEN
            cap := maxs[i]; tok := tokens[i];
            now_scaled := p_at::numeric * cap;
            base := now_scaled;
            IF tat[i] IS NOT NULL THEN
                x := tat[i]::numeric * tscale[i] + trem[i];
                -- ceil(x * cap / scale), x >= 0
                base := greatest(div(x * cap + tscale[i] - 1, tscale[i]), now_scaled);
            END IF;
            x := cap * tok - (base - now_scaled);
            avail := CASE WHEN x > 0 THEN div(x, tok) ELSE 0 END;
            fits[i] := costs[i] <= avail;
            newtat[i] := base + costs[i] * tok;
            applied := CASE WHEN fits[i] THEN newtat[i] ELSE base END;
            f7[i] := NULL;
            IF NOT fits[i] AND costs[i] <= cap THEN
                x := base + costs[i] * tok - cap * tok;
                f7[i] := CASE WHEN x >= 0 THEN div(x + cap - 1, cap) ELSE -div(-x, cap) END;
            END IF;
            f1[i] := cap - avail;
            f2[i] := cap - avail + costs[i];
            f3[i] := avail;
            f4[i] := CASE WHEN fits[i] THEN avail - costs[i] ELSE avail END;
            f5[i] := div(applied + cap - 1, cap);
            f6[i] := div(base + cap - 1, cap);
            f8[i] := 0;
            f10[i] := 0;
        ELSE
            fits[i] := enfs[i] = 'soft' OR cused[i] + costs[i] <= maxs[i];
            f1[i] := cused[i];
            f2[i] := cused[i] + costs[i];
            f3[i] := greatest(maxs[i] - cused[i], 0);
            f4[i] := greatest(maxs[i] - cused[i] - costs[i], 0);
            f5[i] := wes[i];
            f6[i] := wes[i];
            f7[i] := CASE WHEN NOT fits[i] AND costs[i] <= maxs[i] THEN wes[i] END;
            f8[i] := greatest(cused[i] + costs[i] - maxs[i], 0);
            f10[i] := greatest(cused[i] - maxs[i], 0);
        END IF;
        IF NOT fits[i] AND enfs[i] <> 'shadow' THEN
            denied := denied || names[i];
        END IF;
    END LOOP;
    allowed := cardinality(denied) = 0;
    FOR i IN 1..n LOOP
        consumed := allowed AND fits[i];
        IF NOT fits[i] AND (kinds[i] = 'b' OR dcount[i] = 0) THEN
            RETURN ARRAY['notify'];  -- a denial or would-deny mark: `notices_for`
        END IF;
        IF consumed THEN
            c := p_charges -> (i - 1);
            IF costs[i] <> 0 AND c ->> 10 IS NOT NULL THEN
                -- The thresholds `notices_for` would cross.
                before_used := f2[i] - costs[i];
                FOR t IN SELECT * FROM jsonb_array_elements(c -> 10) LOOP
                    IF before_used * 100 < t::bigint * maxs[i]
                       AND t::bigint * maxs[i] <= f2[i] * 100 THEN
                        RETURN ARRAY['notify'];
                    END IF;
                END LOOP;
                FOR t IN SELECT * FROM jsonb_array_elements(c -> 11) LOOP
                    IF before_used < t::bigint AND t::bigint <= f2[i] THEN
                        RETURN ARRAY['notify'];
                    END IF;
                END LOOP;
            END IF;
            IF enfs[i] = 'soft' AND 0 < f8[i] AND f8[i] <= costs[i] AND costs[i] <> 0 THEN
                RETURN ARRAY['notify'];
            END IF;
            o := CASE WHEN f8[i] > 0 THEN 'overage' ELSE 'allowed' END;
            any_overage := any_overage OR f8[i] > 0;
            row_text := concat_ws(',', prefixes[i], 'true', '"' || o || '"', f2[i]::text,
                f4[i]::text, maxs[i]::text, f8[i]::text,
                CASE WHEN kinds[i] = 'b' THEN 'null' ELSE wss[i]::text END,
                f5[i]::text, coalesce(f7[i]::text, 'null'));
            cused[i] := cused[i] + costs[i];
            IF kinds[i] = 'b' THEN
                otat := tat[i]; orem := trem[i]; oscale := tscale[i];
                tat[i] := div(newtat[i], maxs[i]);
                trem[i] := mod(newtat[i], maxs[i]);
                tscale[i] := maxs[i];
            END IF;
            changed[i] := costs[i] <> 0 OR (kinds[i] = 'b' AND (tat[i], trem[i], tscale[i])
                IS DISTINCT FROM (otat, orem, oscale));
        ELSE
            o := CASE WHEN fits[i] THEN 'allowed'
                      WHEN enfs[i] = 'shadow' THEN 'would_deny' ELSE 'denied' END;
            row_text := concat_ws(',', prefixes[i],
                CASE WHEN fits[i] OR enfs[i] = 'shadow' THEN 'true' ELSE 'false' END,
                '"' || o || '"', f1[i]::text, f3[i]::text, maxs[i]::text, f10[i]::text,
                CASE WHEN kinds[i] = 'b' THEN 'null' ELSE wss[i]::text END,
                f6[i]::text, coalesce(f7[i]::text, 'null'));
            IF NOT fits[i] THEN
                dcount[i] := dcount[i] + 1;
                dcost[i] := dcost[i] + costs[i];
                fdat[i] := coalesce(fdat[i], p_at);
                changed[i] := true;
            END IF;
        END IF;
        rows_text := rows_text || ('[' || row_text || ']');
    END LOOP;
    v_outcome := CASE WHEN NOT allowed THEN 'denied'
                      WHEN any_overage THEN 'overage' ELSE 'allowed' END;
    v_denied := nullif(array_to_string(denied, ','), '');
    v_charges := '[' || array_to_string(rows_text, ',') || ']';
    -- Write as `PostgresHotStore.write`: counters updated, counters created
    -- (sorted), first-use windows created, then moved; the result.
    FOREACH i IN ARRAY p_order LOOP
        CONTINUE WHEN NOT found_c[i] OR NOT changed[i];
        UPDATE counters SET used = cused[i], denied_count = dcount[i], denied_cost = dcost[i],
            first_denied_at_us = fdat[i], tat_us = tat[i], tat_rem = trem[i],
            tat_scale = tscale[i], updated_at_us = p_now
        WHERE limit_name = names[i] AND subject = subjects[i] AND window_start_us = wss[i];
    END LOOP;
    FOREACH i IN ARRAY p_order LOOP
        CONTINUE WHEN found_c[i];
        INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used,
            denied_count, denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale,
            updated_at_us)
        VALUES (names[i], subjects[i], wss[i], wes[i], cused[i], dcount[i], dcost[i], fdat[i],
            tat[i], trem[i], tscale[i], p_now);
    END LOOP;
    FOREACH i IN ARRAY p_order LOOP
        CONTINUE WHEN wstate[i] <> 1;
        INSERT INTO current_windows (limit_name, subject, window_start_us, window_end_us)
        VALUES (names[i], subjects[i], wss[i], wes[i]);
    END LOOP;
    FOREACH i IN ARRAY p_order LOOP
        CONTINUE WHEN wstate[i] <> 2;
        UPDATE current_windows SET window_start_us = wss[i], window_end_us = wes[i]
        WHERE limit_name = names[i] AND subject = subjects[i];
    END LOOP;
    INSERT INTO results (event_id, outcome, fingerprint, occurred_at_us, decided_at_us,
        denied_by, reason, charges, metadata)
    VALUES (p_event_id, v_outcome, p_fingerprint, p_at, p_now, v_denied, NULL, v_charges,
        p_metadata);
    RETURN ARRAY['ok', v_outcome, v_denied, v_charges];
END
$fn$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(CONSUME_ONE)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "DROP FUNCTION IF EXISTS metering_consume_one"
        "(bigint, text, text, bigint, bigint, text, jsonb, int[])"
    )
