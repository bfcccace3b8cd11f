"""A statement is compiled once a process for all engines whose dialects are
alike (every `Meter` on SQLite; on one PostgreSQL server), and never handed
to an engine whose dialect compiles it otherwise."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from sqlalchemy import Engine, event, literal, select
from sqlalchemy.engine.default import DefaultDialect

from metering.storage.connections import make_engine

HIT, MISS = DefaultDialect.CACHE_HIT, DefaultDialect.CACHE_MISS


def _hits(engine: Engine, statement: Any) -> list[Any]:
    """What SQLAlchemy's cache said of each statement ``engine`` ran for ``statement``."""
    said: list[Any] = []
    label = statement.selected_columns[0].name

    @event.listens_for(engine, "after_cursor_execute")
    def _said(_conn: Any, _cursor: Any, sql: str, _params: Any, context: Any, _many: Any) -> None:
        if label in sql:  # (not SQLite's BEGIN)
            said.append(context.cache_hit)

    with engine.connect() as connection:
        assert connection.execute(statement).scalar_one() == 7
    engine.dispose()
    return said


def test_a_second_engine_runs_the_first_ones_compiled_statement(db_url: str) -> None:
    statement = select(literal(7).label(f"once_{uuid4().hex}"))  # never compiled before
    first, second = make_engine(db_url), make_engine(db_url)
    assert _hits(first, statement) == [MISS]
    assert _hits(second, statement) == [HIT]


def test_a_dialect_set_otherwise_compiles_its_own(sqlite_url: str) -> None:
    statement = select(literal(7).label(f"own_{uuid4().hex}"))
    assert _hits(make_engine(sqlite_url), statement) == [MISS]
    named = make_engine(sqlite_url, paramstyle="named")  # another paramstyle: other SQL
    assert _hits(named, statement) == [MISS]
    again = make_engine(sqlite_url, paramstyle="named")
    assert _hits(again, statement) == [HIT]
