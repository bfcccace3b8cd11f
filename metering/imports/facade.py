"""`Meter`'s method for importing history, handed to `metering.imports.service`
(a part of the facade, kept beside its feature)."""

from __future__ import annotations

from metering.domain.imports import ImportFormat
from metering.engine import Engine
from metering.imports import service
from metering.imports.service import BATCH_SIZE, ImportSummary, Source


class ImportsFacade:
    """Imports of a `metering.Meter`."""

    _engine: Engine

    def import_events(
        self,
        source: Source,
        *,
        fmt: ImportFormat | None = None,
        enforce: bool = True,
        allow_late: bool = False,
        strict: bool = False,
        batch_size: int = BATCH_SIZE,
        progress: service.Progress | None = None,
    ) -> ImportSummary:
        """Apply a JSON Lines or CSV file of events through the batch path, exactly once
        by id (``enforce=False``: history, never denied; ``allow_late``: no lateness)."""
        return service.import_events(
            self._engine,
            source,
            fmt=fmt,
            enforce=enforce,
            allow_late=allow_late,
            strict=strict,
            batch_size=batch_size,
            progress=progress,
        )
