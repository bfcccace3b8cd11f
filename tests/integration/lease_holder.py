"""One process of the lease-notice tests: a `Meter` on a frozen clock that
holds a lease of one key, then waits for a change to reach it.

    python lease_holder.py URL START_ISO SUBJECT LIMIT

It leases 100 units, then until it holds unused units, and prints ``{"allowed": n, "holding":
units}``; then, on the line ``change`` from stdin, waits (at most 10 s) for
its book to apply a change notice and leases until it is denied (at most
``LIMIT``'s maximum times), printing ``{"notices": n, "allowed": m}``; on
``close`` it settles its leases and exits. The frozen clock keeps every
lease serving: only a notice stops one.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime

from metering import FrozenClock, Meter

WAIT_SECONDS = 10.0
MOST = 2000
HOT = 100  # leased before holding: blocks grow with the key's demand


def hold(meter: Meter, subject: str, limit: str) -> dict[str, int]:
    allowed = 0
    while (allowed < HOT or meter.leases.held_units() == 0) and allowed < MOST:
        allowed += meter.lease(subject, limit).allowed
    return {"allowed": allowed, "holding": meter.leases.held_units()}


def after_change(meter: Meter, subject: str, limit: str) -> dict[str, int]:
    book = meter.leases
    give_up = time.monotonic() + WAIT_SECONDS
    while getattr(book, "notices", 0) == 0 and time.monotonic() < give_up:
        time.sleep(0.01)
    allowed = 0
    for _ in range(MOST):
        if not meter.lease(subject, limit).allowed:
            break
        allowed += 1
    return {"notices": getattr(book, "notices", 0), "allowed": allowed}


def main() -> None:
    url, start, subject, limit = sys.argv[1:5]
    with Meter(url, clock=FrozenClock(datetime.fromisoformat(start))) as meter:
        print(json.dumps(hold(meter, subject, limit)), flush=True)
        for line in sys.stdin:
            if line.strip() == "change":
                print(json.dumps(after_change(meter, subject, limit)), flush=True)
            elif line.strip() == "close":
                break


if __name__ == "__main__":
    main()
