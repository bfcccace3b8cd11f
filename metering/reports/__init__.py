"""Billing reports from the counters and rollups (docs/reports.md, with examples).

`overage_report(meter, period=..., top=...)` gives overage per subject, limit and window,
`usage_report(meter, subject, since=...)` a subject's usage over time, `usage_by_dimension`
a subject's usage by a metadata key its limits record, from hourly rollups; `shadow_report`
whom a shadow limit would have denied (`metering.reports.shadow`). `select_overage`,
`select_usage` and `select_shadow` validate the filters and return a report whose ``rows()``
stream from the database. `write_csv` and `csv_lines` write CSV with formula-like cells
neutralised; `write_json` and `json_lines` one ``{"report": ..., "rows": [...]}`` object,
as the CLI and HTTP API give it. Charts: `metering.reports.charts` (imports matplotlib).
"""

from metering.reports.dimensions import (
    DimensionReport,
    DimensionRow,
    usage_by_dimension,
    usage_by_dimension_report,
)
from metering.reports.export import csv_lines, json_lines, write_csv, write_json
from metering.reports.overage import (
    COLUMNS,
    Report,
    ReportRange,
    ReportRow,
    overage_report,
    select_overage,
    select_usage,
    usage_report,
)
from metering.reports.shadow import SHADOW_COLUMNS, ShadowRow, select_shadow, shadow_report

__all__ = [
    "COLUMNS",
    "SHADOW_COLUMNS",
    "DimensionReport",
    "DimensionRow",
    "Report",
    "ReportRange",
    "ReportRow",
    "ShadowRow",
    "csv_lines",
    "json_lines",
    "overage_report",
    "select_overage",
    "select_shadow",
    "select_usage",
    "shadow_report",
    "usage_by_dimension",
    "usage_by_dimension_report",
    "usage_report",
    "write_csv",
    "write_json",
]
