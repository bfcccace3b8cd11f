"""The runaway breaker in a batch's transaction (`metering.domain.breaker`),
the same for the fast path and the reference engine.

`Breakers.read` reads the breakers of the pairs a batch charges on limits with one,
after their counters are locked; `is_quarantined` tells a path to decide a charge with
the limit's quarantined form (`Limit.quarantined`, no grants); `charged` steps the
breakers with what an event consumed, event after event, so a trip holds the batch's
later events (one no charge can trip, `steady`, is stepped once at the end: `runs`);
`write` stores them and, once per quarantine, a ``limit.quarantined`` notice whose
payload carries a signed path that releases it (`metering.limits.quarantine`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from sqlalchemy import Connection

from metering.domain.breaker import Breaker, Stepping, runs, steady
from metering.domain.decisions import CHARGE_KEYS
from metering.domain.limits import Limit
from metering.domain.links import sign
from metering.domain.notifications import Notice, payload_of
from metering.storage.breakers import BreakerStore, Pair
from metering.storage.history import portal_secret
from metering.storage.hot.extras import BREAKER_SECRET
from metering.storage.webhooks import WebhookStore

_SUBJECT, _LIMIT, _COST, _OUTCOME, _USED, _MAXIMUM, _START, _END = (
    CHARGE_KEYS.index(name)
    for name in (
        "subject",
        "limit",
        "cost",
        "outcome",
        "used",
        "maximum",
        "window_start",
        "resets_at",
    )
)
SECRET_NAME: Final = BREAKER_SECRET
RELEASE_PATH: Final = "/quarantine/release"
LINK_TTL_SECONDS: Final = 7 * 86_400


def release_token(
    secret: str, limit: str, subject: str, quarantined_at_us: int, now_us: int
) -> str:
    """The signed token of a release link: this quarantine, for a week."""
    return sign(
        secret, f"{limit}\n{subject}\n{quarantined_at_us}", now_us // 1_000_000 + LINK_TTL_SECONDS
    )


class Breakers:
    """The breakers of one batch's charged pairs, on limits with a breaker."""

    def __init__(
        self, limits: Mapping[str, Limit], states: dict[Pair, Breaker], now_us: int | None = None
    ) -> None:
        self.limits = limits
        self.states = states  # as read
        self.stepping: dict[Pair, Stepping] = {}  # those the batch stepped, as stepped
        self.notices: list[Notice] = []
        # The consumed charges' rows (as `ChargeDecision.to_row`, perhaps of a
        # limit without a breaker) of pairs `steady` at ``now_us``, in order:
        # none trips, so each pair's are stepped once, at the end (`runs`).
        self.deferred: list[Sequence[Any]] = []
        self.now_us = now_us  # (the first charge's, when not given)

    @classmethod
    def read(
        cls,
        connection: Connection,
        limits: Iterable[Limit],
        pairs: Iterable[Pair],
        *,
        lock: bool,
    ) -> Breakers | None:
        """The breakers of ``pairs`` of ``limits`` with one; None when there are none."""
        with_breaker = {limit.name: limit for limit in limits if limit.breaker_factor}
        if not with_breaker:
            return None
        wanted = [pair for pair in pairs if pair[0] in with_breaker]
        if not wanted:
            return None
        return cls(with_breaker, BreakerStore(connection).read(wanted, lock=lock))

    def is_quarantined(self, limit: str, subject: str) -> bool:
        pair = (limit, subject)
        state: Breaker | Stepping | None = self.stepping.get(pair) or self.states.get(pair)
        return state is not None and state.quarantined_at_us is not None

    def charged(
        self, outcome: str, rows: Sequence[Sequence[Any]], event_id: str | None, now_us: int
    ) -> None:
        """Step the breakers with an event's consumed charges (``rows``, as
        `ChargeDecision.to_row`): nothing when it was denied."""
        if outcome not in ("allowed", "overage"):
            return
        limits = self.limits
        for row in rows:
            limit = limits.get(row[_LIMIT])
            if limit is None or row[_OUTCOME] in ("denied", "would_deny"):
                continue
            self._step(limit, row, event_id, now_us)

    def _step(self, limit: Limit, row: Sequence[Any], event_id: str | None, now_us: int) -> None:
        """Step ``limit``'s breaker of ``row``'s subject by its cost (deferred
        when it is steady); note a trip."""
        assert limit.breaker_factor is not None
        pair = (limit.name, row[_SUBJECT])
        stepping = self.stepping.get(pair)
        if stepping is None:
            if self.now_us is None:
                self.now_us = now_us
            state = self.states.get(pair)
            if now_us == self.now_us and steady(state, now_us):
                self.deferred.append(row)
                return
            if self.deferred and now_us != self.now_us:  # (not one batch's: each in turn)
                self._flush()
                stepping = self.stepping.get(pair)
            if stepping is None:
                stepping = self.stepping[pair] = Stepping(state, now_us)
        if stepping.charge(row[_COST], now_us, limit.breaker_factor, limit.breaker_floor):
            self.notices.append(_notice(limit, row, event_id, now_us))

    def _flush(self) -> None:
        """Step the deferred charges one by one (none trips)."""
        deferred, self.deferred = self.deferred, []
        limits, now_us = self.limits, self.now_us
        assert now_us is not None
        for row in deferred:
            limit = limits.get(row[_LIMIT])
            if limit is None:
                continue
            assert limit.breaker_factor is not None
            pair = (limit.name, row[_SUBJECT])
            stepping = self.stepping.get(pair)
            if stepping is None:
                stepping = self.stepping[pair] = Stepping(self.states.get(pair), now_us)
            stepping.charge(row[_COST], now_us, limit.breaker_factor, limit.breaker_floor)

    def write(self, connection: Connection, now_us: int, *, announce: bool = True) -> None:
        """Store the changed breakers, and the notices of those that tripped."""
        changed = self.changed_states()
        if not changed:
            return
        BreakerStore(connection).write(changed)
        if not (self.notices and announce):
            return
        secret = portal_secret(connection, now_us, SECRET_NAME)
        WebhookStore(connection).record_notices(self.documents(secret, now_us), now_us)

    def changed_states(self) -> dict[Pair, Breaker]:
        """The breakers the batch stepped, to store (in no order)."""
        found = {pair: stepping.breaker() for pair, stepping in self.stepping.items()}
        if not self.deferred:
            return found
        costs: dict[Pair, list[int]] = {}
        limits = self.limits
        for row in self.deferred:
            if row[_LIMIT] in limits:
                pair = (row[_LIMIT], row[_SUBJECT])
                some = costs.get(pair)
                if some is None:
                    costs[pair] = [row[_COST]]
                else:
                    some.append(row[_COST])
        assert self.now_us is not None
        settings = {
            name: (limit.breaker_factor or 0, limit.breaker_floor) for name, limit in limits.items()
        }
        found.update(runs(self.states, costs, self.now_us, settings))
        return found

    def documents(self, secret: str, now_us: int) -> list[tuple[Notice, dict[str, Any]]]:
        """The ``limit.quarantined`` notices with their payloads, each with
        its signed release path (made with ``secret``)."""
        found = []
        for notice in self.notices:
            document = payload_of(notice, now_us)
            token = release_token(secret, notice.limit, notice.subject, now_us, now_us)
            document["data"]["quarantined_at"] = document["timestamp"]
            document["data"]["release_path"] = f"{RELEASE_PATH}?token={token}"
            found.append((notice, document))
        return found


def _notice(limit: Limit, row: Sequence[Any], event_id: str | None, now_us: int) -> Notice:
    start = row[_START]
    return Notice(
        type="limit.quarantined",
        mark=f"quarantined:{now_us}",
        limit=limit.name,
        subject=row[_SUBJECT],
        maximum=row[_MAXIMUM],
        used=row[_USED],
        window_start_us=start,
        window_end_us=row[_END],
        resets_at_us=row[_END],
        retry_at_us=None,
        event_id=event_id,
    )
