"""Beat, in a real worker, commits reservations nobody settled."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from metering import Limit, Meter


def test_a_worker_with_beat_commits_reservations_past_their_time_to_live(
    pg_url: str, start_worker: Callable[..., Any]
) -> None:
    with Meter(pg_url) as meter:
        meter.set_limit(Limit("bad_login", maximum=30, period="1h"))
        forgotten = meter.reserve("10.0.0.7", "bad_login", ttl_seconds=1)
        settled = meter.reserve("10.0.0.7", "bad_login", ttl_seconds=1)
        settled.cancel()
        worker = start_worker(beat=True, METERING_RESERVATION_SWEEP_INTERVAL="0.5")
        deadline = time.monotonic() + 60
        info = meter.reservation(forgotten.id)
        while info is not None and info.state == "held" and time.monotonic() < deadline:
            time.sleep(0.2)
            info = meter.reservation(forgotten.id)
        assert info is not None and info.state == "committed", worker.tail()
        assert info.settled_by == "sweeper"
        cancelled = meter.reservation(settled.id)
        assert cancelled is not None and cancelled.state == "cancelled"
        assert [c.used for c in meter.counters("10.0.0.7", "bad_login")] == [1]
