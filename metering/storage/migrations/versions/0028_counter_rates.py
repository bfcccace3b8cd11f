"""Counter rates and forecasts.

* ``counters.rate`` and ``counters.rate_at_us``: a counter's recent rate in
  units per second, decayed with a time constant of one hour, as of an
  instant (`metering.domain.forecast`); every writer of counters moves it in
  the statement that writes ``used``. Existing rows start at 0.
* ``limits.forecast_lead``: how long before a forecast exhaustion a
  ``limit.forecast`` notice goes out (a duration, ``24h``; NULL: none).
* ``metering_consume_one``: migration 0012's function, its two counter
  writes moving the rate too.

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

# `metering.storage.rates.rate_set` as the function writes it, frozen here.
_UPDATE_RATE = """,
            rate = CASE
                WHEN p_now - rate_at_us > 180000000000 OR rate < 1e-100 THEN 0.0
                WHEN p_now <= rate_at_us THEN rate
                ELSE rate * exp(CAST(rate_at_us - p_now AS DOUBLE PRECISION) / 3600000000)
            END + CASE WHEN cused[i] > used
                THEN CAST(cused[i] - used AS DOUBLE PRECISION) / 3600 ELSE 0.0 END,
            rate_at_us = CASE WHEN p_now > rate_at_us THEN p_now ELSE rate_at_us END
        WHERE limit_name = names[i] AND subject = subjects[i] AND window_start_us"""
_INSERT_COLUMNS = "tat_scale,\n            updated_at_us, rate, rate_at_us)"
_INSERT_VALUES = (
    "tat[i], trem[i], tscale[i], p_now,"
    " CAST(GREATEST(cused[i], 0) AS DOUBLE PRECISION) / 3600, p_now);"
)


def _consume_one() -> str:
    path = Path(__file__).with_name("0012_consume_one.py")
    spec = importlib.util.spec_from_file_location("consume_one_0012", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.CONSUME_ONE)


def _with_rates(function: str) -> str:
    replaced = function
    for old, new in (
        (
            "\n        WHERE limit_name = names[i] AND subject = subjects[i] AND window_start_us",
            _UPDATE_RATE,
        ),
        ("tat_scale,\n            updated_at_us)", _INSERT_COLUMNS),
        ("tat[i], trem[i], tscale[i], p_now);", _INSERT_VALUES),
    ):
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    op.add_column("counters", sa.Column("rate", sa.Double, nullable=False, server_default="0"))
    op.add_column(
        "counters", sa.Column("rate_at_us", sa.BigInteger, nullable=False, server_default="0")
    )
    op.add_column("limits", sa.Column("forecast_lead", sa.String(32), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_with_rates(_consume_one()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_consume_one())
    with op.batch_alter_table("limits") as batch:
        batch.drop_column("forecast_lead")
    with op.batch_alter_table("counters") as batch:
        batch.drop_column("rate_at_us")
        batch.drop_column("rate")
