"""The Alembic revision this code expects (a test checks it is the head),
kept apart from the database stack so a bare read can check it too."""

from __future__ import annotations

from typing import Final

SCHEMA_REVISION: Final = "0051"
