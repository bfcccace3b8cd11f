"""Webhooks: tell the customer's systems when a subject is denied, crosses a
threshold, exceeds a soft limit, or has a fresh window again.

Receivers use `verify`; senders (and tests) `sign`. `Webhooks` manages
endpoints and deliveries over a `metering.Meter`.
"""

from metering.domain.notifications import MESSAGE_TYPES
from metering.errors import WebhookVerificationError
from metering.settings import DeliverySettings
from metering.webhooks.delivery import DeliveryReport, deliver_due, sweep_resets
from metering.webhooks.endpoints import Endpoint, Webhooks
from metering.webhooks.signing import generate_secret, sign, verify

__all__ = [
    "MESSAGE_TYPES",
    "DeliveryReport",
    "DeliverySettings",
    "Endpoint",
    "WebhookVerificationError",
    "Webhooks",
    "deliver_due",
    "generate_secret",
    "sign",
    "sweep_resets",
    "verify",
]
