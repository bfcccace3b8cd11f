"""Floating licenses: a concurrent limit's units, checked out and checked in.

`service` is what `Meter` calls (checkout, checkin, renew, look up, list);
the rules are `metering.domain.licenses`, the rows `metering.storage.checkouts`.
Expired checkouts are marked released by the reservations' sweep
(`metering.reservations.admin.sweep`), though they stop counting at their
expiry whether or not it has run.
"""

from metering.licenses.service import Checkout

__all__ = ["Checkout"]
