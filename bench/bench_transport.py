"""The worker's Redis channel against kombu's own, consuming the same messages.

`workers.guard.GuardedChannel` pops with a Lua script that holds the message
in the unacked hash in the same step (so a worker killed with a reply unread
loses nothing); kombu's channel pops with BRPOP and records it afterwards.
Both consume N batch-sized messages (100 events of 150 characters) with
acknowledgement, prefetch 10, in turn for several rounds; the table gives
the median rate, p50/p99 of the time per message, and the ratio.

    .venv/bin/python bench/bench_transport.py --messages 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import median, print_table
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.transport import redis as kombu_redis
from servers import RedisServer

from workers.guard import GuardedRedisTransport

EXCHANGE = Exchange("bench", type="direct")
QUEUE = Queue("bench", EXCHANGE, routing_key="bench")
BODY = {"events": ["x" * 150] * 100}


def consume(url: str, transport: type[kombu_redis.Transport], count: int) -> list[float]:
    """Seconds between consecutive deliveries of ``count`` queued messages."""
    with Connection(url) as connection:
        producer = Producer(connection)
        for _ in range(count):
            producer.publish(BODY, exchange=EXCHANGE, routing_key="bench", declare=[QUEUE])
    stamps: list[float] = []

    def on_message(body: Any, message: Any) -> None:
        message.ack()
        stamps.append(time.perf_counter())

    with Connection(url, transport=transport) as connection:
        channel = connection.default_channel
        with Consumer(channel, [QUEUE], callbacks=[on_message], prefetch_count=10):
            stamps.append(time.perf_counter())
            while len(stamps) <= count:
                connection.drain_events(timeout=10)
    return [b - a for a, b in itertools.pairwise(stamps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cases = {
        "kombu's channel (BRPOP)": kombu_redis.Transport,
        "GuardedChannel": GuardedRedisTransport,
    }
    rates: dict[str, list[float]] = {name: [] for name in cases}
    gaps: dict[str, list[float]] = {name: [] for name in cases}
    with RedisServer(Path(tempfile.mkdtemp(prefix="bench-transport-"))) as server:
        for _ in range(args.rounds):
            for name, transport in cases.items():
                server.flushall()
                taken = consume(server.url(0), transport, args.messages)
                rates[name].append(len(taken) / sum(taken))
                gaps[name].extend(taken)
    peer = median(rates["kombu's channel (BRPOP)"])
    rows = []
    for name in cases:
        cuts = statistics.quantiles(gaps[name], n=100)
        rows.append(
            [
                name,
                f"{median(rates[name]):,.0f}",
                f"{cuts[49] * 1000:.2f}",
                f"{cuts[98] * 1000:.2f}",
                f"{median(rates[name]) / peer:.2f}",
            ]
        )
    print_table(
        f"consuming {args.messages:,} batch-sized messages, median of {args.rounds} rounds",
        ["channel", "messages/s", "p50 ms", "p99 ms", "ratio"],
        rows,
    )


if __name__ == "__main__":
    main()
