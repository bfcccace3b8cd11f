"""What each kind of limit refuses to take part in, and the words that name it.

A limit's kind (a spend limit, seats, a floating license, a gauge, a token
bucket, a shadow limit) follows from its fields; what it refuses (a price,
a tiered price, a grant, a hold, a checkout) is declared once, in `KINDS`.
Services call `refuse` before they write, a limit is not changed into a kind
that refuses what it has (`refusing`), and an older price prices none of its
late events (`prices_taken`). `kind_phrases` names a kind on the command
line; `sums_usage` says whether its counters add charges up. A new kind adds
its line here and its rule in the domain; the services do not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from metering.domain.limits import Limit
from metering.domain.money import Price, PriceHistory
from metering.errors import InvalidInput, WrongAlgorithm

Use = Literal["price", "tiered price", "grant", "hold", "checkout"]


@dataclass(frozen=True)
class Kind:
    """A kind of limit: ``label`` names it in errors (``'x' is a gauge: ...``),
    ``made_by`` is the field that makes a limit one, ``of`` tells whether a
    limit is one, ``refused`` says why each use it refuses is refused (the
    field the error names, and why); a use in ``by_algorithm`` is refused
    as `WrongAlgorithm`."""

    label: str
    made_by: str
    of: Callable[[Limit], bool]
    refused: dict[Use, tuple[str, str]]
    by_algorithm: frozenset[Use] = frozenset()


# In the order they are asked; the first kind that refuses a use is the error.
KINDS: Final = (
    Kind(
        "a spend limit",
        "currency",
        lambda limit: limit.currency is not None,
        {"price": ("limit", "it has a cap, not a price")},
    ),
    Kind(
        "a seat limit",
        "distinct",
        lambda limit: limit.distinct is not None,
        {
            # A repeat costs 0, so it is not priced per unit; a seat is taken by consuming.
            "price": ("limit", "only usage summed per window is priced"),
            "hold": ("limit", "a seat is taken by consuming: consume it, do not reserve it"),
        },
    ),
    Kind(
        "a concurrent limit",
        "algorithm",
        lambda limit: limit.algorithm == "concurrent",
        {
            # A license is held, not spent.
            "price": ("limit", "only usage summed per window is priced"),
            "grant": (
                "limit",
                "grants top up fixed windows; give a subject more licenses by an entitlement",
            ),
        },
        frozenset({"grant"}),
    ),
    Kind(
        "a gauge",
        "aggregation",
        lambda limit: limit.is_gauge,
        {
            "price": ("limit", "its level is not usage summed per window, not priced"),
            "grant": ("limit", "it reports a level, grants top up usage that adds up"),
            "hold": ("limit", "it reports a level, there is no cost to hold"),
        },
    ),
    Kind(
        "a token bucket",
        "algorithm",
        lambda limit: limit.algorithm == "token_bucket",
        {
            "tiered price": ("model", "tiers and a flat fee price a fixed window's total"),
            "grant": ("limit", "grants top up fixed windows"),
        },
    ),
    Kind(
        "a shadow limit",
        "enforcement",
        lambda limit: limit.enforcement == "shadow",
        {
            # Its would-deny consumes nothing: priced, a spend cap would count what it bills not.
            "price": (
                "limit",
                "it bills nothing; price the limit that meters the usage and charge this "
                "one beside it",
            ),
        },
    ),
)


def refuse(limit: Limit, use: Use) -> None:
    """Raise `InvalidInput` when ``limit``'s kind refuses ``use``
    (`WrongAlgorithm` when its algorithm is the reason: a floating license
    given a grant, any other limit checked out); nothing when it takes it."""
    if use == "checkout":
        if limit.algorithm != "concurrent":
            more = "only a concurrent limit is checked out; consume this one"
            raise WrongAlgorithm(limit.name, limit.algorithm, more)
        return
    kind = refusing(limit, use)
    if kind is not None:
        field, why = kind.refused[use]
        if use in kind.by_algorithm:
            raise WrongAlgorithm(limit.name, limit.algorithm, why)
        raise InvalidInput(field, f"{limit.name!r} is {kind.label}: {why}")


def refusing(limit: Limit, use: Use) -> Kind | None:
    """The first of ``limit``'s kinds that refuses ``use`` (not a checkout); None: none does."""
    return next((kind for kind in KINDS if use in kind.refused and kind.of(limit)), None)


def prices_taken(limit: Limit | None, history: PriceHistory) -> PriceHistory:
    """The prices of ``history`` that price ``limit``'s charges. A price set
    before the limit was made a kind that refuses it (in force at a late
    event's time) prices none: none on a kind that refuses a price, and a
    tiered price or a flat fee is no price on one that refuses those."""
    if limit is None:  # deleted: as it was
        return history
    if refusing(limit, "price") is not None:
        return ()
    if refusing(limit, "tiered price") is None:
        return history
    return tuple(
        # In force from its date as a removal is: no price.
        Price(price.limit, price.currency, None, price.effective_from_us, price.created_at_us)
        if price.counted
        else price
        for price in history
    )


def kind_phrases(limit: Limit) -> list[str]:
    """What sets ``limit`` apart from a plain limit of its algorithm and
    window, a phrase each: the values it counts, its gauge, its pace."""
    phrases = []
    if limit.distinct is not None:
        phrases.append(f"distinct {limit.distinct}")
    if limit.is_gauge:
        phrases.append(f"gauge {limit.aggregation}")
    if limit.pacing:
        phrases.append(f"paced burst {limit.burst}")
    return phrases


def sums_usage(limit: Limit) -> bool:
    """Whether ``limit``'s counters add its charges up: a gauge holds a level
    and a floating license its checkouts, which the audit does not sum."""
    return not limit.is_gauge and limit.algorithm != "concurrent"
