"""What deciding a batch needs (`domain/needs.py`): a limit's rule, a subject's
allowances and the way a batch is applied each add their own needs, and
nothing else."""

from __future__ import annotations

import pytest

from metering.domain.limits import Limit, spend_limit
from metering.domain.needs import (
    EVERY,
    NONE,
    UNHELD,
    Need,
    batch_needs,
    rule_needs,
    subject_needs,
)


def test_a_plain_limit_needs_nothing() -> None:
    assert rule_needs(Limit("calls", maximum=10, period="1h"), priced=False) == NONE
    bucket = Limit("api", maximum=10, period="1s", algorithm="token_bucket")
    assert rule_needs(bucket, priced=False) == NONE


@pytest.mark.parametrize(
    ("limit", "needs"),
    [
        (Limit("seats", maximum=5, period="1d", distinct="user"), {Need.SEATS}),
        (Limit("disk", maximum=5, period="1h", aggregation="max"), {Need.GAUGE}),
        (Limit("calls", maximum=5, period="1h", pacing=True), {Need.PACING}),
        (Limit("calls", maximum=5, period="1h", dimensions=("route",)), {Need.DIMENSIONS}),
        (spend_limit("spend", "50", "USD", "1d"), {Need.MONEY}),
        (
            Limit("calls", maximum=5, period="1d", distinct="user", dimensions=("route",)),
            {Need.SEATS, Need.DIMENSIONS},
        ),
    ],
)
def test_a_limit_needs_what_its_rule_uses(limit: Limit, needs: set[Need]) -> None:
    assert rule_needs(limit, priced=False) == needs


def test_a_price_on_a_limit_needs_money() -> None:
    assert rule_needs(Limit("calls", maximum=5, period="1h"), priced=True) == {Need.MONEY}


def test_only_a_first_use_window_of_calendar_months_needs_month_first_use() -> None:
    first_use = Limit("calls", maximum=5, period="1mo")
    assert rule_needs(first_use, priced=False) == {Need.MONTH_FIRST_USE}
    assert rule_needs(Limit("calls", maximum=5, period="2y"), priced=False) == {
        Need.MONTH_FIRST_USE
    }
    calendar = Limit("calls", maximum=5, period="1mo", window="calendar")
    assert rule_needs(calendar, priced=False) == NONE
    assert rule_needs(Limit("calls", maximum=5, period="30d"), priced=False) == NONE


def test_a_subjects_allowances_need_one_each() -> None:
    none = {"entitled": False, "granted": False, "recurring": False, "thresholds": False}
    assert subject_needs(**none) == NONE
    for flag, need in (
        ("entitled", Need.ENTITLEMENTS),
        ("granted", Need.GRANTS),
        ("recurring", Need.RECURRING),
        ("thresholds", Need.OWN_THRESHOLDS),
    ):
        assert subject_needs(**{**none, flag: True}) == {need}
    assert len(subject_needs(entitled=True, granted=True, recurring=True, thresholds=True)) == 4


def test_one_event_applied_alone_needs_only_what_its_charges_need() -> None:
    charged = frozenset({Need.GRANTS})
    plain = {"held": False, "imported": False, "dead_letters": False}
    assert batch_needs(1, charged=charged, **plain) == charged
    assert batch_needs(0, charged=NONE, **plain) == NONE
    assert batch_needs(2, charged=charged, **plain) == {Need.GRANTS, Need.BATCH}


def test_a_batch_adds_how_it_is_applied() -> None:
    assert batch_needs(1, held=False, imported=True, dead_letters=True, charged=NONE) == {
        Need.IMPORT_FLAGS,
        Need.DEAD_LETTERS,
    }
    assert batch_needs(1, held=True, imported=False, dead_letters=False, charged=NONE) == {
        Need.RESERVATION
    }


def test_a_held_seat_or_gauge_is_named_so_a_path_can_refuse_it() -> None:
    held = {"held": True, "imported": False, "dead_letters": False}
    assert batch_needs(1, charged=frozenset({Need.SEATS}), **held) == {
        Need.SEATS,
        Need.RESERVATION,
        Need.HELD_SEATS,
    }
    assert batch_needs(1, charged=frozenset({Need.GAUGE}), **held) == {
        Need.GAUGE,
        Need.RESERVATION,
        Need.HELD_GAUGE,
    }
    unheld = {**held, "held": False}
    assert Need.HELD_SEATS not in batch_needs(1, charged=frozenset({Need.SEATS}), **unheld)


def test_every_is_every_need_and_a_need_is_its_text() -> None:
    assert frozenset(Need) == EVERY and not NONE
    assert Need("early_first_use") is Need.EARLY_FIRST_USE
    assert str(Need.MONEY) == "money"


def test_a_batch_with_no_hold_import_nor_dead_letters_needs_only_unheld_needs() -> None:
    """Whatever its charges need (a rule's, a subject's, and what
    `Allowances.charged` adds), such a batch needs nothing outside `UNHELD`:
    a first path that implements it is asked without working them out."""
    limits = [
        Limit("a", maximum=5, period="1mo", distinct="user", dimensions=("route",), pacing=True),
        Limit("b", maximum=5, period="1h", breaker="10x", forecast_lead="1h"),
        Limit("c", maximum=5, period="1h", aggregation="max"),
        spend_limit("spend", "50", "USD", "1d"),
    ]
    charged = set().union(*(rule_needs(limit, priced=True) for limit in limits))
    charged |= subject_needs(entitled=True, granted=True, recurring=True, thresholds=True)
    charged |= {Need.INVALID, Need.REPEATED_COUNTER, Need.TIME_ZONE}
    unheld = {"held": False, "imported": False, "dead_letters": False}
    for events in (1, 2):
        assert batch_needs(events, charged=frozenset(charged), **unheld) <= UNHELD
    assert not UNHELD & {Need.RESERVATION, Need.IMPORT_FLAGS, Need.DEAD_LETTERS}
