"""`Offload`: a few threads of their own for calls that wait on someone else.

Every route's blocking call (a database read) runs on the server's shared
worker threads (`starlette.concurrency.run_in_threadpool`, 40 by default). A
call that waits on a remote party, a webhook test ping waiting for a slow
receiver, must not hold those: 45 pings would leave no thread for a reader.
`Offload` runs such calls on at most ``slots`` threads of its own and refuses
the ones beyond at once: a 429 problem with ``Retry-After`` (the caller's
worst wait for a slot), never a queue that grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from metering.api.problems import ApiProblem

T = TypeVar("T")


class Offload:
    """Run blocking calls on ``slots`` threads of their own; refuse more (429)."""

    def __init__(self, slots: int, *, what: str, retry_after_seconds: float) -> None:
        self.slots = slots
        self.what = what
        self.retry_after = max(1, math.ceil(retry_after_seconds))
        self._busy = 0
        self._executor = ThreadPoolExecutor(slots, thread_name_prefix=f"metering-{what}")

    @property
    def busy(self) -> int:
        """Calls running now (a slot is freed when its call ends, not when its
        request does: a client that leaves does not make room early)."""
        return self._busy

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on a thread of this offload; 429 when every slot is taken."""
        if self._busy >= self.slots:
            plural = "" if self.retry_after == 1 else "s"
            raise ApiProblem(
                "rate-limited",
                f"{self.slots} {self.what}s are running already: retry after "
                f"{self.retry_after} second{plural}",
                headers={"Retry-After": str(self.retry_after)},
            )
        loop = asyncio.get_running_loop()
        self._busy += 1
        try:
            future: Future[T] = self._executor.submit(function, *args)
        except BaseException:
            self._busy -= 1
            raise
        future.add_done_callback(lambda _done: self._free_soon(loop))
        return await asyncio.wrap_future(future)

    def _free_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        # On the call's thread: the count belongs to the event loop's thread.
        with contextlib.suppress(RuntimeError):  # a closed loop: the server stopped
            loop.call_soon_threadsafe(self._free)

    def _free(self) -> None:
        self._busy -= 1

    def close(self) -> None:
        """Stop taking calls; running ones finish on their own threads."""
        self._executor.shutdown(wait=False, cancel_futures=True)
