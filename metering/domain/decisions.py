"""Decisions: the verdict on an event, charge by charge.

`decide_event` is the single place where the rules of SPEC's fixed windows,
token buckets, soft enforcement and atomic stacking meet. It is pure: it
takes the counters as read (under lock) and returns the decision together
with the counters to write back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final, Literal, TypeVar

from metering.domain.buckets import evaluate_bucket
from metering.domain.grants import Pot
from metering.domain.instants import from_us, to_us
from metering.domain.jsonable import fields_dict
from metering.domain.limits import Limit
from metering.domain.money import format_amount
from metering.domain.state import NO_WINDOW, CounterKey, CounterState, Evaluation, Outcome
from metering.domain.windows import evaluate_window

EventOutcome = Literal["allowed", "denied", "overage", "rejected"]


# `ChargeDecision.to_dict`'s keys, in order (then its grants, price and overdraft).
CHARGE_KEYS: Final = (
    "subject",
    "limit",
    "cost",
    "allowed",
    "outcome",
    "used",
    "remaining",
    "maximum",
    "overage",
    "window_start",
    "resets_at",
    "retry_at",
)
# `Decision.to_dict`'s keys, in order.
DECISION_KEYS: Final = (
    "event_id",
    "outcome",
    "allowed",
    "denied_by",
    "reason",
    "occurred_at",
    "decided_at",
    "charges",
    "would_deny",
)


@dataclass(frozen=True, slots=True)
class ChargeDecision:
    """One charge's verdict.

    ``allowed`` says whether the charge fit. When another charge of the same
    event was denied nothing was consumed, so ``used`` and ``remaining`` are
    then the figures before the event. Instants are kept as microseconds
    (``*_us``) and offered as aware datetimes (``resets_at`` ...).

    ``maximum`` is the subject's own (its entitlement at the event's time,
    else the limit's). ``grants`` lists the grants that paid for the charge,
    as (grant id, amount). A shadow limit's charge is always ``allowed``;
    its outcome ``would_deny`` says a hard limit would have denied it.
    ``price`` is a priced charge's (currency, amount in minor units), rounded
    on its own (`metering.domain.money.charge_amount`). ``overdraft`` is set
    only by a commit of more than was reserved
    (`metering.domain.reservations.charge_more`): the units of the real
    usage that a hard limit had no room for, recorded and billed anyway.
    """

    subject: str
    limit: str
    cost: int
    allowed: bool
    outcome: Outcome
    used: int
    remaining: int
    maximum: int
    overage: int
    window_start_us: int | None
    resets_at_us: int
    retry_at_us: int | None
    grants: tuple[tuple[str, int], ...] = ()
    price: tuple[str, int] | None = None
    overdraft: int = 0

    @property
    def window_start(self) -> datetime | None:
        return _moment(self.window_start_us)

    @property
    def resets_at(self) -> datetime:
        return from_us(self.resets_at_us)

    @property
    def retry_at(self) -> datetime | None:
        return _moment(self.retry_at_us)

    def to_dict(self) -> dict[str, Any]:
        return {
            **fields_dict(self, CHARGE_KEYS),
            "grants": [{"grant_id": g, "amount": a} for g, a in self.grants],
            **(_priced(self.price) if self.price else {}),
            **({"overdraft": self.overdraft} if self.overdraft else {}),
        }

    def to_row(self) -> list[Any]:
        """A compact, JSON-ready form for the results ledger: the grant draws
        (only when some paid, or something follows), then the price as
        [currency, amount] (when priced, or something follows: else null),
        then the overdraft (only when there is one)."""
        row = [
            self.subject,
            self.limit,
            self.cost,
            self.allowed,
            self.outcome,
            self.used,
            self.remaining,
            self.maximum,
            self.overage,
            self.window_start_us,
            self.resets_at_us,
            self.retry_at_us,
        ]
        if self.grants or self.price or self.overdraft:
            row.append([list(draw) for draw in self.grants])
        if self.price or self.overdraft:
            row.append(list(self.price) if self.price else None)
        if self.overdraft:
            row.append(self.overdraft)
        return row

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ChargeDecision:
        size = len(row)
        if size > ROW_FIELDS:  # a priced charge's, or one grants paid
            drawn = row[ROW_FIELDS]
            if not drawn:
                grants: tuple[tuple[str, int], ...] = ()
            elif len(drawn) == 1:  # (most: one grant paid)
                grant_id, amount = drawn[0]
                grants = ((str(grant_id), int(amount)),)
            else:
                grants = tuple((str(g), int(a)) for g, a in drawn)
            if size == ROW_FIELDS + 1 and cls is ChargeDecision:  # (most: no price)
                return _make_charge(*row[:ROW_FIELDS], grants, None, 0)
            price = None
            if size > ROW_FIELDS + 1 and row[ROW_FIELDS + 1] is not None:
                price = (str(row[ROW_FIELDS + 1][0]), int(row[ROW_FIELDS + 1][1]))
            overdraft = int(row[ROW_FIELDS + 2]) if size > ROW_FIELDS + 2 else 0
            if cls is ChargeDecision:
                return _make_charge(*row[:ROW_FIELDS], grants, price, overdraft)
            return cls(*row[:ROW_FIELDS], grants, price, overdraft)  # type: ignore[call-arg]
        if cls is ChargeDecision:  # most rows: no grants, price or overdraft
            return _make_charge(*row, (), None, 0)
        return cls(*row)


# A ledger row's fields before the optional list of grant draws (and the
# optional overdraft after it).
ROW_FIELDS: Final = 12


def _priced(price: tuple[str, int]) -> dict[str, Any]:
    currency, amount = price
    return {"currency": currency, "amount": format_amount(amount, currency)}


T = TypeVar("T")


def positional(cls: type[T]) -> Callable[..., T]:
    """``cls(*values)``, every field given in order, for a frozen, slotted
    dataclass whose ``__init__`` only sets its fields: the slots are set
    through their descriptors, where the generated ``__init__`` calls
    ``object.__setattr__`` per field at about twice the cost (a batch's
    answers make thousands: `metering.engine.reference.decision_of`)."""
    found = fields(cls)  # type: ignore[arg-type]
    assert not hasattr(cls, "__post_init__") and all(f.init for f in found), cls
    names = [f.name for f in found]
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    scope.update((f"set_{name}", getattr(cls, name).__set__) for name in names)
    body = "".join(f"    set_{name}(self, {name})\n" for name in names)
    exec(f"def make({', '.join(names)}):\n    self = new(cls)\n{body}    return self\n", scope)
    made: Callable[..., T] = scope["make"]
    return made


_make_charge: Final = positional(ChargeDecision)


def _moment(us: int | None) -> datetime | None:
    return from_us(us) if us is not None else None


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on one usage event, as returned by `consume` and stored as its result.

    ``allowed`` is the verdict for the whole event (every hard charge fit);
    ``charges`` holds each charge's own decision and ``denied_by`` the limits
    that denied it. ``duplicate`` is true when the event id had already been
    decided and this is the stored result. The single-charge figures
    (``used``, ``remaining``, ``resets_at`` ...) describe the charge that
    decided the verdict: the first denying charge, else the first charge.
    """

    event_id: str | None
    outcome: EventOutcome
    charges: tuple[ChargeDecision, ...]
    occurred_at: datetime
    decided_at: datetime
    denied_by: tuple[str, ...] = ()
    duplicate: bool = False
    reason: str | None = None
    metadata: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def allowed(self) -> bool:
        return self.outcome in ("allowed", "overage")

    @property
    def would_deny(self) -> tuple[str, ...]:
        """The shadow limits that would have denied this event, had they been hard."""
        return tuple(c.limit for c in self.charges if c.outcome == "would_deny")

    @property
    def _main(self) -> ChargeDecision | None:
        for charge in self.charges:
            if not charge.allowed:
                return charge
        return self.charges[0] if self.charges else None

    @property
    def used(self) -> int | None:
        main = self._main
        return main.used if main else None

    @property
    def remaining(self) -> int | None:
        return min((c.remaining for c in self.charges), default=None)

    @property
    def maximum(self) -> int | None:
        main = self._main
        return main.maximum if main else None

    @property
    def resets_at(self) -> datetime | None:
        main = self._main
        return main.resets_at if main else None

    @property
    def retry_at(self) -> datetime | None:
        """When the denied charges would all fit again; None if allowed or never."""
        denied = [c for c in self.charges if not c.allowed]
        if not denied or any(c.retry_at is None for c in denied):
            return None
        return max(c.retry_at for c in denied if c.retry_at is not None)

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self, DECISION_KEYS)


# `Decision(...)` with every field in order (`positional`).
make_decision: Final = positional(Decision)


@dataclass(frozen=True, slots=True)
class ChargeInput:
    """One charge with what `decide_event` needs: its limit, counter and state.

    ``limit`` carries the subject's own maximum (`Limit.with_maximum`);
    ``pot`` the subject's grants for a fixed window, if it has any;
    ``price`` a priced charge's (currency, amount in minor units).
    """

    limit: Limit
    key: CounterKey
    state: CounterState
    cost: int
    pot: Pot | None = None
    price: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class EventVerdict:
    """`decide_event`'s answer: the outcome, each charge's decision, states to write."""

    outcome: Literal["allowed", "denied", "overage"]
    charges: tuple[ChargeDecision, ...]
    denied_by: tuple[str, ...]
    new_states: tuple[CounterState, ...]


def evaluate_charge(charge: ChargeInput, now_us: int) -> Evaluation:
    if charge.limit.algorithm == "token_bucket":
        return evaluate_bucket(charge.limit, charge.state, charge.cost, now_us)
    window = (charge.key.window_start_us, charge.key.window_end_us)
    return evaluate_window(charge.limit, charge.state, charge.cost, window, now_us, charge.pot)


def decide_event(charges: Sequence[ChargeInput], now_us: int) -> EventVerdict:
    """Decide an event atomically: every hard charge must fit, or none consumes.

    ``now_us`` is the event's time (``occurred_at``): windows and refills are
    judged at the moment the usage happened, not when it was processed.
    """
    evaluations = [evaluate_charge(c, now_us) for c in charges]
    denied_by = tuple(
        c.limit.name
        for c, e in zip(charges, evaluations, strict=True)
        if not e.fits and c.limit.enforcement != "shadow"
    )
    decisions: list[ChargeDecision] = []
    states: list[CounterState] = []
    for charge, evaluation in zip(charges, evaluations, strict=True):
        if denied_by or not evaluation.fits:  # a shadow's would-deny consumes nothing
            state = charge.state if evaluation.fits else evaluation.denied
            decisions.append(_charge_decision(charge, evaluation, consumed=False))
        else:
            state = evaluation.applied
            decisions.append(_charge_decision(charge, evaluation, consumed=True))
            if charge.pot is not None and evaluation.draws:
                charge.pot.take(charge.key.window_start_us, evaluation.draws)
        states.append(state)
    outcome: Literal["allowed", "denied", "overage"] = "denied" if denied_by else "allowed"
    if not denied_by and any(d.outcome == "overage" for d in decisions):
        outcome = "overage"
    return EventVerdict(outcome, tuple(decisions), denied_by, tuple(states))


def _charge_decision(charge: ChargeInput, ev: Evaluation, *, consumed: bool) -> ChargeDecision:
    limit = charge.limit
    outcome: Outcome
    if not ev.fits and limit.enforcement == "shadow":
        outcome = "would_deny"
    elif not ev.fits:
        outcome = "denied"
    elif consumed and ev.overage_after > 0:
        outcome = "overage"
    elif consumed and ev.ahead_of_pace:
        outcome = "ahead_of_pace"
    else:
        outcome = "allowed"
    start = charge.key.window_start_us
    window_start = None if limit.algorithm == "token_bucket" and start == NO_WINDOW else start
    return ChargeDecision(
        subject=charge.key.subject,
        limit=limit.name,
        cost=charge.cost,
        allowed=ev.fits or limit.enforcement == "shadow",
        outcome=outcome,
        used=ev.used_after if consumed else ev.used_before,
        remaining=ev.remaining_after if consumed else ev.remaining_before,
        maximum=limit.maximum,
        overage=ev.overage_after if consumed else ev.overage_before,
        window_start_us=window_start,
        resets_at_us=ev.resets_at_us if consumed else ev.resets_at_before_us,
        retry_at_us=ev.retry_at_us,
        grants=ev.draws if consumed else (),
        price=charge.price if consumed else None,
    )


__all__ = [
    "ChargeDecision",
    "ChargeInput",
    "Decision",
    "EventVerdict",
    "decide_event",
    "evaluate_charge",
    "from_us",
    "make_decision",
    "positional",
    "to_us",
]
