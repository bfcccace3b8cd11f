"""Group commit: concurrent `consume` calls in one process share a transaction.

A web server's threads (or an event loop's tasks) each call
`Meter.consume`. Instead of one transaction each, the calls queue here. The
first caller to find nobody applying becomes the *leader*: it takes every
call waiting (up to ``max_batch``), applies them as one batch in arrival
order, hands each caller its own answer, and passes leadership to the next
call waiting. A batch of sixteen costs about what one call costs, so
throughput grows with the number of callers while each caller still gets
the exact decision it would have got alone, in the order the calls arrived.

A lone caller leads at once, in its own thread: no handoff, no extra
thread. An asyncio caller (`Meter.aconsume`) never blocks its event loop:
it awaits a future, and when it has to lead, the batch runs on this
group's single worker thread.

When a batch fails, no caller gets another caller's error:

- an unacceptable event (unknown limit, too late) is answered with its own
  error, taken out, and the rest applied again;
- any other failure (a statement the database refuses) reruns each call
  alone, so only the call that caused it fails;
- an unreachable database fails every call of the batch at once (it is
  nobody's event, and rerunning them one by one would only wait longer).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from metering.domain.events import EventRecord
from metering.engine.answers import Answer, Unacceptable
from metering.errors import DatabaseUnavailable

MAX_BATCH: Final = 128

ApplyBatch = Callable[[Sequence[EventRecord]], list[Answer]]


class _Call:
    """One waiting call: its event, and how to wake it."""

    __slots__ = ("answer", "done", "error", "future", "lead", "loop", "record", "settled")

    def __init__(
        self,
        record: EventRecord,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.record = record
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self.done = False
        # Answered, or asked to lead: made (by `GroupCommit._join`) only for
        # a call that waits; a lone caller leads at once and needs none.
        self.settled: threading.Event | None = None
        self.lead = False
        self.loop = loop
        self.future: asyncio.Future[Answer] | None = loop.create_future() if loop else None

    def finish(self, answer: Answer | None, error: BaseException | None) -> None:
        self.answer, self.error, self.done = answer, error, True
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._resolve)
        if self.settled is not None:
            self.settled.set()

    def _resolve(self) -> None:
        future = self.future
        if future is None or future.done():  # the awaiting task was cancelled
            return
        if self.error is not None:
            future.set_exception(self.error)
        else:
            assert self.answer is not None
            future.set_result(self.answer)

    def outcome(self) -> Answer:
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


class GroupCommit:
    """Queues calls and applies them in shared transactions (see the module)."""

    def __init__(self, apply: ApplyBatch, *, max_batch: int = MAX_BATCH) -> None:
        self._apply = apply
        self.max_batch = max_batch
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._waiting: deque[_Call] = deque()
        self._leading = False
        self._executor: ThreadPoolExecutor | None = None

    def _join(self, call: _Call) -> bool:
        """Queue ``call``; True when its caller must lead (nobody is applying)."""
        if self._pid != os.getpid():  # a forked child starts with an empty group
            self._reset()
        with self._lock:
            if self._leading:
                if call.loop is None:  # before it can be answered: it will wait
                    call.settled = threading.Event()
                self._waiting.append(call)
                return False
            self._waiting.append(call)
            self._leading = True
            return True

    def submit(self, record: EventRecord) -> Answer:
        """Apply one event in the next shared transaction; its answer, or its error."""
        call = _Call(record)
        if not self._join(call):
            assert call.settled is not None
            call.settled.wait()
            if not call.lead:
                return call.outcome()
        # Leading: this call is first in the queue, so in the batch applied now.
        self._lead()
        return call.outcome()

    async def submit_async(self, record: EventRecord) -> Answer:
        """`submit` for asyncio: the event loop is never blocked."""
        call = _Call(record, asyncio.get_running_loop())
        if self._join(call):
            self._spawn_leader()
        assert call.future is not None
        return await call.future

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # -- leading --------------------------------------------------------------

    def _spawn_leader(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="metering-group")
        self._executor.submit(self._lead)

    def _lead(self) -> None:
        with self._lock:
            count = min(len(self._waiting), self.max_batch)
            batch = [self._waiting.popleft() for _ in range(count)]
        try:
            self._settle(batch)
        except BaseException as exc:  # interrupted: nobody may wait forever
            for call in batch:
                if not call.done:
                    call.finish(None, exc)
            raise
        finally:
            self._hand_over()

    def _hand_over(self) -> None:
        with self._lock:
            if not self._waiting:
                self._leading = False
                return
            following = self._waiting[0]
        if following.loop is not None:
            self._spawn_leader()
        else:
            following.lead = True
            assert following.settled is not None  # it waits (`_join`)
            following.settled.set()

    def _settle(self, batch: list[_Call]) -> None:
        live = list(batch)
        while live:
            try:
                answers = self._apply([call.record for call in live])
            except Unacceptable as exc:
                live.pop(exc.index).finish(None, exc.error)
                continue
            except DatabaseUnavailable as exc:
                for call in live:
                    call.finish(None, exc)
                return
            except Exception as exc:
                if len(live) == 1:
                    live[0].finish(None, exc)
                    return
                for call in live:  # alone, so only the call that caused it fails
                    self._settle([call])
                return
            for call, answer in zip(live, answers, strict=True):
                call.finish(answer, None)
            return
