"""A model of floating licenses against random checkout, checkin, renew,
expiry (the clock moving), sweep and entitlement streams, on both databases.

The model is written from docs/licenses.md, not from the code: a subject
holds the costs of its checkouts that are neither checked in nor past their
expiry; a checkout fits when held + cost <= the subject's maximum now; a
checkin gives a held, unexpired checkout's cost back once and 0 after; a
renew moves a held, unexpired checkout's expiry to max(expiry, now + ttl)
and is refused otherwise, as a repeated checkout id is once its checkout
has ended (it answers the checkout while held); the sweep marks each
expired held checkout released once. After every step the stored
checkouts, and the listings by state, must be the model's, and no subject
ever holds more than its maximum.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from budgets import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite

from metering import FrozenClock, Limit, Meter
from metering.domain.instants import to_us
from metering.errors import CheckoutReleased

START = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
DEFAULT = 3
SUBJECTS = ["s1", "s2"]

operation = st.one_of(
    st.tuples(
        st.just("checkout"),
        st.sampled_from(SUBJECTS),
        st.integers(1, 3),
        st.sampled_from([300, 900, 1800]),
    ),
    st.tuples(st.just("checkout"), st.sampled_from(SUBJECTS), st.just(1), st.just(900)),
    st.tuples(st.just("repeat"), st.integers(0, 40), st.just(0), st.just(0)),
    st.tuples(st.just("checkin"), st.integers(0, 40), st.just(0), st.just(0)),
    st.tuples(st.just("renew"), st.integers(0, 40), st.sampled_from([None, 300, 1200]), st.just(0)),
    st.tuples(st.just("advance"), st.sampled_from([1, 299, 300, 600, 901]), st.just(0), st.just(0)),
    st.tuples(st.just("sweep"), st.just(0), st.just(0), st.just(0)),
    st.tuples(
        st.just("entitle"),
        st.sampled_from(SUBJECTS),
        st.one_of(st.none(), st.integers(1, 5)),
        st.just(0),
    ),
)


@dataclass
class Held:
    subject: str
    cost: int
    ttl: int
    expires: int
    released_by: str | None = None


class Model:
    def __init__(self) -> None:
        self.checkouts: dict[str, Held] = {}
        self.maximum: dict[str, int] = {}

    def held(self, subject: str, now: int) -> int:
        return sum(
            c.cost
            for c in self.checkouts.values()
            if c.subject == subject and c.released_by is None and c.expires > now
        )

    def state(self, checkout_id: str, now: int) -> tuple[str, str | None]:
        found = self.checkouts[checkout_id]
        if found.released_by is None and found.expires <= now:
            return "released", "expiry"
        return ("held", None) if found.released_by is None else ("released", found.released_by)


def _run(url: str, operations: list[tuple[object, ...]]) -> None:
    clock = FrozenClock(START)
    model = Model()
    ids: list[str] = []
    with Meter(url, clock=clock) as meter:
        meter.set_limit(Limit("cad", maximum=DEFAULT, algorithm="concurrent"))
        for step, (kind, a, b, c) in enumerate(operations):
            now = to_us(clock())
            if kind == "checkout":
                assert isinstance(a, str) and isinstance(b, int) and isinstance(c, int)
                maximum = model.maximum.get(a, DEFAULT)
                fits = model.held(a, now) + b <= maximum
                found = meter.checkout(a, "cad", b, ttl_seconds=c, checkout_id=f"c{step}")
                assert (found.allowed, found.maximum) == (fits, maximum)
                if fits:
                    model.checkouts[found.id] = Held(a, b, c * 10**6, now + c * 10**6)
                    ids.append(found.id)
                assert found.held == model.held(a, now)
                # Never past the maximum by a checkout; after a downgrade the
                # licences held before may be more, and a denial says so.
                assert found.held is not None
                assert found.held <= maximum or not found.allowed
            elif kind == "repeat" and ids:
                checkout_id = ids[int(a) % len(ids)]  # type: ignore[call-overload]
                held = model.checkouts[checkout_id]
                state, released_by = model.state(checkout_id, now)
                if state == "held":
                    again = meter.checkout(held.subject, "cad", held.cost, checkout_id=checkout_id)
                    assert (again.state, again.allowed) == ("held", True)
                else:
                    with pytest.raises(CheckoutReleased) as ended:
                        meter.checkout(held.subject, "cad", held.cost, checkout_id=checkout_id)
                    assert ended.value.released_by == released_by
            elif kind == "checkin" and ids:
                checkout_id = ids[int(a) % len(ids)]  # type: ignore[call-overload]
                held = model.checkouts[checkout_id]
                live = held.released_by is None and held.expires > now
                assert meter.checkin(checkout_id) == (held.cost if live else 0)
                if held.released_by is None:
                    held.released_by = "checkin" if live else "expiry"
            elif kind == "renew" and ids:
                checkout_id = ids[int(a) % len(ids)]  # type: ignore[call-overload]
                held = model.checkouts[checkout_id]
                if held.released_by is None and held.expires > now:
                    held.ttl = held.ttl if b is None else int(b) * 10**6  # type: ignore[call-overload]
                    held.expires = max(held.expires, now + held.ttl)
                    assert to_us(meter.renew(checkout_id, b).expires_at) == held.expires  # type: ignore[arg-type]
                else:
                    with pytest.raises(CheckoutReleased):
                        meter.renew(checkout_id, b)  # type: ignore[arg-type]
            elif kind == "advance":
                clock.advance(seconds=int(a))  # type: ignore[call-overload]
            elif kind == "sweep":
                due = [
                    c
                    for c in model.checkouts.values()
                    if c.released_by is None and c.expires <= now
                ]
                for held in due:
                    held.released_by = "expiry"
                assert meter.sweep_reservations()["released"] == len(due)
            elif kind == "entitle":
                assert isinstance(a, str)
                if b is None:
                    model.maximum.pop(a, None)
                else:
                    model.maximum[a] = int(b)  # type: ignore[call-overload]
                meter.set_entitlement(a, "cad", b, effective_from=clock())  # type: ignore[arg-type]
            _compare(meter, model, to_us(clock()))


def _compare(meter: Meter, model: Model, now: int) -> None:
    stored = {c.id: (c.state, c.released_by) for c in meter.checkouts(count=1000)}
    assert stored == {i: model.state(i, now) for i in model.checkouts}
    for subject in SUBJECTS:
        held = sum(c.cost for c in meter.checkouts(subject, state="held", count=1000))
        assert held == model.held(subject, now)
    for state in ("held", "released"):
        listed = {c.id for c in meter.checkouts(state=state, count=1000)}
        assert listed == {i for i in model.checkouts if model.state(i, now)[0] == state}


SETTINGS = settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(operations=st.lists(operation, min_size=1, max_size=35))
def test_sqlite_matches_the_model(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path, operations: list
) -> None:
    directory = tmp_path_factory.mktemp("licenses")
    _run(copy_sqlite(sqlite_template, directory / "model.db"), operations)


@pytest.mark.postgres
@settings(SETTINGS, max_examples=examples(25))
@given(operations=st.lists(operation, min_size=1, max_size=35))
def test_postgresql_matches_the_model(
    postgres_server: PostgresServer, pg_template_url: str, operations: list
) -> None:
    with postgres_server.copy_of(pg_template_url, "licenses") as url:
        _run(url, operations)
