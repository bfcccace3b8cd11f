"""The `Settings` a worker's Celery app was created with (`workers.app.create_app`)."""

from __future__ import annotations

from typing import Any, cast

from metering.settings import Settings


def settings_of(app: Any) -> Settings:
    """The settings ``app`` (a Celery app made by `create_app`) was created with."""
    return cast(Settings, app.metering_settings)
