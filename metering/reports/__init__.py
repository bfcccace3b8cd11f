"""Billing reports from the counters: overage per window, a subject's usage over time.

>>> from metering import Meter
>>> from metering.reports import overage_report, usage_report
>>> meter = Meter()
>>> for row in overage_report(meter, period="2026-11", top=10):
...     print(row.subject, row.limit, row.overage, row.utilisation_percent)
>>> usage_report(meter, "org-42", since="2026-09-01")

`usage_by_dimension` groups a subject's usage by a metadata key that its
limits record (``Limit(..., dimensions=("route",))``), from hourly rollups.

`select_overage` and `select_usage` validate the filters and return a
`Report` whose ``rows()`` streams from the database (for large exports).
`select_shadow` and `shadow_report` (`metering.reports.shadow`) tell whom a
shadow limit would have denied, had it been hard. Charts are in
`metering.reports.charts` (imports matplotlib when used). `write_csv`
writes rows as CSV with formula-like text cells neutralised; `csv_lines`
yields the same text line by line, for streaming. `write_json` and
`json_lines` write a report as one JSON object (``{"report": ..., "rows":
[...]}``), the shape of the CLI's and the HTTP API's JSON alike.
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
