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
Charts are in `metering.reports.charts` (imports matplotlib when used).
`write_csv` writes rows as CSV with formula-like text cells neutralised;
`csv_lines` yields the same text line by line, for streaming.
"""

from metering.reports.dimensions import (
    DimensionReport,
    DimensionRow,
    usage_by_dimension,
    usage_by_dimension_report,
)
from metering.reports.export import DIMENSION_SHAPE, csv_lines, write_csv
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

__all__ = [
    "COLUMNS",
    "DIMENSION_SHAPE",
    "DimensionReport",
    "DimensionRow",
    "Report",
    "ReportRange",
    "ReportRow",
    "csv_lines",
    "overage_report",
    "select_overage",
    "select_usage",
    "usage_by_dimension",
    "usage_by_dimension_report",
    "usage_report",
    "write_csv",
]
