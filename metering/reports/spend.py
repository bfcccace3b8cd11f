"""The spend report: per subject and currency, what its priced limits cost.

For each subject that used a priced limit in the period (all time without one), the
amount per priced limit, the total, and the cap of each spend limit of that currency
(the entitlement in force at the period's end, or now, else the limit's maximum then).
Amounts come from the spend rollups (`metering.domain.rollups.spend_deltas`), each
charge rounded on its own, in its event's hour; voids and cancels take theirs away. A
billing month is each subject's local month (`metering.domain.zones.month_bounds`), and
a zoned subject's rows say so (``time_zone``, ``local_window``). Major units in the
output (``"12.34"``), minor units inside.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from metering.domain.definitions import default_at
from metering.domain.events import validate_subject
from metering.domain.grants import maximum_at
from metering.domain.money import format_amount
from metering.domain.zones import UTC_ZONE, ZoneHistory, month_bounds
from metering.reports.export import neutralise
from metering.reports.overage import ReportRange
from metering.storage.allowances import AllowanceStore
from metering.storage.database import DatabaseSource, database_of
from metering.storage.prices import PriceStore
from metering.storage.store import Store

KIND: Final = "spend"
SPEND_COLUMNS: Final = (
    "subject",
    "currency",
    "total",
    "spend_limit",
    "cap",
    "time_zone",
    "local_window",
)


@dataclass(slots=True)
class SpendRow:
    """One subject's spend in one currency against one spend limit (``spend_limit``
    and ``cap`` None when the currency has none). Amounts in minor units."""

    subject: str
    currency: str
    amounts: dict[str, int] = field(default_factory=dict)
    total: int = 0
    spend_limit: str | None = None
    cap: int | None = None
    # A subject with a time zone: its zone and the month's local label.
    time_zone: str | None = None
    local_window: str | None = None

    def to_dict(self) -> dict[str, Any]:
        money = self.currency
        return {
            "subject": self.subject,
            "currency": money,
            "amounts": {name: format_amount(a, money) for name, a in self.amounts.items()},
            "total": format_amount(self.total, money),
            "spend_limit": self.spend_limit,
            "cap": None if self.cap is None else format_amount(self.cap, money),
            "time_zone": self.time_zone,
            "local_window": self.local_window,
        }


@dataclass(frozen=True, slots=True)
class SpendReport:
    """The report's head and rows; ``limits`` are the priced limits met, sorted."""

    range: ReportRange
    rows: list[SpendRow]

    @property
    def limits(self) -> list[str]:
        return sorted({name for row in self.rows for name in row.amounts})

    def head(self) -> dict[str, Any]:
        return {"report": KIND, "period": self.range.label}

    def to_dict(self) -> dict[str, Any]:
        return {**self.head(), "rows": [row.to_dict() for row in self.rows]}

    def csv_header(self) -> list[str]:
        return [*SPEND_COLUMNS, *(f"amount:{name}" for name in self.limits)]

    def csv_rows(self) -> Iterator[list[object]]:
        """Cells: amounts in major units (text, exact), strings neutralised."""
        names = self.limits
        for row in self.rows:
            shown = row.to_dict()
            yield [
                neutralise(row.subject),
                row.currency,
                shown["total"],
                row.spend_limit or "",
                shown["cap"] or "",
                row.time_zone or "",
                neutralise(row.local_window or ""),
                *(shown["amounts"].get(name, "") for name in names),
            ]


def spend_report(
    meter: DatabaseSource, period: str | None = None, subject: str | None = None
) -> SpendReport:
    """The spend of ``period`` (a month, ``"2026-11"``; None: all time), per
    subject and currency.

    Raises `InvalidInput` (``period``, ``subject``) before anything is read.
    """
    database = database_of(meter)
    chosen = ReportRange() if period is None else ReportRange.month(period)
    if subject is not None:
        validate_subject(subject)
    bounds = chosen.query()
    since_us, until_us = bounds.since_us, bounds.until_us
    now_us = database.now_us()

    def work(connection: Any) -> list[SpendRow]:
        found = PriceStore(connection)
        zones = AllowanceStore(connection).time_zones(None if subject is None else [subject])
        months = _local_months(zones, period)
        zoned: dict[tuple[int, int], list[str]] = {}
        for who, (start, end, _) in months.items():
            zoned.setdefault((start, end), []).append(who)
        amounts = found.spend_amounts(since_us, until_us, subject, zoned)
        spend = found.spend_limits()
        names = [name for group in spend.values() for name in group]
        store = Store(connection)
        limits = store.load_limits(names)
        defaults = store.definition_history(names)
        pairs = {(n, s) for s, _, currency, _ in amounts for n in spend.get(currency, ())}
        histories = AllowanceStore(connection).histories(pairs)
        by_subject: dict[tuple[str, str], dict[str, int]] = {}
        for who, name, currency, amount in amounts:
            if amount:
                by_subject.setdefault((who, currency), {})[name] = amount
        rows: list[SpendRow] = []
        for (who, currency), spent in by_subject.items():
            total = sum(spent.values())
            caps: list[str | None] = [*spend.get(currency, ())] or [None]
            for cap_name in caps:
                cap = None
                month = months.get(who)
                if cap_name is not None:
                    history = histories.get((cap_name, who))
                    end_us = until_us if month is None else month[1]
                    last_us = now_us if end_us is None else end_us - 1
                    today = limits[cap_name].maximum
                    default = default_at(defaults.get(cap_name, ()), today, last_us)
                    cap = maximum_at(history, default, last_us)
                row = SpendRow(who, currency, dict(spent), total, cap_name, cap)
                if month is not None and month[2] != UTC_ZONE:
                    row.time_zone, row.local_window = month[2], f"{period} {month[2]}"
                rows.append(row)
        return rows

    return SpendReport(chosen, database.run(work))


def _local_months(
    zones: dict[str, ZoneHistory], period: str | None
) -> dict[str, tuple[int, int, str]]:
    """The billing month ``period`` of each subject with a time zone whose month
    is not UTC's (a local month, or one a change of zone moved an end of): its
    instants and zone (none without a period)."""
    if period is None:
        return {}
    year, month = (int(part) for part in period.split("-"))
    utc = month_bounds((), year, month)
    found = {who: month_bounds(history, year, month) for who, history in zones.items()}
    return {who: bounds for who, bounds in found.items() if bounds != utc}
