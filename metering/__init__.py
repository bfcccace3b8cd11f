"""metering: quota metering for consumption billing.

Decide, per usage event, whether it fits a subject's license or fair-use
limit, apply it exactly once, and record the decision.
"""

from typing import TYPE_CHECKING, Any

from metering.clock import FrozenClock, system_clock
from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.events import Charge, UsageEvent, make_event
from metering.domain.limits import Limit, spend_limit
from metering.errors import MeteringError

if TYPE_CHECKING:
    from metering.licenses import Checkout
    from metering.meter import Meter
    from metering.pipeline.producer import UsageProducer, emit
    from metering.reservations import Reservation
    from metering.usage.counters import Counter
    from metering.usage.results import Decisions

__all__ = [
    "Charge",
    "ChargeDecision",
    "Checkout",
    "Counter",
    "Decision",
    "Decisions",
    "FrozenClock",
    "Limit",
    "Meter",
    "MeteringError",
    "Reservation",
    "UsageEvent",
    "UsageProducer",
    "emit",
    "make_event",
    "spend_limit",
    "system_clock",
]


# Loaded on first use: the meter loads the database stack (SQLAlchemy,
# psycopg), the producer Celery, and an app that only emits events
# (`import metering.pipeline.producer`) needs neither the meter nor the database.
_LAZY = {
    "Checkout": "metering.licenses",
    "Counter": "metering.usage.counters",
    "Decisions": "metering.usage.results",
    "Meter": "metering.meter",
    "Reservation": "metering.reservations",
    "UsageProducer": "metering.pipeline.producer",
    "emit": "metering.pipeline.producer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'metering' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)
