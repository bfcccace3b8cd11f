"""Migrations, schema checks and unreachable databases."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from servers import PostgresServer
from sqlalchemy import Engine, text

from metering import FrozenClock, Limit, Meter
from metering.errors import DatabaseUnavailable, SchemaOutdated
from metering.storage.audit import AuditStore
from metering.storage.connections import MIGRATIONS_DIR, current_revision, make_engine
from metering.storage.schema_revision import SCHEMA_REVISION
from metering.storage.tables import metadata
from metering.upkeep.audit import run_audit

T = TypeVar("T")


def test_schema_revision_is_the_migrations_head() -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert ScriptDirectory.from_config(config).get_current_head() == SCHEMA_REVISION


def test_migrations_produce_the_declared_schema(db_url: str) -> None:
    Meter(db_url).close()  # SQLite migrates on first use; PostgreSQL was migrated
    engine = make_engine(db_url)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), metadata)
    engine.dispose()
    assert differences == []


def test_tables_updated_in_place_keep_room_for_hot_updates(pg_url: str) -> None:
    # Declared (`postgresql_with`) and migrated alike: compare_metadata does not compare it.
    declared = {
        table.name: table.kwargs["postgresql_with"]["fillfactor"]
        for table in metadata.sorted_tables
        if table.kwargs.get("postgresql_with")
    }
    with psycopg.connect(pg_url.replace("+psycopg", "")) as connection:
        found = dict(
            connection.execute(
                "SELECT relname, split_part(option, '=', 2)::int FROM pg_class, "
                "unnest(reloptions) AS option WHERE option LIKE 'fillfactor=%'"
            ).fetchall()
        )
    assert found == declared
    updated = ("grants", "breakers", "usage_rollups", "distinct_values")
    assert {name: found[name] for name in updated} == dict.fromkeys(updated, 50)


def test_the_rollups_key_leaves_the_figures_out_so_their_updates_are_hot(pg_url: str) -> None:
    with psycopg.connect(pg_url.replace("+psycopg", "")) as connection:
        (definition,) = connection.execute(
            "SELECT pg_get_indexdef('usage_rollups_pkey'::regclass)"
        ).fetchone()
    assert "INCLUDE" not in definition


def test_postgresql_without_schema_asks_for_an_upgrade(postgres_server: PostgresServer) -> None:
    postgres_server.create_database("empty_db")
    try:
        with pytest.raises(SchemaOutdated, match="metering db upgrade"):
            Meter(postgres_server.url("empty_db"))
    finally:
        postgres_server.drop_database("empty_db")


def test_an_older_schema_is_refused_on_postgresql_and_upgraded_on_sqlite(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    older = f"{int(SCHEMA_REVISION) - 1:04d}"
    postgres_server.create_database("older_db")
    try:
        _upgrade(postgres_server.url("older_db"), older)
        with pytest.raises(SchemaOutdated, match=f"schema revision {older}, this version"):
            Meter(postgres_server.url("older_db"))
        engine = make_engine(postgres_server.url("older_db"))
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM alembic_version"))
        engine.dispose()
        with pytest.raises(SchemaOutdated, match="has no schema"):
            Meter(postgres_server.url("older_db"))
    finally:
        postgres_server.drop_database("older_db")
    sqlite_url = f"sqlite:///{tmp_path / 'older.db'}"
    _upgrade(sqlite_url, older)
    Meter(sqlite_url).close()
    engine = make_engine(sqlite_url)
    assert current_revision(engine) == SCHEMA_REVISION
    engine.dispose()


def test_a_meter_starts_on_postgresql_without_catalog_look_ups(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither the dialect's HSTORE type nor the ``alembic_version`` table is
    looked up in the catalog: each would cost every new engine a statement."""
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def recorded(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recorded)
    Meter(pg_url).close()
    assert any("alembic_version" in statement for statement in sent)
    assert [
        statement for statement in sent if "pg_type" in statement or "pg_class" in statement
    ] == []


def test_unreachable_databases_raise_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatabaseUnavailable):
        Meter("postgresql://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    with pytest.raises(DatabaseUnavailable):
        Meter(f"sqlite:///{tmp_path}/missing-dir/metering.db")


def _upgrade(url: str, revision: str) -> None:
    engine = make_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()


def _downgrade(engine: Engine, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def _on_both(tmp_path: Path, server: PostgresServer, across: Callable[[str], T]) -> list[T]:
    """What ``across`` finds on a SQLite file, then on a PostgreSQL database of its own."""
    found = [across(f"sqlite:///{tmp_path / 'old.db'}")]
    name = across.__name__.strip("_")
    server.create_database(name)
    try:
        found.append(across(server.url(name)))
    finally:
        server.drop_database(name)
    return found


def _billing_months_after_0030(url: str) -> dict[tuple[str, int], str | None]:
    """Counters written before migration 0030, with their billing months after it."""
    _upgrade(url, "0028")
    kolkata = 1_790_000_000_000_000  # 2026-09-21: windows after it start at Kolkata's midnight
    october_kolkata = 1_790_793_000_000_000  # 2026-09-30T18:30Z
    rows = [
        ("org-in", 1_788_220_800_000_000, 1_790_812_800_000_000),  # September in UTC
        ("org-in", october_kolkata, 1_793_471_400_000_000),
        ("org-utc", 1_793_491_200_000_000, 1_796_083_200_000_000),  # 2026-11-01 UTC
        ("org-utc", 0, 0),  # a token bucket
    ]
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO subject_time_zones VALUES ('org-in', :since, 'Asia/Kolkata')"),
            {"since": kolkata},
        )
        for subject, start, end in rows:
            connection.execute(
                text(
                    "INSERT INTO counters (limit_name, subject, window_start_us, window_end_us,"
                    " used, denied_count, denied_cost, tat_rem, tat_scale, updated_at_us)"
                    " VALUES ('calls', :subject, :start, :end, 1, 0, 0, 0, 1, 0)"
                ),
                {"subject": subject, "start": start, "end": end},
            )
    _upgrade(url, "head")
    with engine.connect() as connection:
        found = connection.execute(
            text("SELECT subject, window_start_us, billing_month FROM counters")
        )
        months = {(subject, start): month for subject, start, month in found}
    # And back: 0028's schema and function, then up again.
    _downgrade(engine, "0028")
    _upgrade(url, "head")
    engine.dispose()
    return months


def test_migration_0030_fills_billing_months_in_the_subjects_zone(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    expected = {
        ("org-in", 1_788_220_800_000_000): "2026-09",
        ("org-in", 1_790_793_000_000_000): "2026-10",  # 30 September 18:30 UTC
        ("org-utc", 1_793_491_200_000_000): "2026-11",
        ("org-utc", 0): None,
    }
    assert _on_both(tmp_path, postgres_server, _billing_months_after_0030) == [expected, expected]


def _draws_across_0038(url: str) -> tuple[dict[int, int], list[tuple[int, str, int]]]:
    """Draws written before migration 0038: each window's on its counter after
    it, and the rows ``grant_draws`` holds again after its downgrade."""
    _upgrade(url, "0037")
    engine = make_engine(url)
    with engine.begin() as connection:
        for start in (100, 200):
            connection.execute(
                text(
                    "INSERT INTO counters (limit_name, subject, window_start_us, window_end_us,"
                    " used, denied_count, denied_cost, tat_rem, tat_scale, updated_at_us)"
                    " VALUES ('calls', 'org', :start, :start + 100, 9, 0, 0, 0, 1, 0)"
                ),
                {"start": start},
            )
        for grant_id, used in (("big", 5), ("small", 2)):
            connection.execute(
                text(
                    "INSERT INTO grants (grant_id, subject, limit_name, amount, used,"
                    " effective_from_us, created_at_us) VALUES (:g, 'org', 'calls', 10, :u, 0, 0)"
                ),
                {"g": grant_id, "u": used},
            )
        for start, grant_id, amount in ((100, "big", 3), (100, "small", 2), (200, "big", 2)):
            connection.execute(
                text("INSERT INTO grant_draws VALUES ('org', 'calls', :start, :g, :amount)"),
                {"start": start, "g": grant_id, "amount": amount},
            )
    _upgrade(url, "head")
    with engine.connect() as connection:
        found = connection.execute(text("SELECT window_start_us, granted FROM counters"))
        granted = {int(start): int(amount) for start, amount in found}
    _downgrade(engine, "0037")
    with engine.connect() as connection:
        found = connection.execute(
            text("SELECT window_start_us, grant_id, amount FROM grant_draws ORDER BY 1")
        )
        back = [(int(start), grant_id, int(amount)) for start, grant_id, amount in found]
    _upgrade(url, "head")
    engine.dispose()
    return granted, back


def test_migration_0038_keeps_each_windows_draws_on_its_counter(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    # Back down, a window's draws are on the grant its pair drew most (their
    # split per grant is not kept).
    expected = ({100: 5, 200: 2}, [(100, "big", 5), (200, "big", 2)])
    assert _on_both(tmp_path, postgres_server, _draws_across_0038) == [expected, expected]


def _seats_across_0039(url: str) -> list[tuple[str, int]]:
    """Seat values counted before migration 0039: held ones at 1 after it."""
    _upgrade(url, "0038")
    engine = make_engine(url)
    with engine.begin() as connection:
        for value, live in (("ann", 3), ("bob", 1), ("cy", 0)):
            connection.execute(
                text("INSERT INTO distinct_values VALUES ('org', 'seats', 0, :v, :live)"),
                {"v": value, "live": live},
            )
    _upgrade(url, "head")
    with engine.connect() as connection:
        found = connection.execute(text("SELECT value, live_events FROM distinct_values"))
        rows = sorted((str(value), int(live)) for value, live in found)
    engine.dispose()
    return rows


def test_migration_0039_keeps_a_held_value_at_one(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    expected = [("ann", 1), ("bob", 1), ("cy", 0)]
    assert _on_both(tmp_path, postgres_server, _seats_across_0039) == [expected, expected]


def _rollups_across_0040(url: str) -> list[tuple[str, int, int]]:
    """Rollups and appended deltas: all in the rollups after 0040's downgrade."""
    _upgrade(url, "head")
    engine = make_engine(url)
    with engine.begin() as connection:
        insert = "INSERT INTO {} VALUES ('org', 'calls', 'route', 0, :v, :used, :events)"
        connection.execute(
            text(insert.format("usage_rollups")), {"v": "/a", "used": 4, "events": 2}
        )
        for value, used in (("/a", 1), ("/b", 3), ("/b", -1)):
            connection.execute(
                text(insert.format("usage_rollup_deltas")), {"v": value, "used": used, "events": 1}
            )
    _downgrade(engine, "0039")
    with engine.connect() as connection:
        found = connection.execute(text("SELECT value, used, events FROM usage_rollups"))
        rows = sorted((str(value), int(used), int(events)) for value, used, events in found)
    _upgrade(url, "head")
    engine.dispose()
    return rows


def test_migration_0040_folds_the_deltas_left_into_the_rollups_on_downgrade(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    expected = [("/a", 5, 3), ("/b", 2, 2)]
    assert _on_both(tmp_path, postgres_server, _rollups_across_0040) == [expected, expected]


_SEAT_WRITES = (
    "INSERT INTO distinct_values VALUES ('org', 'seats', 0, 'ann', 1)",  # a seat taken
    "UPDATE distinct_values SET live_events = 0 WHERE value = 'ann'",  # freed
    "UPDATE distinct_values SET live_events = 1 WHERE value = 'ann'",  # taken again
    "DELETE FROM distinct_values WHERE value = 'ann'",  # a held value's row gone
)


def _stamps_across_0041(url: str) -> tuple[list[bool], bool]:
    """Whether each of `_SEAT_WRITES` gave the window's counter a new stamp;
    whether the counters keep the column after 0041's downgrade."""
    _upgrade(url, "head")
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used, "
                "denied_count, denied_cost, tat_rem, tat_scale, updated_at_us) "
                "VALUES ('seats', 'org', 0, 10, 0, 0, 0, 0, 1, 0)"
            )
        )
    stamp = "SELECT seats_stamp FROM counters WHERE subject = 'org'"
    stamps: list[Any] = []
    for write in _SEAT_WRITES:
        with engine.begin() as connection:
            connection.execute(text(write))
            stamps.append(connection.execute(text(stamp)).scalar())
    moved = [s is not None and s not in stamps[:n] for n, s in enumerate(stamps)]
    _downgrade(engine, "0040")
    with engine.begin() as connection:
        connection.execute(text(_SEAT_WRITES[0]))  # no trigger left to fail it
        columns = list(connection.execute(text("SELECT * FROM counters")).keys())
        kept = "seats_stamp" in columns
    _upgrade(url, "head")
    engine.dispose()
    return moved, kept


def test_migration_0041_stamps_every_change_of_a_windows_held_values(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    expected = ([True] * len(_SEAT_WRITES), False)
    assert _on_both(tmp_path, postgres_server, _stamps_across_0041) == [expected, expected]


def _function_across(server: PostgresServer, revision: str, before: str) -> tuple[str, str, str]:
    """``metering_consume_one``'s body at ``revision``, after its downgrade to
    ``before``, then up again (on a database of its own)."""
    name = f"before_{revision}"
    server.create_database(name)
    try:
        return _bodies_across(server.url(name), revision, before)
    finally:
        server.drop_database(name)


def _bodies_across(url: str, revision: str, before: str) -> tuple[str, str, str]:
    _upgrade(url, revision)
    engine = make_engine(url)
    source = "SELECT prosrc FROM pg_proc WHERE proname = 'metering_consume_one'"
    bodies: list[str] = []
    for step in (revision, before, revision):
        if step == before:
            _downgrade(engine, before)
        elif bodies:
            _upgrade(url, revision)
        with engine.connect() as connection:
            bodies.append(str(connection.execute(text(source)).scalar_one()))
    engine.dispose()
    return bodies[0], bodies[1], bodies[2]


def _migration(name: str) -> Any:
    path = MIGRATIONS_DIR / "versions" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_migration_0042_skips_a_held_seats_row_and_its_downgrade_restores_0041s_function(
    postgres_server: PostgresServer,
) -> None:
    module = _migration("0042_consume_one_held_seats")
    old = module.consume_one_0041()
    head, down, up = _function_across(postgres_server, "0042", "0041")
    assert head == up != down
    assert "seatheld" in head and "seatheld" not in down
    assert down in old and head in module.skipping(old)  # the bodies between $fn$


def test_migration_0043_runs_fewer_statements_and_its_downgrade_restores_0042s_function(
    postgres_server: PostgresServer,
) -> None:
    module = _migration("0043_consume_one_fewer_statements")
    old = module.consume_one_0042()
    head, down, up = _function_across(postgres_server, "0043", "0042")
    assert head == up != down
    assert "usage_rollup_deltas" in head and "INTO usage_rollups" not in head
    assert "usage_rollup_deltas" not in down and "unnest(gi, gamts)" in down
    assert down in old and head in module.leaner(old)  # the bodies between $fn$


def test_migration_0044_reaches_fewer_expressions_and_its_downgrade_restores_0043s_function(
    postgres_server: PostgresServer,
) -> None:
    module = _migration("0044_consume_one_leaner_shapes")
    old = module.consume_one_0043()
    head, down, up = _function_across(postgres_server, "0044", "0043")
    assert head == up != down
    assert "cardinality(gids) = 1" in head and "gsum" not in head
    assert "cardinality(gids) = 1" not in down and "gsum" in down
    assert down in old and head in module.leaner(old)  # the bodies between $fn$


def test_migration_0045_draws_a_lone_grant_from_its_sums_read_and_its_downgrade_restores_0044s(
    postgres_server: PostgresServer,
) -> None:
    module = _migration("0045_consume_one_lone_grant")
    old = module.consume_one_0044()
    head, down, up = _function_across(postgres_server, "0045", "0044")
    assert head == up != down
    assert "gone_used" in head and "gone_used" not in down
    assert down in old and head in module.lone(old)  # the bodies between $fn$


def _cleared_across_0046(url: str) -> dict[str, bool]:
    """Held reservations a reset cleared part of, marked again by 0046's
    upgrade from their results after its downgrade dropped the mark."""
    _upgrade(url, "head")
    with Meter(url) as meter:
        meter.set_limits([Limit("a", maximum=50, period="1h"), Limit("b", maximum=50, period="1h")])
        meter.reserve(charges=[("org", "a", 3), ("org", "b", 2)], event_id="part")
        meter.reserve("org", "b", 1, event_id="kept")
        meter.reserve("org", "a", 1, event_id="all")
        meter.reserve("other", "a", 1, event_id="elsewhere")
        meter.reserve("org", "a", 1, event_id="cancelled").cancel()
        meter.reset("org", "a")
    engine = make_engine(url)
    _downgrade(engine, "0045")
    _upgrade(url, "head")
    with engine.connect() as connection:
        found = connection.execute(text("SELECT id, hold_cleared FROM reservations"))
        marks = {str(reservation): bool(cleared) for reservation, cleared in found}
    engine.dispose()
    return marks


def test_migration_0046_marks_the_holds_a_reset_cleared_part_of(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    expected = {
        "part": True,
        "kept": False,
        "all": True,
        "elsewhere": False,
        "cancelled": False,  # settled: nothing left to settle
    }
    assert _on_both(tmp_path, postgres_server, _cleared_across_0046) == [expected, expected]


def _history_across_0047(url: str) -> list[tuple[Any, ...]]:
    """The dimension history 0047's upgrade seeds from the limits after its
    downgrade dropped it; a void then takes from the seeded rows."""
    _upgrade(url, "head")
    clock = FrozenClock(datetime(2026, 11, 10, 12, 0, tzinfo=UTC))
    with Meter(url, clock=clock) as meter:
        meter.set_limit(Limit("a", maximum=50, period="1d", window="calendar"))
        clock.advance(seconds=1)
        meter.set_limit(Limit("b", maximum=50, period="1d", window="calendar", dimensions=["k"]))
        clock.advance(seconds=1)
        meter.consume("org", "b", 2, event_id="before", metadata={"k": "v"})
    engine = make_engine(url)
    _downgrade(engine, "0046")
    _upgrade(url, "head")
    with engine.connect() as connection:
        ticks = connection.execute(
            text("SELECT count(*) FROM results WHERE reset_tick >= (SELECT tick FROM reset_clock)")
        )
        assert ticks.scalar() == 0  # every result before the seeded rows
        found = connection.execute(
            text(
                "SELECT d.limit_name, d.since_us - l.updated_at_us, d.dimensions, d.seeded,"
                " d.tick = c.tick FROM limit_dimensions d JOIN limits l ON l.name = d.limit_name"
                " CROSS JOIN reset_clock c ORDER BY d.limit_name"
            )
        )
        history = [
            (name, since, keys, bool(seeded), bool(now)) for name, since, keys, seeded, now in found
        ]
    engine.dispose()
    with Meter(url, clock=clock) as meter:
        meter.set_limit(Limit("b", maximum=50, period="1d", window="calendar"))  # "k" removed
        meter.void("before", "refund")  # decided since b's definition: under the seed's "k"
        clock.advance(minutes=2)
        assert run_audit(meter, full=True).violations == ()
        rollups = meter.database.read(lambda c: AuditStore(c).rollups(None))
        assert [figures for key, figures in rollups.items() if key[2] == "k"] == [[0, 0]]
    return history


def test_migration_0047_seeds_each_limits_dimensions_since_its_definition(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    expected = [("a", 0, "[]", True, True), ("b", 0, '["k"]', True, True)]
    assert _on_both(tmp_path, postgres_server, _history_across_0047) == [expected, expected]


def _given_back_across_0048(url: str) -> dict[str, tuple[list[Any], list[Any]]]:
    """Each settled reservation's ``given_back`` as the head writes it, and
    as 0048's upgrade makes it from the form a cancel wrote before (the
    entries of counters the hold no longer names left out)."""
    _upgrade(url, "head")
    with Meter(url) as meter:
        meter.set_limits([Limit("a", maximum=50, period="1h"), Limit("b", maximum=50, period="1h")])
        part = meter.reserve(charges=[("org", "a", 3), ("org", "b", 2)], event_id="part")
        whole = meter.reserve("org", "a", 1, event_id="whole")
        plain = meter.reserve("org", "b", 1, event_id="plain")
        less = meter.reserve(charges=[("org", "a", 3), ("org", "b", 2)], event_id="less")
        meter.reserve("org", "a", 1, event_id="voided")
        meter.reset("org", "a")
        part.cancel()
        whole.cancel()
        plain.cancel()
        less.commit(actual=1)
        meter.void("voided", "refund")
    engine = make_engine(url)
    read = text("SELECT id, charges, given_back FROM reservations ORDER BY id")
    with engine.connect() as connection:
        head = {
            str(i): (json.loads(held), json.loads(back or "[]"))
            for i, held, back in connection.execute(read)
        }
    _downgrade(engine, "0047")
    with engine.begin() as connection:  # a cancel's form before 0048
        for reservation, (held, back) in head.items():
            holds = {(row[0], row[1], row[3]) for row in held}
            old = [entry for entry in back if tuple(entry[:3]) in holds]
            if reservation in ("part", "whole") and old != back:
                connection.execute(
                    text("UPDATE reservations SET given_back = :back WHERE id = :id"),
                    {"back": json.dumps(old) if old else None, "id": reservation},
                )
    _upgrade(url, "head")
    with engine.connect() as connection:
        found = {str(i): json.loads(back or "[]") for i, _, back in connection.execute(read)}
    engine.dispose()
    return {
        reservation: (sorted(back), sorted(found[reservation]))
        for reservation, (_, back) in head.items()
    }


def test_migration_0048_names_what_a_reset_dropped_in_a_cancels_given_back(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    for found in _on_both(tmp_path, postgres_server, _given_back_across_0048):
        assert all(head == upgraded for head, upgraded in found.values()), found
        named = {name: [[*e[:2], e[3]] for e in head] for name, (head, _) in found.items()}
        assert named["part"] == [["org", "a", 3], ["org", "b", 2]]  # a: dropped, released
        assert named["whole"] == [["org", "a", 1]]
        assert named["plain"] == [["org", "b", 1]]
        assert named["less"] == [["org", "a", 2], ["org", "b", 1]]  # a commit named them already


def _last_eras_across(url: str, below: str, column: str, limits: list[Limit]) -> list[Any]:
    """The ``column`` a migration's upgrade gives each defined limit's last
    era, after its downgrade to ``below`` dropped it (``limits`` defined, the
    one named "gone" deleted: its eras are not known)."""
    _upgrade(url, "head")
    clock = FrozenClock(datetime(2026, 11, 10, 12, 0, tzinfo=UTC))
    with Meter(url, clock=clock) as meter:
        meter.set_limits(limits)
        meter.delete_limit("gone")
    engine = make_engine(url)
    _downgrade(engine, below)
    _upgrade(url, "head")
    with engine.connect() as connection:
        query = f"SELECT limit_name, {column} FROM limit_dimensions ORDER BY limit_name"
        found = [(str(name), value) for name, value in connection.execute(text(query))]
    engine.dispose()
    return found


def _seat_keys_across_0049(url: str) -> list[Any]:
    seats = Limit("seats", maximum=5, period="1d", distinct="user")
    plain = Limit("plain", maximum=5, period="1d", dimensions=["k"])
    gone = Limit("gone", maximum=5, period="1d", distinct="user")
    return _last_eras_across(url, "0048", "distinct_key", [seats, plain, gone])


def test_migration_0049_gives_each_defined_limits_last_era_its_seat_key(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    expected = [("gone", None), ("plain", None), ("seats", "user")]
    assert _on_both(tmp_path, postgres_server, _seat_keys_across_0049) == [expected, expected]


def _aggregations_across_0050(url: str) -> list[Any]:
    disk = Limit("disk", maximum=5, period="1d", aggregation="latest")
    plain = Limit("plain", maximum=5, period="1d")
    gone = Limit("gone", maximum=5, period="1d", aggregation="max")
    return _last_eras_across(url, "0049", "aggregation", [disk, plain, gone])


def test_migration_0050_gives_each_defined_limits_last_era_its_aggregation(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    expected = [("disk", "latest"), ("gone", None), ("plain", "sum")]
    assert _on_both(tmp_path, postgres_server, _aggregations_across_0050) == [expected, expected]


def _definitions_across_0051(url: str) -> list[Any]:
    """The definitions migration 0051 gives each limit defined at the upgrade,
    after its downgrade dropped them (a limit deleted before: none)."""
    _upgrade(url, "head")
    clock = FrozenClock(datetime(2026, 11, 10, 12, 0, tzinfo=UTC))
    with Meter(url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1mo", window="calendar", enforcement="soft"),
                Limit("gone", maximum=5, period="1d"),
            ]
        )
        clock.advance(days=1)
        meter.set_limit(Limit("calls", maximum=300, period="1mo", window="calendar"))
        meter.delete_limit("gone")
    engine = make_engine(url)
    _downgrade(engine, "0050")
    _upgrade(url, "head")
    with engine.connect() as connection:
        query = "SELECT * FROM limit_definitions ORDER BY limit_name, effective_from_us"
        found = [tuple(row) for row in connection.execute(text(query))]
    engine.dispose()
    return found


def test_migration_0051_gives_each_defined_limit_its_definition_from_the_beginning(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    expected = [("calls", 0, 300, "hard")]
    assert _on_both(tmp_path, postgres_server, _definitions_across_0051) == [expected, expected]
