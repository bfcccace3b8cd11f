"""Backtests: what proposed limits and entitlements would have decided.

`simulate` reads the demand the results ledger recorded since an instant
(`metering.storage.simulation.demand`: decided events, voided ones left
out, oldest first) and replays it in memory through the limits in force
with the proposed ones laid over them, as ``metering limits apply`` would
store them, and the stored entitlements with the proposed ones added, as
``metering entitlements load`` would (`metering.domain.replay`). It writes
nothing. A period older than the results' retention (results may have been
pruned) is refused with `PeriodPruned`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from metering.domain.events import validate_subject
from metering.domain.grants import Entitlement, History
from metering.domain.instants import from_us, parse_instant, to_us
from metering.domain.limits import Limit, is_reserved, parse_period
from metering.domain.replay import Pair, Replay, SimulationRow, StoredEvent
from metering.errors import InvalidInput, PeriodPruned, ReservedLimit
from metering.limits.files import EntitlementEntry, load_entitlements_file, load_limits_file
from metering.settings import RetentionPolicy
from metering.storage.allowances import AllowanceStore
from metering.storage.database import Database
from metering.storage.limits import LimitStore
from metering.storage.simulation import count_demand, demand

LimitsSource = str | Path | Iterable[Limit]
EntitlementsSource = str | Path | Iterable[Entitlement | EntitlementEntry] | None
Since = datetime | timedelta
# Called with (events read, events in the period) as the replay goes.
Progress = Callable[[int, int], None]
PROGRESS_EVERY: Final = 10_000
DURATION: Final = re.compile(r"[ \t]*[0-9]+[ \t]*[a-z]+[ \t]*")


@dataclass(frozen=True, slots=True)
class Simulation:
    """A backtest's answer: the period replayed and the figures per subject and limit."""

    since: datetime
    until: datetime
    events: int  # events replayed
    rows: tuple[SimulationRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "events": self.events,
            "rows": [row.to_dict() for row in self.rows],
        }


def simulate(
    database: Database,
    limits: LimitsSource,
    entitlements: EntitlementsSource = None,
    *,
    since: Since,
    subject: str | None = None,
    retention: RetentionPolicy | None = None,
    progress: Progress | None = None,
) -> Simulation:
    """Replay the ledger's demand from ``since`` (an instant, or a duration
    before now) to now through ``limits`` and ``entitlements`` (files, or
    values); only ``subject``'s charges if given. Nothing is written."""
    proposed = _proposed(limits)
    changes = _entitlements(entitlements)
    if subject is not None:
        validate_subject(subject)
    now_us = database.now_us()
    since_us = _since_us(since, now_us)
    _check_kept(since_us, now_us, retention or RetentionPolicy.from_environment())
    with database.reading() as connection:
        # The product's own limits (metering.*: the API's rate per key) are not replayed.
        stored = LimitStore(connection).list_limits()
        in_force = {limit.name: limit for limit in stored if not is_reserved(limit.name)}
        in_force.update((limit.name, limit) for limit in proposed)
        allowances = AllowanceStore(connection)
        histories = _histories(allowances.histories(), changes, in_force, since_us)
        replay = Replay(in_force, histories, subject, allowances.time_zones())
        total = count_demand(connection, since_us, now_us) if progress else 0
        done = 0
        seats = any(limit.distinct is not None for limit in in_force.values())
        for at_us, charges, meta in demand(connection, since_us, now_us, metadata=seats):
            replay.feed(StoredEvent.of_row(at_us, charges, meta))
            done += 1
            if progress is not None and done % PROGRESS_EVERY == 0:
                progress(done, total)
        if progress is not None:
            progress(done, total)
    return Simulation(from_us(since_us), from_us(now_us), replay.replayed, tuple(replay.rows()))


def parse_since(text: str) -> Since:
    """``--since``: a duration before now (``30d``, ``12h``, ``2w``) or an RFC 3339 instant."""
    if not isinstance(text, str):
        raise InvalidInput("since", f"expected a duration (30d) or an RFC 3339 time, got {text!r}")
    if DURATION.fullmatch(text):
        period = parse_period(text, field_name="since")
        if period.is_calendar_months:
            raise InvalidInput("since", f"{text!r}: give days or weeks (30d, 13w), not months")
        return timedelta(seconds=period.seconds)
    try:
        return parse_instant(text, field_name="since")
    except InvalidInput as exc:
        raise InvalidInput("since", f"{exc.message} (or give a duration: 30d, 12h)") from None


def _limits(source: LimitsSource) -> list[Limit]:
    if isinstance(source, str | Path):
        return load_limits_file(source)
    found = list(source)
    for limit in found:
        if not isinstance(limit, Limit):
            raise InvalidInput("limits", f"expected Limit values, got {type(limit).__name__}")
    return found


def _proposed(source: LimitsSource) -> list[Limit]:
    found = _limits(source)
    for limit in found:
        if is_reserved(limit.name):
            raise ReservedLimit(limit.name, "simulate")
    return found


Change = tuple[str, str, int | None, int | None, str]  # subject, limit, maximum, from, where


def _entitlements(source: EntitlementsSource) -> list[Change]:
    if source is None:
        return []
    if isinstance(source, str | Path):
        source = load_entitlements_file(source)
    changes: list[Change] = []
    for number, item in enumerate(source, start=1):
        if isinstance(item, EntitlementEntry):
            start = None if item.effective_from is None else to_us(item.effective_from)
            changes.append((item.subject, item.limit, item.maximum, start, item.where))
        elif isinstance(item, Entitlement):
            where = f"entry {number}"
            changes.append((item.subject, item.limit, item.maximum, item.effective_from_us, where))
        else:
            raise InvalidInput("entitlements", f"expected Entitlement values, got {item!r}")
    return changes


def _since_us(since: Since, now_us: int) -> int:
    if isinstance(since, timedelta):
        since_us = now_us - since // timedelta(microseconds=1)
    elif isinstance(since, datetime):
        since_us = to_us(since, field_name="since")
    else:
        raise InvalidInput("since", f"expected a datetime or a timedelta, got {since!r}")
    if since_us > now_us:
        raise InvalidInput("since", f"{from_us(since_us).isoformat()} is in the future")
    return since_us


def _check_kept(since_us: int, now_us: int, retention: RetentionPolicy) -> None:
    """Results older than the retention age may be gone: refuse such a period."""
    age_us = retention.age_us("results")
    if age_us is not None and since_us < now_us - age_us:
        raise PeriodPruned(from_us(since_us), from_us(now_us - age_us))


def _histories(
    stored: dict[Pair, History],
    changes: list[Change],
    limits: dict[str, Limit],
    since_us: int,
) -> dict[Pair, History]:
    """The stored changes of maximum with the proposed ones added; a proposed
    change without ``effective_from`` applies from the start of the period."""
    merged: dict[Pair, dict[int, int | None]] = defaultdict(dict)
    for pair, history in stored.items():
        merged[pair].update(history)
    for subject, limit, maximum, start_us, where in changes:
        if limit not in limits:
            raise InvalidInput("entitlements", f"{where}: limit: no limit named {limit!r}")
        merged[(limit, subject)][since_us if start_us is None else start_us] = maximum
    return {pair: tuple(sorted(history.items())) for pair, history in merged.items()}


class SimulationFacade:
    """`Meter`'s backtest (a part of the facade, kept beside its feature)."""

    database: Database

    def simulate(
        self,
        limits: LimitsSource,
        entitlements: EntitlementsSource = None,
        *,
        since: Since,
        subject: str | None = None,
        progress: Progress | None = None,
    ) -> Simulation:
        """Backtest: replay the ledger's demand since ``since`` through proposed
        limits and entitlements, in memory; nothing is written (`simulate`)."""
        return simulate(
            self.database, limits, entitlements, since=since, subject=subject, progress=progress
        )
