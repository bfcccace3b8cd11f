"""Usage by dimension: one subject's usage grouped by a metadata key (docs/reports.md).

``metering report usage --subject org-42 --group-by route`` answers, for each limit that
records ``route`` and each value, the cost consumed and the events that consumed it over the
period, the largest first. It reads the hourly rollups (`metering.domain.rollups`), summed
in the database: a month is an index range of the subject's rows. A subject is required
(the rollups are keyed by subject first). ``since`` and ``until`` must fall on the UTC hour:
a bound that does not is an error, never rounded. Without ``limit``, every limit that
records the key now is reported; one that stopped recording it, or was deleted, is not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any, Final

from sqlalchemy import Connection, Select

from metering.domain.events import validate_subject
from metering.domain.instants import to_us
from metering.domain.jsonable import fields_dict
from metering.domain.limits import DIMENSION_PATTERN, Limit, validate_limit_name
from metering.domain.rollups import HOUR_US, NO_VALUE
from metering.errors import InvalidInput, UnknownLimit
from metering.reports.overage import ReportRange, TimeBound, listed
from metering.storage.database import Database, DatabaseSource, database_of
from metering.storage.reports import ReportStore
from metering.storage.rollups import DimensionQuery, count_of, usage_by_statement
from metering.storage.store import Store

KIND: Final = "usage_by"


@dataclass(slots=True)
class DimensionRow:
    """A subject's use of one limit for one value of the key.

    ``value`` is None when the events had no value for the key (shown as
    ``(none)``); ``used`` is the cost consumed, ``events`` how many events
    consumed it (denied events consume nothing and are not counted).
    """

    subject: str
    limit: str
    dimension: str
    value: str | None
    used: int
    events: int

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


DIMENSION_COLUMNS: Final = tuple(f.name for f in fields(DimensionRow))


@dataclass(frozen=True)
class DimensionReport:
    """A validated group-by report: `rows` streams, `count` counts."""

    database: Database
    range: ReportRange
    query: DimensionQuery
    statement: Select[Any]
    kind: str = KIND

    @property
    def dimension(self) -> str:
        return self.query.dimension

    def count(self) -> int:
        """How many rows `rows` yields."""
        statement = count_of(self.statement)
        return self.database.run(lambda c: int(c.execute(statement).scalar_one()))

    def rows(self) -> Iterator[DimensionRow]:
        """The rows, streamed from the database (read them all, or close the iterator)."""
        subject, key = self.query.subject, self.query.dimension
        with self.database.reading() as connection:
            for limit, value, used, events in ReportStore(connection).stream(self.statement):
                shown = None if value == NO_VALUE else value
                yield DimensionRow(subject, limit, key, shown, int(used), int(events))


def validate_dimension_key(key: object) -> str:
    """A metadata key as ``--group-by`` takes it (the rule of `Limit.dimensions`)."""
    if not isinstance(key, str) or DIMENSION_PATTERN.fullmatch(key) is None:
        raise InvalidInput("group_by", f"{key!r} must be 1 to 64 of a-z A-Z 0-9 _ . -")
    return key


def _on_the_hour(chosen: ReportRange) -> None:
    for name, bound in (("since", chosen.since), ("until", chosen.until)):
        if bound is not None and to_us(bound, field_name=name) % HOUR_US:
            raise InvalidInput(
                name, f"{bound.isoformat()} is not on the hour: usage by dimension is hourly"
            )


def _recorded(limit: Limit) -> str:
    return ", ".join(limit.dimensions) if limit.dimensions else "no dimension"


def _limits_recording(database: Database, key: str, limit: str | None) -> list[str]:
    """The limits to report: ``limit`` when it records ``key`` or did once,
    else every limit that does or did (deleted ones too: a limit's dimension
    history keeps its eras, and their rollup rows stay)."""

    def read(connection: Connection) -> tuple[dict[str, Limit], dict[str, set[str]]]:
        store = Store(connection)
        eras = store.dimension_history()
        ever = {name: {k for era in found for k in era.dimensions} for name, found in eras.items()}
        return {found.name: found for found in store.list_limits()}, ever

    defined, ever = database.run(read)
    for name, found in defined.items():
        ever.setdefault(name, set()).update(found.dimensions)
    if limit is not None:
        validate_limit_name(limit)
        if limit not in ever:
            raise UnknownLimit(limit)
        if key not in ever[limit]:
            chosen = defined.get(limit)
            records = (
                f"records {_recorded(chosen)}" if chosen else f"recorded {_listed(ever[limit])}"
            )
            raise InvalidInput(
                "group_by", f"limit {limit} does not record dimension {key!r}; it {records}"
            )
        return [limit]
    names = sorted(name for name, keys in ever.items() if key in keys)
    if not names:
        keys = set[str]().union(*ever.values())
        recorded = _listed(keys) if keys else "none (see Limit dimensions)"
        raise InvalidInput(
            "group_by", f"no limit records dimension {key!r}; the recorded ones are {recorded}"
        )
    return names


def _listed(keys: set[str]) -> str:
    return ", ".join(sorted(keys)) if keys else "no dimension"


def usage_by_dimension(
    meter: DatabaseSource,
    *,
    subject: str,
    key: str,
    limit: str | None = None,
    period: str | None = None,
    since: TimeBound = None,
    until: TimeBound = None,
) -> DimensionReport:
    """``subject``'s usage per limit and value of the metadata ``key``, largest first.

    ``period`` is a month (``"2026-11"``), or give ``since``/``until`` on
    the hour (``until`` exclusive); neither: all time. Raises `InvalidInput`
    (``.field``: ``subject``, ``group_by``, ``period``, ``since``, ``until``,
    ``name``) or `UnknownLimit` before anything is read.
    """
    database = database_of(meter)
    validate_subject(subject)
    validate_dimension_key(key)
    chosen = ReportRange.of(period, since, until)
    _on_the_hour(chosen)
    names = _limits_recording(database, key, limit)
    bounds = chosen.query()
    query = DimensionQuery(subject, key, names, bounds.since_us, bounds.until_us)
    return DimensionReport(database, chosen, query, usage_by_statement(query))


usage_by_dimension_report = listed(
    usage_by_dimension,
    DimensionRow,
    "usage_by_dimension_report",
    "`usage_by_dimension`'s rows as a list.",
)
