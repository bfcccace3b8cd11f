"""Regenerate the README's report charts from a demo ledger.

    .venv/bin/python docs/make_charts.py

Records three months (September to November 2026) of usage of eight
organisations through `Meter.consume` on a throw-away SQLite database, with a
frozen clock set to each event's time, then draws the charts with the chart
command itself:

    metering report overage --period 2026-11 --top 8 --chart docs/overage-2026-11.png
    metering report usage --subject org-acme --since 2026-09-01 --until 2026-12-01 \\
        --chart docs/usage-org-acme.png
"""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from metering import FrozenClock, Limit, Meter

DOCS = Path(__file__).resolve().parent
LIMITS = (
    Limit("api_calls", maximum=100_000, period="1mo", window="calendar", enforcement="soft"),
    Limit("exports", maximum=20, period="7d"),
)
# Daily API calls (mean) and exports a week of each organisation; some grow.
ORGS = {
    "org-acme": (3_000, 25, 1.006),
    "org-globex": (4_200, 12, 1.0),
    "org-initech": (2_500, 30, 1.01),
    "org-umbrella": (3_600, 8, 0.995),
    "org-hooli": (1_500, 22, 1.02),
    "org-stark": (2_900, 18, 1.0),
    "org-wayne": (2_000, 4, 1.0),
    "org-wonka": (800, 2, 1.0),
}


def events() -> list[tuple[datetime, str, str, int]]:
    rng = random.Random(2026)
    found = []
    day = datetime(2026, 9, 1, tzinfo=UTC)
    for n in range(91):  # September to November
        moment = day + timedelta(days=n)
        for org, (calls, exports, growth) in ORGS.items():
            mean = calls * growth**n
            found.append(
                (moment + timedelta(hours=18), org, "api_calls", int(rng.gauss(mean, mean / 6)))
            )
            for _ in range(rng.randint(0, round(exports * 2 / 7))):
                found.append((moment + timedelta(minutes=rng.randrange(1440)), org, "exports", 1))
    return sorted(found)


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{scratch}/demo.db"
        clock = FrozenClock(datetime(2026, 9, 1, tzinfo=UTC))
        with Meter(url, clock=clock) as meter:
            meter.set_limits(LIMITS)
            for when, org, limit, cost in events():
                clock.set(when)
                meter.consume(org, limit, cost=max(cost, 1), occurred_at=when)
        metering = [sys.executable, "-m", "metering", "--database", url, "report"]
        overage = ["overage", "--period", "2026-11", "--top", "8", "--format", "csv"]
        usage = ["usage", "--subject", "org-acme", "--since", "2026-09-01", "--until", "2026-12-01"]
        subprocess.run(
            [*metering, *overage, "--chart", str(DOCS / "overage-2026-11.png")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [*metering, *usage, "--chart", str(DOCS / "usage-org-acme.png")],
            check=True,
            stdout=subprocess.DEVNULL,
        )


if __name__ == "__main__":
    main()
