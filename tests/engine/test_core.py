"""`Engine`'s own bookkeeping: the limits cache that ingest asks about
unknown limits (`Engine.unknown_limits`), the garbage collector paused
while a batch is decided (`collector_paused`), and the needs worked out
only when a path must be chosen by them."""

from __future__ import annotations

import gc
from typing import Any

from metering import Limit, Meter, make_event
from metering.domain.needs import UNHELD
from metering.engine.answers import Declined


def test_a_name_known_once_another_thread_reloaded_the_cache_is_not_unknown(
    sqlite_url: str,
) -> None:
    """Two requests miss the same cold cache at once; one reloads it while
    the other reads the limits' version. The second sees the version it read
    equal to the reloaded cache's and must answer from the reloaded limits,
    not from the empty ones it started with (a 422 for a defined limit)."""
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("api_calls", maximum=10, period="1h", window="calendar"))
        engine = meter._engine
        engine.limits.current = (-1, {}, engine.limits.current[2])  # a cold cache
        run = engine.database.run
        reloaded = []

        def other_thread_reloads_first(work: Any) -> Any:
            if not reloaded:  # the other request's reload lands before this read
                reloaded.append(True)
                run(engine.limits.refresh)
            return run(work)

        engine.database.run = other_thread_reloads_first  # type: ignore[method-assign]
        assert engine.unknown_limits(["api_calls", "api_cals"]) == ["api_cals"]


def test_the_collector_is_paused_only_while_a_batch_is_decided(sqlite_url: str) -> None:
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
        engine, seen = meter._engine, []
        decide = engine._first

        def watched(*args: Any) -> Any:
            seen.append(gc.isenabled())
            return decide(*args)

        engine._first = watched  # type: ignore[method-assign]
        meter.apply([make_event([("org", "calls", 1)], meter.clock()) for _ in range(2)])
        meter.consume("org", "calls")  # one event: too little to be worth it
        assert seen == [False, True] and gc.isenabled()
        gc.disable()
        try:
            meter.apply([make_event([("org", "calls", 1)], meter.clock()) for _ in range(2)])
            assert not gc.isenabled()  # left off, as it was
        finally:
            gc.enable()


def test_a_plain_batch_goes_to_the_first_path_without_its_needs_worked_out(
    sqlite_url: str,
) -> None:
    """The first path (`Direct` on a SQLite file) implements `UNHELD`: a
    batch with no hold, import nor dead letters is given to it without
    `Engine.needs`; once it declines, the needs choose the next path."""
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
        engine, asked = meter._engine, []
        assert engine.paths[0].implements >= UNHELD
        needs = engine.needs

        def counted(batch: Any) -> Any:
            asked.append(batch)
            return needs(batch)

        engine.needs = counted  # type: ignore[method-assign]
        assert meter.consume("org", "calls").allowed
        assert asked == []
        first = engine.paths[0]
        apply = first.apply
        first.apply = lambda batch: Declined("declined", None)  # type: ignore[method-assign]
        try:
            assert meter.consume("org", "calls").allowed  # by the next path
        finally:
            first.apply = apply  # type: ignore[method-assign]
        assert len(asked) == 1
        assert meter.consume("org", "calls").remaining == 7
