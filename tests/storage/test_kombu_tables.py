"""The embedded broker's tables are declared once, as kombu creates them.

kombu's SQLAlchemy transport creates ``kombu_queue`` and ``kombu_message`` on
a real SQLite file as it first sends; `metering.storage.kombu_tables` created
on another file must reflect the same (columns, types, nullability, keys,
indexes), and the sweep and the queue report read those very tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kombu import Connection
from sqlalchemy import create_engine, inspect

from metering.storage import broker, kombu_tables, queue_state


def reflected(url: str) -> dict[str, Any]:
    engine = create_engine(url)
    try:
        found = inspect(engine)
        shape: dict[str, Any] = {}
        for table in ("kombu_queue", "kombu_message"):
            shape[table] = {
                "columns": [
                    (c["name"], str(c["type"]), c["nullable"], c["primary_key"])
                    for c in found.get_columns(table)
                ],
                "pk": found.get_pk_constraint(table)["constrained_columns"],
                "fks": sorted(
                    (fk["name"], tuple(fk["constrained_columns"]), fk["referred_table"])
                    for fk in found.get_foreign_keys(table)
                ),
                "indexes": sorted(
                    (ix["name"], tuple(ix["column_names"]), bool(ix["unique"]))
                    for ix in found.get_indexes(table)
                ),
                "unique": sorted(
                    tuple(u["column_names"]) for u in found.get_unique_constraints(table)
                ),
            }
        return shape
    finally:
        engine.dispose()


def test_declared_tables_match_what_kombu_creates(tmp_path: Path) -> None:
    by_kombu = tmp_path / "kombu.sqlite"
    with Connection(f"sqla+sqlite:///{by_kombu}") as connection:
        connection.SimpleQueue("metering").put({"hello": 1})
    ours = tmp_path / "ours.sqlite"
    engine = create_engine(f"sqlite:///{ours}")
    kombu_tables.metadata.create_all(engine)
    engine.dispose()

    assert reflected(f"sqlite:///{ours}") == reflected(f"sqlite:///{by_kombu}")


def test_sweep_and_queue_report_share_one_declaration() -> None:
    tables = {id(t) for t in kombu_tables.metadata.tables.values()}
    users = [v for m in (broker, queue_state) for v in vars(m).values()]
    declared = [v for v in users if getattr(v, "name", None) in {"kombu_queue", "kombu_message"}]
    assert declared
    assert all(id(t) in tables for t in declared)
