"""Webhook settings (every one optional), read in `metering.settings`, the one
reader of the environment; here under the names the webhooks package uses."""

from __future__ import annotations

from metering.settings import DEFAULT_INTERVAL_SECONDS as DEFAULT_INTERVAL_SECONDS
from metering.settings import DEFAULT_POLL_SECONDS as DEFAULT_POLL_SECONDS
from metering.settings import DEFAULT_SCHEDULE as DEFAULT_SCHEDULE
from metering.settings import SECRET_KEY_VARIABLE as SECRET_KEY_VARIABLE
from metering.settings import DeliverySettings as DeliverySettings
from metering.settings import dispatching as dispatching
from metering.settings import parse_schedule as parse_schedule
from metering.settings import poll_seconds as poll_seconds
from metering.settings import rotation_grace_seconds as rotation_grace_seconds
from metering.settings import secret_keys as secret_keys
