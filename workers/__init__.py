"""The Celery app and its tasks: ``celery -A workers worker``."""

from workers.app import app

__all__ = ["app"]
