"""Limits changed while they have state, against the ledger's audit, on both databases.

A Hypothesis state machine sets, changes and deletes limits of every kind
(fixed windows, seats, gauges, token buckets, floating licenses, spend limits;
some by a dimension), prices them, grants (recurring too), gives subjects
their own maximums and time zones, reserves (stacked too), consumes
(in batches too), voids, resets, checks out and in, and moves a frozen clock,
over two subjects and three limit names. A `MeteringError` is a documented
refusal; anything else fails. After every step: no flat fee is charged
twice in one window of one subject, and an
allowed charge of a hard limit stays within its maximum in force plus what
its window drew on grants. At the end the full audit finds nothing but
what the docs say a change of kind leaves (`EXEMPT`): its rollups
(`rollup_ledger`, the usage and spend reports) are exact. And the spend
report bills what the answers charged, less voids and the money that went back.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from budgets import examples
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from servers import copy_sqlite
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.audit import Invariant
from metering.domain.decisions import Decision
from metering.domain.events import make_event
from metering.errors import MeteringError
from metering.reports.spend import spend_report
from metering.storage.tables import counters
from metering.upkeep.audit import run_audit

START = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)  # a day's and a month's end are near
SUBJECTS = ("org-1", "org-2")
NAMES = ("a", "b", "c")
USERS = ("ann", "bob", "cy")
FEE = "7"  # 700 cents: more than any unit price here, so a charge of 700 or more holds the fee
FEE_CENTS = 700
TTL = 3600.0

# A change of kind applies to events decided (and voids, cancels, commits
# settled) after it; a window counted before is not recounted
# (docs/gauges.md, docs/seats.md "Changing a limit"; docs/audit.md names
# the seat case a false alarm). The docs do not say so of a limit made a
# spend limit or made one no longer, but it is the same: its window keeps
# units as money, or money as units. These invariants are not judged on a
# window counted under another kind than its limit's now, nor is the
# maximum of a decision in such a window (a gauge judges a level).
EXEMPT = frozenset(
    {Invariant.COUNTER_LEDGER, Invariant.SEAT_HELD, Invariant.SPEND_PRICED, Invariant.HARD_MAXIMUM}
)

PERIODS = st.sampled_from(["1h", "1d", "1mo"])
MAXIMA = st.integers(min_value=1, max_value=8)
ENFORCEMENT = st.sampled_from(["hard", "soft"])
DIMENSIONS = st.sampled_from([(), ("user",)])


@st.composite
def limits(draw: st.DrawFn, name: str) -> Limit:
    kind = draw(
        st.sampled_from(
            ["calendar", "first_use", "seats", "max", "latest", "bucket", "concurrent", "spend"]
        )
    )
    maximum, period, enforcement = draw(MAXIMA), draw(PERIODS), draw(ENFORCEMENT)
    dimensions = draw(DIMENSIONS)  # the usage report by user (the audit's rollup_ledger)
    if kind == "calendar":
        return Limit(
            name,
            maximum=maximum,
            period=period,
            window="calendar",
            enforcement=enforcement,
            dimensions=dimensions,
        )
    if kind == "first_use":
        return Limit(
            name, maximum=maximum, period=period, enforcement=enforcement, dimensions=dimensions
        )
    if kind == "seats":
        return Limit(
            name,
            maximum=maximum,
            period=period,
            window="calendar",
            distinct="user",
            enforcement=enforcement,
            dimensions=dimensions,
        )
    if kind in ("max", "latest"):
        return Limit(
            name,
            maximum=maximum,
            period=period,
            window="calendar",
            aggregation=kind,
            enforcement=enforcement,
        )
    if kind == "bucket":
        return Limit(
            name,
            maximum=maximum,
            period=draw(st.sampled_from(["10s", "1h"])),
            algorithm="token_bucket",
        )
    if kind == "concurrent":
        return Limit(name, maximum=maximum, algorithm="concurrent")
    amount = draw(st.sampled_from(["0.50", "20.00"]))
    return spend_limit(
        name,
        amount,
        "USD",
        period,
        window="calendar",
        enforcement=enforcement,
        dimensions=dimensions,
    )


def counting(limit: Limit | None) -> str:
    """How a limit's counter counts: windows counted one way are judged that way."""
    if limit is None:
        return "none"
    if limit.currency is not None:
        return "spend"
    if limit.distinct is not None:
        return "seats"
    if limit.is_gauge:
        return f"gauge {limit.aggregation}"
    return limit.algorithm


@dataclass
class Ledger:
    """What the machine saw decided, to judge the flat fee and the audit's exemptions."""

    # (subject, limit, window start) -> events whose live charge holds the window's fee
    fees: dict[tuple[str, str, int | None], set[str]] = field(default_factory=dict)
    # (subject, limit, window start) -> kinds of counting it was decided or settled under
    kinds: dict[tuple[str, str, int | None], set[str]] = field(default_factory=dict)
    # (subject, limit) -> the event count at its last reset
    resets: dict[tuple[str, str], int] = field(default_factory=dict)
    # event id -> the windows its charges were decided in
    windows: dict[str, list[tuple[str, str, int | None]]] = field(default_factory=dict)
    # event id -> what its priced charges bill: (subject, currency, limit) -> minor units
    bill: dict[str, dict[Billed, int]] = field(default_factory=dict)
    # (subject, limit) given an entitlement at some point
    entitled: set[tuple[str, str]] = field(default_factory=set)
    events: int = 0


Billed = tuple[str, str, str]


def billed(decision: Any) -> dict[Billed, int]:
    """What a decided event's priced charges bill: consumed, and not a shadow's would-deny."""
    if decision is None or decision.outcome not in ("allowed", "overage"):
        return {}
    return {
        (c.subject, c.price[0], c.limit): c.price[1]
        for c in decision.charges
        if c.price is not None and c.outcome != "would_deny"
    }


class LimitChanges(RuleBasedStateMachine):
    def __init__(self, database: Databases) -> None:
        super().__init__()
        self.database = database
        self.url = database.take()
        self.clock = FrozenClock(START)
        self.meter = Meter(self.url, clock=self.clock)
        self.limits: dict[str, Limit] = {}
        self.held: list[tuple[str, int]] = []  # reservation ids and costs
        self.consumed: list[str] = []
        self.checkouts: list[str] = []
        self.ledger = Ledger()

    def _id(self, prefix: str) -> str:
        self.ledger.events += 1
        return f"{prefix}{self.ledger.events}"

    def _record(self, decision: Any, event_id: str) -> None:
        """Judge an event's decision: the fee once a window, a hard maximum kept."""
        if not decision.duplicate:
            self.ledger.bill[event_id] = billed(decision)
        for charge in decision.charges:
            key = (charge.subject, charge.limit, charge.window_start_us)
            self.ledger.windows.setdefault(event_id, []).append(key)
            self.ledger.kinds.setdefault(key, set()).add(counting(self.limits.get(charge.limit)))
            if not charge.allowed:
                continue
            if charge.price is not None and charge.price[1] >= FEE_CENTS:
                live = self.ledger.fees.setdefault(key, set())
                assert not live, f"{event_id}: the fee again in a window paid by {live}"
                live.add(event_id)
            limit = self.limits.get(charge.limit)
            if limit is None or limit.enforcement != "hard" or charge.cost == 0:
                continue
            if len(self.ledger.kinds[key]) > 1:
                continue  # a gauge judges a level, not what the window summed before (EXEMPT)
            if (charge.subject, charge.limit) not in self.ledger.entitled:
                assert charge.maximum == limit.maximum, (event_id, charge, limit)
            # (An entitlement's maximum in force: the audit's `hard_maximum` judges it.)
            if limit.is_gauge:  # a level above the maximum is denied; the peak may be an older one
                assert charge.cost <= charge.maximum, (event_id, charge)
                continue
            granted = self._granted(charge.subject, charge.limit, charge.window_start_us)
            assert charge.used <= charge.maximum + granted + charge.overdraft, (event_id, charge)

    def _consumed(self, decision: Any, event_id: str) -> None:
        """`_record` a consumed event's decision; one allowed may be voided."""
        self._record(decision, event_id)
        if decision.allowed:
            self.consumed.append(event_id)

    def _granted(self, subject: str, name: str, window_start_us: int | None) -> int:
        c = counters.c
        with self.meter.sql_engine.connect() as connection:
            found = connection.execute(
                select(c.granted).where(
                    c.subject == subject,
                    c.limit_name == name,
                    c.window_start_us == (window_start_us or 0),
                )
            ).scalar()
        return int(found or 0)

    def _settled(self, event_id: str) -> None:
        """A void, cancel or commit changes its windows by the rules of their limits' kinds now."""
        for key in self.ledger.windows.get(event_id, []):
            self.ledger.kinds[key].add(counting(self.limits.get(key[1])))

    def _spend(self, name: str) -> bool:
        limit = self.limits.get(name)
        return limit is not None and limit.currency is not None

    def _gone(self, event_id: str) -> None:
        for live in self.ledger.fees.values():
            live.discard(event_id)

    @initialize(data=st.data(), fee=st.booleans())
    def start(self, data: st.DataObject, fee: bool) -> None:
        """Every name a limit, "a" a priced one, so that the first steps have state to change."""
        for name in NAMES:
            self.set_limit(data, name)
        self.set_price("a", "per_unit", fee)

    @rule(data=st.data(), name=st.sampled_from(NAMES))
    def set_limit(self, data: st.DataObject, name: str) -> None:
        limit = data.draw(limits(name))
        try:
            self.meter.set_limit(limit)
        except MeteringError:
            return
        self.limits[name] = limit

    @rule(
        name=st.sampled_from(NAMES),
        model=st.sampled_from(["per_unit", "graduated"]),
        fee=st.booleans(),
    )
    def set_price(self, name: str, model: str, fee: bool) -> None:
        flat_fee = FEE if fee else None
        try:
            if model == "per_unit":
                self.meter.set_price(name, "0.01", "USD", flat_fee=flat_fee)
            else:
                tiers = ["3:0.02", "inf:0.01"]
                self.meter.set_price(
                    name, None, "USD", model="graduated", tiers=tiers, flat_fee=flat_fee
                )
        except MeteringError:
            pass

    @rule(name=st.sampled_from(NAMES))
    def remove_price(self, name: str) -> None:
        with suppress(MeteringError):
            self.meter.remove_price(name, "USD")

    @rule(subject=st.sampled_from(SUBJECTS), name=st.sampled_from(NAMES), amount=st.integers(1, 4))
    def grant(self, subject: str, name: str, amount: int) -> None:
        with suppress(MeteringError):
            self.meter.grant(subject, name, amount, grant_id=self._id("g"))

    @rule(
        subject=st.sampled_from(SUBJECTS),
        name=st.sampled_from(NAMES),
        cost=st.sampled_from([1, 1, 2, 5, 0]),  # a seat's charge costs 1
        user=st.sampled_from(USERS),
        late=st.sampled_from([0, 0, 0, 70]),  # minutes: a late event, in an earlier window
    )
    def consume(self, subject: str, name: str, cost: int, user: str, late: int) -> None:
        event_id = self._id("e")
        at = self.clock() - timedelta(minutes=late)
        try:
            decision = self.meter.consume(
                subject, name, cost, event_id=event_id, metadata={"user": user}, occurred_at=at
            )
        except MeteringError:
            return
        self._consumed(decision, event_id)

    @rule(
        events=st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.lists(
                    st.tuples(st.sampled_from(NAMES), st.sampled_from([1, 2, 0])),
                    min_size=1,
                    max_size=2,
                ),
                st.sampled_from(USERS),
                st.sampled_from([0, 0, 70]),
            ),
            min_size=1,
            max_size=4,
        )
    )
    def apply(self, events: list[tuple[str, list[tuple[str, int]], str, int]]) -> None:
        """A worker's batch: events of one or two charges, some late, on the batch path."""
        batch, ids = [], []
        for subject, charges, user, late in events:
            event_id = self._id("w")
            at = self.clock() - timedelta(minutes=late)
            stacked = [(subject, name, cost) for name, cost in dict(charges).items()]
            try:
                batch.append(make_event(stacked, at, event_id, {"user": user}))
            except MeteringError:
                continue
            ids.append(event_id)
        try:
            decisions = list(self.meter.apply(batch))
        except MeteringError:
            return
        for event_id, decision in zip(ids, decisions, strict=True):
            if not isinstance(decision, Decision):
                continue  # refused in the batch (`invalid="reject"`)
            self._consumed(decision, event_id)

    @rule(
        subject=st.sampled_from(SUBJECTS),
        name=st.sampled_from(NAMES),
        maximum=st.sampled_from([1, 3, 10, None]),
    )
    def entitle(self, subject: str, name: str, maximum: int | None) -> None:
        """A subject's own maximum (None: back to the limit's)."""
        self.ledger.entitled.add((subject, name))
        with suppress(MeteringError):
            self.meter.set_entitlement(subject, name, maximum)

    @rule(subject=st.sampled_from(SUBJECTS), name=st.sampled_from(NAMES), amount=st.integers(1, 3))
    def recurring_grant(self, subject: str, name: str, amount: int) -> None:
        """A top-up issued every hour, the unused part not rolled over."""
        with suppress(MeteringError):
            self.meter.grant(subject, name, amount, grant_id=self._id("rg"), every="1h")

    @rule(subject=st.sampled_from(SUBJECTS), zone=st.sampled_from(["Asia/Kolkata", "UTC"]))
    def time_zone(self, subject: str, zone: str) -> None:
        """Days and months at the subject's midnight, from the end of each current window."""
        with suppress(MeteringError):
            self.meter.set_time_zone(subject, zone)

    @rule(name=st.sampled_from(NAMES))
    def delete_limit(self, name: str) -> None:
        """A limit deleted (its usage stays in the ledger); `set_limit` defines it again."""
        with suppress(MeteringError):
            self.meter.delete_limit(name)
            self.limits.pop(name, None)

    @rule(subject=st.sampled_from(SUBJECTS), user=st.sampled_from(USERS))
    def traffic(self, subject: str, user: str) -> None:
        """A charge on every name, then one event charging two of them together."""
        for name in NAMES:
            self.consume(subject, name, 1, user, 0)
        event_id = self._id("e")
        try:
            decision = self.meter.consume(
                charges=[(subject, "a", 1), (subject, "b", 2)],
                event_id=event_id,
                metadata={"user": user},
            )
        except MeteringError:
            return
        self._consumed(decision, event_id)

    @rule(
        subject=st.sampled_from(SUBJECTS),
        name=st.sampled_from(NAMES),
        cost=st.integers(1, 4),
        user=st.sampled_from(USERS),
        also=st.one_of(st.none(), st.tuples(st.sampled_from(NAMES), st.integers(1, 4))),
    )
    def reserve(
        self, subject: str, name: str, cost: int, user: str, also: tuple[str, int] | None
    ) -> None:
        """A reservation of one charge, or of two stacked (a commit settles
        each at the first's cost plus its ``more``)."""
        event_id = self._id("r")
        charges = [(subject, name, cost)]
        if also is not None and also[0] != name:
            charges.append((subject, *also))
        try:
            held = self.meter.reserve(
                charges=charges, event_id=event_id, ttl_seconds=TTL, metadata={"user": user}
            )
        except MeteringError:
            return
        self._record(held.decision, event_id)
        if held.allowed:
            self.held.append((event_id, cost))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def cancel_reservation(self, data: st.DataObject) -> None:
        event_id, _ = data.draw(st.sampled_from(self.held))
        self._settled(event_id)
        try:
            self.meter.cancel_reservation(event_id)
        except MeteringError:
            return
        self.held.remove((event_id, _))
        self._gone(event_id)
        # A charge whose units all went back takes its money back (`spend_given_back`);
        # so does one a reset dropped from the hold. One whose window ended keeps it.
        info = self.meter.reservation(event_id)
        assert info is not None
        kept = {(c.subject, c.limit) for c in info.charges if info.given_back_of(c) < c.cost}
        bill = self.ledger.bill.get(event_id, {})
        self.ledger.bill[event_id] = {k: v for k, v in bill.items() if (k[0], k[2]) in kept}

    @precondition(lambda self: self.held)
    @rule(data=st.data(), more=st.sampled_from([-1, 0, 2, None, "held"]))
    def commit_reservation(self, data: st.DataObject, more: int | str | None) -> None:
        """A commit in full, or at the first charge's cost and ``more``, or at
        the smallest cost still held (what a reset left: nothing held gives back)."""
        event_id, cost = data.draw(st.sampled_from(self.held))
        info, reserved = self.meter.reservation(event_id), self.meter.result(event_id)
        assert info is not None and reserved is not None
        if isinstance(more, str):
            usage = [c.cost for c in info.charges if not self._spend(c.limit)]
            actual = min(usage, default=0)
        else:
            actual = None if more is None else max(0, cost + more)
        self._settled(event_id)
        # A priced charge a reset dropped from the hold cannot be split: a
        # commit of fewer units than it reserved is refused.
        holds = {(c.subject, c.limit) for c in info.charges}
        unsplit = [
            c.limit
            for c in reserved.charges
            if c.price is not None and (c.subject, c.limit) not in holds
            if actual is not None and actual < c.cost and c.outcome != "would_deny"
            if info.state == "held" and info.expires_at > self.clock()  # (else settled already)
        ]
        try:
            self.meter.commit_reservation(event_id, actual)
        except MeteringError:
            return
        assert not unsplit, (event_id, actual, unsplit)
        after = self.meter.result(event_id)
        assert after is not None
        if actual is not None and info.state == "held" and info.expires_at > self.clock():
            # More than reserved is billed at its real cost, whatever a reset cleared.
            real = {(c.subject, c.limit): c.cost for c in after.charges}
            beyond = [
                (c.subject, c.limit)
                for c in reserved.charges
                if c.outcome in ("allowed", "overage") and not self._spend(c.limit)
                if c.cost < actual
            ]
            assert all(real[pair] == actual for pair in beyond), (event_id, actual, after)
        self.ledger.bill[event_id] = billed(after)  # the money kept
        self.held.remove((event_id, cost))
        if actual == 0:
            self._gone(event_id)
        self.consumed.append(event_id)

    @precondition(lambda self: self.consumed)
    @rule(data=st.data())
    def void(self, data: st.DataObject) -> None:
        event_id = data.draw(st.sampled_from(self.consumed))
        self._settled(event_id)
        try:
            self.meter.void(event_id, "test")
        except MeteringError:
            return
        self._gone(event_id)
        self.ledger.bill[event_id] = {}

    @rule(subject=st.sampled_from(SUBJECTS), name=st.sampled_from(NAMES))
    def reset(self, subject: str, name: str) -> None:
        try:
            self.meter.reset(subject, name)
        except MeteringError:
            return
        self.ledger.resets[(subject, name)] = self.ledger.events
        # A reset forgets the window's usage, "not for billing corrections"
        # (docs/operations.md): its next charge starts a total, and pays the fee again.
        for (of, limit, _), live in self.ledger.fees.items():
            if (of, limit) == (subject, name):
                live.clear()

    @rule(subject=st.sampled_from(SUBJECTS), name=st.sampled_from(NAMES), cost=st.integers(1, 3))
    def checkout(self, subject: str, name: str, cost: int) -> None:
        try:
            taken = self.meter.checkout(subject, name, cost, ttl_seconds=TTL)
        except MeteringError:
            return
        if taken.allowed:
            self.checkouts.append(taken.id)

    @precondition(lambda self: self.checkouts)
    @rule(data=st.data())
    def checkin(self, data: st.DataObject) -> None:
        checkout_id = data.draw(st.sampled_from(self.checkouts))
        try:
            self.meter.checkin(checkout_id)
        except MeteringError:
            return
        self.checkouts.remove(checkout_id)

    @rule(minutes=st.sampled_from([1, 30, 90, 24 * 60]))
    def advance(self, minutes: int) -> None:
        self.clock.advance(minutes=minutes)

    @invariant()
    def time_moves(self) -> None:
        # A real clock moves between two calls; the audit orders a void or a
        # give-back against a reset by time (docs/audit.md), a tie it cannot order.
        self.clock.advance(milliseconds=1)

    def teardown(self) -> None:
        try:
            self.clock.advance(minutes=2)
            self.meter.sweep_reservations()
            report = run_audit(self.meter, full=True)
            left = [v for v in report.violations if not self._exempt(v)]
            assert left == [], left
            # The spend report bills what the answers charged, less voids and what went back.
            expected: dict[Billed, int] = {}
            for bill in self.ledger.bill.values():
                for key, amount in bill.items():
                    expected[key] = expected.get(key, 0) + amount
            found = {
                (row.subject, row.currency, name): amount
                for row in spend_report(self.meter).rows
                for name, amount in row.amounts.items()
            }
            assert {k: v for k, v in found.items() if v} == {k: v for k, v in expected.items() if v}
        finally:
            self.meter.close()
            self.database.hand_back(self.url)

    def _exempt(self, violation: Any) -> bool:
        if violation.invariant not in EXEMPT:
            return False
        key = (violation.subject, violation.limit, violation.window_start_us)
        now = counting(self.limits.get(violation.limit))
        return bool(self.ledger.kinds.get(key, set()) - {now})


SETTINGS = settings(
    max_examples=examples(60),
    stateful_step_count=50,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Databases:
    """A fresh database per example: a copy of the migrated template, handed back after."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.kind = request.param
        self.copies = 0
        self.folder = tmp_path
        if self.kind == "sqlite":
            self.template: Any = request.getfixturevalue("sqlite_template")
        else:
            self.server = request.getfixturevalue("postgres_server")
            self.template = request.getfixturevalue("pg_template_url")

    def take(self) -> str:
        self.copies += 1
        if self.kind == "sqlite":
            return copy_sqlite(self.template, self.folder / f"changes-{self.copies}.db")
        url: str = self.server.url(self.server.take(self.template, "changes"))
        return url

    def hand_back(self, url: str) -> None:
        if self.kind == "postgresql":
            self.server.hand_back(self.template, url.rsplit("/", 1)[-1])


@pytest.fixture(params=["sqlite", "postgresql"], ids=["sqlite", "postgresql"])
def databases(request: pytest.FixtureRequest, tmp_path: Path) -> Databases:
    return Databases(request, tmp_path)


def test_limits_changed_with_state_keep_the_ledger_whole(databases: Databases) -> None:
    run_state_machine_as_test(lambda: LimitChanges(databases), settings=SETTINGS)
