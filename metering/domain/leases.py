"""Quota leases: how many units a process may hold for a hot key, for how long, and what a
request served from them is told (pure rules; docs/middleware.md).

A hot (subject, limit) may be decided from a *block* of units leased in one reservation
(`metering.reservations.leases`); the database counts the whole block as used at once, so
processes never over-grant (a killed one under-grants). `block_units`: a cold key leases
nothing (``cost``: the exact path); a key is hot after `HOT_STREAK` requests each within
`HOT_SECONDS` of the last (`streak_after`, `is_hot`); a hot key leases twice its previous
block, at most a quarter of what is ``left`` and `MAX_BLOCK_UNITS`; a block no larger than
``cost`` is none: a window's last units take the exact path. Instants: microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.limits import Limit

HOT_SECONDS: Final = 1.0
"""Requests this close together make a streak; a lease idle this long is settled."""
HOT_STREAK: Final = 8
"""Requests in a streak that make a key hot."""
LEASE_SECONDS: Final = 10.0
"""A lease's time to live (its reservation's), never past its window's end:
what a process killed holding it keeps from others, at most."""
SERVE_SECONDS: Final = 4.0
"""How long a lease serves requests; then it is settled, well before it
expires (a settlement that came after would find it committed in full)."""
SETTLE_MARGIN_SECONDS: Final = 1.0
"""A lease stops serving at least this long before it expires: its unused
units go back while the window is still current."""
MAX_BLOCK_UNITS: Final = 1 << 14
"""The largest block, whatever is left of the window."""

HOT_US: Final = round(HOT_SECONDS * 1_000_000)
LEASE_US: Final = round(LEASE_SECONDS * 1_000_000)
SERVE_US: Final = round(SERVE_SECONDS * 1_000_000)
SETTLE_MARGIN_US: Final = round(SETTLE_MARGIN_SECONDS * 1_000_000)


def leasable(limit: Limit) -> bool:
    """Whether a limit's units can be leased: hard fixed windows only, not gauges.

    A token bucket refills continuously (a held token would be one the
    bucket refills meanwhile), a soft limit allows past its maximum, a
    shadow one never denies and a gauge's reports are levels, not units to
    hold: for those the exact path decides every request.
    """
    return limit.algorithm == "fixed_window" and limit.enforcement == "hard" and not limit.is_gauge


def recent(last_seen_us: int | None, now_us: int) -> bool:
    """Whether a request at ``now_us`` continues a streak last seen at ``last_seen_us``."""
    return last_seen_us is not None and 0 <= now_us - last_seen_us < HOT_US


def streak_after(streak: int, last_seen_us: int | None, now_us: int) -> int:
    """A key's streak once it has a request at ``now_us``."""
    return streak + 1 if recent(last_seen_us, now_us) else 1


def is_hot(streak: int) -> bool:
    """Whether a key with this streak (counting the request at hand) is hot."""
    return streak >= HOT_STREAK


def block_units(used_before: int, hot: bool, left: int, cost: int) -> int:
    """Units to lease for a request of ``cost``; ``cost`` itself means no block.

    ``used_before``: the units the key's previous block handed out, held
    units given back included (``cost`` after the exact path): its demand;
    ``left``: what its window had left when last seen.
    """
    if not hot:
        return cost
    block = min(max(2 * used_before, cost), left // 4, MAX_BLOCK_UNITS)
    return block if block > cost else cost


def lease_times(now_us: int, window_end_us: int) -> tuple[int, int] | None:
    """(expires_at_us, serve_until_us) of a lease taken at ``now_us``, or None
    when its window has too little time left to lease in it.

    The lease expires `LEASE_SECONDS` from now, or when its window ends if
    sooner; it serves for `SERVE_SECONDS`, and stops at least
    `SETTLE_MARGIN_SECONDS` before it expires, so that its settlement gives
    the unused units back to a window still current (after its expiry the
    sweeper commits it in full).
    """
    expires_at_us = min(now_us + LEASE_US, window_end_us)
    serve_until_us = min(now_us + SERVE_US, expires_at_us - SETTLE_MARGIN_US)
    if serve_until_us <= now_us:
        return None
    return expires_at_us, serve_until_us


@dataclass(frozen=True, slots=True)
class Block:
    """A leased block as the database decided it: its charge's figures
    (``used`` and ``remaining`` count the whole block as used) and its id."""

    lease_id: str
    units: int
    charge: ChargeDecision
    serve_until_us: int


def served_charge(block: Block, cost: int, unused: int) -> ChargeDecision:
    """The charge decision of a request of ``cost`` served from ``block``,
    ``unused`` units of which are left after it.

    The database counted the whole block as used; the units this process
    still holds are this key's to use, so they count as remaining. What
    other processes hold counts as used (as of when the block was leased),
    as the exact path would count it.
    """
    charge = block.charge
    return ChargeDecision(
        subject=charge.subject,
        limit=charge.limit,
        cost=cost,
        allowed=True,
        outcome="allowed",
        used=charge.used - unused,
        remaining=charge.remaining + unused,
        maximum=charge.maximum,
        overage=0,
        window_start_us=charge.window_start_us,
        resets_at_us=charge.resets_at_us,
        retry_at_us=None,
    )


def served_decision(block: Block, cost: int, unused: int, now: datetime) -> Decision:
    """The `Decision` of a request served from ``block`` (see `served_charge`).

    It has no event of its own: its ``event_id`` is the lease's, the ledger's
    record of the block it was served from.
    """
    return Decision(
        event_id=block.lease_id,
        outcome="allowed",
        charges=(served_charge(block, cost, unused),),
        occurred_at=now,
        decided_at=now,
    )
