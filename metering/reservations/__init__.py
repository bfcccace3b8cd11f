"""Reservations: consume now, give back later if the usage did not happen.

`handle` is what `Meter.reserve` returns (`Reservation`) and what operators
list (`ReservationInfo`); `transactions` holds their transactions (reserve,
lease, cancel, commit); `admin` is what `Meter` calls: open, settle, look
up, list and sweep.
"""

from metering.reservations.handle import Reservation, ReservationInfo, Settler

__all__ = ["Reservation", "ReservationInfo", "Settler"]
