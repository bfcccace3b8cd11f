"""One process of the connection-budget test: 16 threads on one `Meter`.

    python budget_process.py URL

With the budget from ``METERING_DB_CONNECTIONS``, it prints ``ready``, waits
for a line on stdin (so that every process starts together), then each thread
calls `consume`, `lease`, `check` and `counters`; it prints
``{"answered": n, "errors": [...]}`` (each error's first line) and exits.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

from metering import Meter
from metering.errors import MeteringError

THREADS = 16
CALLS = 30


def calls(meter: Meter, thread: int) -> tuple[int, list[str]]:
    answered, errors = 0, []
    for n in range(CALLS):
        try:
            meter.consume(f"s-{thread}-{n % 3}", "calls")
            meter.lease("hot", "calls")
            if n % 5 == 0:
                meter.check(f"s-{thread}", "calls")
                meter.counters(f"s-{thread}")
            answered += 1
        except MeteringError as exc:
            errors.append(str(exc).splitlines()[0])
    return answered, errors


def main() -> None:
    with Meter(sys.argv[1]) as meter:
        print("ready", flush=True)
        sys.stdin.readline()
        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(lambda t: calls(meter, t), range(THREADS)))
    answered = sum(a for a, _ in results)
    errors = [e for _, found in results for e in found]
    print(json.dumps({"answered": answered, "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
