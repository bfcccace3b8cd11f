"""metering: quota metering for consumption billing.

Decide, per usage event, whether it fits a subject's license or fair-use
limit, apply it exactly once, and record the decision.
"""

from typing import Any

from metering.clock import FrozenClock, system_clock
from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.events import Charge, UsageEvent, make_event
from metering.domain.limits import Limit
from metering.errors import MeteringError
from metering.meter import Counter, Meter
from metering.reservations import Reservation

__all__ = [
    "Charge",
    "ChargeDecision",
    "Counter",
    "Decision",
    "FrozenClock",
    "Limit",
    "Meter",
    "MeteringError",
    "Reservation",
    "UsageEvent",
    "UsageProducer",
    "emit",
    "make_event",
    "system_clock",
]


def __getattr__(name: str) -> Any:
    # The producer imports Celery; load it only for those who use it.
    if name in ("UsageProducer", "emit"):
        from metering import producer

        return getattr(producer, name)
    raise AttributeError(f"module 'metering' has no attribute {name!r}")
