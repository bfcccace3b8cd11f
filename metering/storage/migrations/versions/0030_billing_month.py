"""Windows' billing months.

* ``counters.billing_month``: the month (``2026-11``) a window bills in, the
  local month of its start in the subject's zone then
  (`metering.domain.zones.billing_month`); reports select a ``--period`` by
  it. Every writer of counters writes it when it makes the row; existing
  rows are filled from their start in the subject's zone (UTC without one);
  token buckets (no window) keep NULL.
* ``metering_consume_one``: migration 0028's function, writing the UTC month
  (it decides no subject with a time zone).

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

_INSERT_COLUMNS = (
    "updated_at_us, rate, rate_at_us)",
    "updated_at_us, rate, rate_at_us,\n            billing_month)",
)
_INSERT_VALUES = (
    "CAST(GREATEST(cused[i], 0) AS DOUBLE PRECISION) / 3600, p_now);",
    "CAST(GREATEST(cused[i], 0) AS DOUBLE PRECISION) / 3600, p_now,\n"
    "            CASE WHEN wes[i] = 0 THEN NULL\n"
    "                 ELSE to_char(to_timestamp(wss[i] / 1000000) AT TIME ZONE 'UTC', 'YYYY-MM')"
    " END);",
)
# The UTC month of a row's window start, per dialect (whole seconds suffice).
_UTC_MONTH = {
    "postgresql": "to_char(to_timestamp(window_start_us / 1000000) AT TIME ZONE 'UTC', 'YYYY-MM')",
    "sqlite": "strftime('%Y-%m', window_start_us / 1000000, 'unixepoch')",
}


def _consume_one_0028() -> str:
    path = Path(__file__).with_name("0028_counter_rates.py")
    spec = importlib.util.spec_from_file_location("counter_rates_0028", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module._with_rates(module._consume_one()))


def _with_month(function: str) -> str:
    replaced = function
    for old, new in (_INSERT_COLUMNS, _INSERT_VALUES):
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def _local_month(changes: list[tuple[int, str]], start_us: int) -> str:
    """The month of ``start_us`` in the zone of the last change before it (UTC before any)."""
    zone = "UTC"
    for since_us, name in changes:
        if since_us >= start_us:
            break
        zone = name
    start = datetime.fromtimestamp(start_us // 1_000_000, UTC)
    return f"{start.astimezone(ZoneInfo(zone)):%Y-%m}"


def upgrade() -> None:
    bind = op.get_bind()
    op.add_column("counters", sa.Column("billing_month", sa.String(7), nullable=True))
    op.execute(
        f"UPDATE counters SET billing_month = {_UTC_MONTH[bind.dialect.name]}"
        " WHERE window_end_us <> 0"
    )
    zones: dict[str, list[tuple[int, str]]] = {}
    query = "SELECT subject, since_us, time_zone FROM subject_time_zones ORDER BY subject, since_us"
    for subject, since_us, zone in bind.execute(sa.text(query)):
        zones.setdefault(subject, []).append((since_us, zone))
    rows = sa.text(
        "SELECT limit_name, window_start_us FROM counters"
        " WHERE subject = :subject AND window_end_us <> 0"
    )
    update = sa.text(
        "UPDATE counters SET billing_month = :month"
        " WHERE subject = :subject AND limit_name = :limit AND window_start_us = :start"
    )
    for subject, changes in zones.items():
        found = bind.execute(rows, {"subject": subject}).all()
        params = [
            {"month": _local_month(changes, start), "subject": subject, "limit": name}
            | {"start": start}
            for name, start in found
        ]
        if params:
            bind.execute(update, params)
    if bind.dialect.name == "postgresql":
        op.execute(_with_month(_consume_one_0028()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_consume_one_0028())
    with op.batch_alter_table("counters") as batch:
        batch.drop_column("billing_month")
