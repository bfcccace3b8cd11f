"""A Redis broker's messages delivered again, counted in Redis.

kombu's Redis transport marks a message it puts back on its queue ``redelivered``:
its worker rejected it to have it delivered again (the pool process running it
died: Celery's ``reject_on_worker_lost``), or it stayed unacknowledged past the
visibility timeout. `count_redelivery` counts one such delivery of a task's message
under `REDELIVERIES_KEY` and the task id, a key that lapses `REDELIVERIES_TTL_SECONDS`
after its last count, and returns the deliveries before this one: none of them
finished. A first delivery is never counted. Redis errors are `BrokerUnavailable`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from metering.errors import BrokerUnavailable

if TYPE_CHECKING:
    import redis

REDELIVERIES_KEY: Final = "metering.redeliveries."
# Longer than any wait between two deliveries of one message (a visibility
# timeout and the queue ahead of it); renewed by each count.
REDELIVERIES_TTL_SECONDS: Final = 86_400


def count_redelivery(client: redis.Redis, task_id: str) -> int:
    """Count a delivery of ``task_id``'s message marked ``redelivered``; how many
    deliveries it had before this one (at least 1)."""
    import redis  # here: a process on the embedded broker never loads it

    key = f"{REDELIVERIES_KEY}{task_id}"
    try:
        with client.pipeline() as pipe:
            pipe.incr(key)
            pipe.expire(key, REDELIVERIES_TTL_SECONDS)
            counted, _ = pipe.execute()
    except (redis.RedisError, OSError) as exc:
        raise BrokerUnavailable(f"deliveries not counted: {exc}") from exc
    return int(counted)
