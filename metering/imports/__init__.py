"""Importing history (`metering import`, ``POST /v1/imports``, `Meter.import_events`)."""

from __future__ import annotations

from metering.imports.service import ImportSummary, import_events

__all__ = ["ImportSummary", "import_events"]
