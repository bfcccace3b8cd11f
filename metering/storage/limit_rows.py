"""Limit rows as `Limit`s and back, and the limits of a SQLite file read
without the database stack.

`limit_from_row` reads a row of the limits table, from SQLAlchemy or from a
bare driver; `limit_row` is the row a `Limit` is written as: a field's
column is mapped here, both ways. `bare_limits` lists a SQLite file's limits through stdlib
`sqlite3`, read-only, when the file exists at `SCHEMA_REVISION`; else None,
and the caller opens a `Meter` (which migrates, or says what is wrong).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

from metering.domain.limits import Limit
from metering.domain.pacing import parse_burst
from metering.storage.schema_revision import SCHEMA_REVISION

_SQLITE_PREFIXES: Final = ("sqlite:///", "sqlite+pysqlite:///")


def limit_from_row(row: Any) -> Limit:
    """The `Limit` a row of the limits table holds (columns as attributes)."""
    return Limit(
        name=row.name,
        maximum=row.maximum,
        period=row.period,
        algorithm=row.algorithm,
        # A bucket stored with window "calendar" before `Limit` refused it
        # (it never used it): read it as the bucket it is, not as an error.
        window=row.window if row.algorithm == "fixed_window" else "first_use",
        enforcement=row.enforcement,
        thresholds=tuple(json.loads(row.thresholds)),
        lateness=row.lateness,
        dimensions=tuple(json.loads(row.dimensions)),
        thresholds_units=tuple(json.loads(row.thresholds_units)),
        currency=row.currency,
        distinct=row.distinct_key,
        aggregation=row.aggregation,
        pacing=row.pacing_burst is not None,
        burst=None if row.pacing_burst is None else parse_burst(row.pacing_burst, row.maximum),
        forecast_lead=row.forecast_lead,
        breaker=row.breaker,
        breaker_floor=row.breaker_floor,
        quarantine_max=row.quarantine_max,
    )


def limit_row(limit: Limit, now_us: int) -> dict[str, Any]:
    """The columns of ``limit``'s row in the limits table, `limit_from_row`'s inverse."""
    values = limit.to_dict()
    values["thresholds"] = json.dumps(values["thresholds"])
    values["dimensions"] = json.dumps(values["dimensions"])
    values["thresholds_units"] = json.dumps(values["thresholds_units"])
    values.pop("max_amount", None)  # the maximum holds it, in minor units
    values["currency"] = limit.currency  # None turns a spend limit back into units
    values["distinct_key"] = values.pop("distinct")
    values.pop("pacing", None)
    values.pop("burst", None)
    values["pacing_burst"] = str(limit.burst) if limit.pacing else None
    values["forecast_lead"] = limit.forecast_lead
    values["breaker"] = limit.breaker
    values["breaker_floor"] = limit.breaker_floor
    values["quarantine_max"] = limit.quarantine_max
    values["updated_at_us"] = now_us
    return values


def bare_sqlite_path(url: str) -> Path | None:
    """The file of a plain SQLite URL (no options, not in memory), else None:
    `metering.storage.health.sqlite_file` reads any SQLite URL, through SQLAlchemy."""
    for prefix in _SQLITE_PREFIXES:
        if url.startswith(prefix):
            name = url[len(prefix) :]
            if not name or name == ":memory:" or name.startswith("file:") or "?" in name:
                return None
            if "%" in name:  # percent-escapes: left to SQLAlchemy's reading of the URL
                return None
            return Path(name)
    return None


def bare_limits(url: str) -> list[Limit] | None:
    """Every limit of the SQLite file at ``url``, by name, read with stdlib
    `sqlite3`; None when this read cannot answer (not a plain SQLite file,
    missing, at another schema revision, or unreadable)."""
    path = bare_sqlite_path(url)
    if path is None or not path.is_file():
        return None
    try:
        raw = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        [(revision,)] = raw.execute("SELECT version_num FROM alembic_version").fetchall()
        if revision != SCHEMA_REVISION:
            return None
        cursor = raw.execute("SELECT * FROM limits ORDER BY name")
        columns = [column[0] for column in cursor.description]
        return [
            limit_from_row(SimpleNamespace(**dict(zip(columns, row, strict=True))))
            for row in cursor
        ]
    except (sqlite3.Error, ValueError):
        return None
    finally:
        raw.close()
