"""Backtest speed: replaying stored results through proposed limits (`Meter.simulate`).

Fills a SQLite ledger with ``--rows`` results in one statement (a recursive
CTE: no events are decided to make them), spread over ``--days`` days and
``--subjects`` subjects of an hourly limit, a tenth of them denied; then
times one replay of the whole period through a lower maximum, and prints
the figure and the rate. The issue's target: 1M results in under a minute.

    .venv/bin/python bench/simulate.py --rows 1000000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import common  # noqa: F401  (first: the package of this checkout, `common.ROOT`)
from sqlalchemy import text

from metering import FrozenClock, Limit, Meter
from metering.domain.instants import to_us

NOW = datetime(2026, 11, 23, tzinfo=UTC)
DAY_US = 86_400 * 1_000_000

FILL = """
WITH RECURSIVE n(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM n WHERE x < :last)
INSERT INTO results (event_id, outcome, fingerprint, occurred_at_us, decided_at_us,
                     denied_by, reason, charges, metadata)
SELECT 'evt-' || x,
       CASE WHEN x % 10 = 0 THEN 'denied' ELSE 'allowed' END,
       'f',
       :start + x * :step,
       :start + x * :step,
       CASE WHEN x % 10 = 0 THEN 'api_calls' END,
       NULL,
       '[["org-' || (x % :subjects) || '","api_calls",' || (1 + x % 3) || ','
         || CASE WHEN x % 10 = 0 THEN 'false,"denied"' ELSE 'true,"allowed"' END
         || ',1,99,100,0,0,0,null]]',
       NULL
FROM n
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--subjects", type=int, default=1_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'bench.db'}"
        with Meter(url, clock=FrozenClock(NOW)) as meter:
            meter.set_limit(Limit("api_calls", maximum=100, period="1h", window="calendar"))
            start_us = to_us(NOW) - args.days * DAY_US + 1
            step_us = (args.days * DAY_US - 2) // args.rows
            params = {
                "last": args.rows - 1,
                "start": start_us,
                "step": step_us,
                "subjects": args.subjects,
            }
            began = time.perf_counter()
            with meter.sql_engine.begin() as connection:
                connection.execute(text(FILL), params)
            filled = time.perf_counter() - began
            proposed = [Limit("api_calls", maximum=2, period="1h", window="calendar")]
            began = time.perf_counter()
            found = meter.simulate(proposed, since=timedelta(days=args.days))
            took = time.perf_counter() - began
    denied = sum(row.would_deny_events for row in found.rows)
    print(f"filled {args.rows:,} results in {filled:.1f} s")
    print(
        f"replayed {found.events:,} events ({len(found.rows):,} subject-limit rows, "
        f"{denied:,} would be denied) in {took:.1f} s: {found.events / took:,.0f} events/s"
    )


if __name__ == "__main__":
    main()
