"""One process of the lease tests: an ASGI app behind `MeteringMiddleware`
(leases on, the default), hammered in process by ``--tasks`` concurrent
clients of one address, on a frozen clock.

    python lease_hammer.py URL START_ISO [--tasks 4] [--hold UNITS]

It prints ``ready``, waits for a line on stdin (so that every process
starts together), then sends requests until each client was denied once
and prints ``{"allowed": n, "denied": m}``; then it settles its leases
(`Meter.close`) and prints ``settled``. With ``--hold UNITS`` it stops once
it holds that many unused leased units, prints ``{"allowed": n, "holding": units}``
and waits on stdin forever: the test kills it there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from metering import FrozenClock, Meter
from metering.middleware import MeteringMiddleware


async def hello(_request: object) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def hammer(meter: Meter, tasks: int, hold: int) -> dict[str, int]:
    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(MeteringMiddleware, meter=meter, limit="hard")
    transport = httpx.ASGITransport(app=app, client=("192.0.2.7", 4711))
    counts = {"allowed": 0, "denied": 0}
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:

        async def one_client() -> None:
            while True:
                if hold and meter.leases.held_units() >= hold:
                    return
                status = (await client.get("/")).status_code
                if status == 200:
                    counts["allowed"] += 1
                elif status == 429:
                    counts["denied"] += 1
                    return
                else:
                    raise SystemExit(f"unexpected status {status}")

        await asyncio.gather(*(one_client() for _ in range(tasks)))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("start")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--hold", type=int, default=0, help="stop holding this many units")
    args = parser.parse_args()
    meter = Meter(args.url, clock=FrozenClock(datetime.fromisoformat(args.start)))
    print("ready", flush=True)
    sys.stdin.readline()
    counts = asyncio.run(hammer(meter, args.tasks, args.hold))
    if args.hold:
        print(json.dumps({"allowed": counts["allowed"], "holding": meter.leases.held_units()}))
        sys.stdout.flush()
        sys.stdin.readline()  # killed here
        raise SystemExit("the test was to kill this process")
    print(json.dumps(counts), flush=True)
    meter.close()  # settles every lease
    print("settled", flush=True)


if __name__ == "__main__":
    main()
