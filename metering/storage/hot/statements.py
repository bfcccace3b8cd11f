"""The statements both hot stores run alike, written once.

They differ only in the driver's placeholder (psycopg's ``%s``, sqlite3's
``?``), written ``{0}`` here; `Statements.of` fills it in once, when a
store's module is imported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from metering.domain.distinct import SeatKey
from metering.storage.rates import created_rate, positional_rate_set, positional_rate_values
from metering.storage.reservations import INSERT_HELD, SELECT_RESERVATION, SETTLE
from metering.storage.results import RESET_TICK, ResultRecord

VERSION: Final = "SELECT version FROM limits_version WHERE id = 1"

# The results' columns in `ResultRecord`'s order, which `record_from_row` reads
# and `result_row` writes.
RESULT_COLUMNS: Final = ", ".join(ResultRecord._fields)

# The rate's placeholders come first (`metering.storage.rates`): `counter_update`.
_UPDATE_COUNTER: Final = """
UPDATE counters SET {1},
                    used = {0}, denied_count = {0}, denied_cost = {0}, first_denied_at_us = {0},
                    tat_us = {0}, tat_rem = {0}, tat_scale = {0}, updated_at_us = {0},
                    granted = granted + {0}
WHERE limit_name = {0} AND subject = {0} AND window_start_us = {0}
"""
# A new counter's rate and billing month are values (`counter_insert`).
_INSERT_COUNTER: Final = """
INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used, denied_count,
                      denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale, updated_at_us,
                      rate, rate_at_us, billing_month, granted)
VALUES ({0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0})
"""
_INSERT_RESULT: Final = f"""
INSERT INTO results ({RESULT_COLUMNS}, reset_tick)
VALUES ({{0}}, {{0}}, {{0}}, {{0}}, {{0}}, {{0}}, {{0}}, {{0}}, {{0}}, {RESET_TICK})
"""

# Live events added to a seat value (`metering.storage.distinct`): the first makes its row.
_ADD_SEAT: Final = """
INSERT INTO distinct_values (subject, limit_name, window_start_us, value, live_events)
VALUES ({0}, {0}, {0}, {0}, {0})
ON CONFLICT (subject, limit_name, window_start_us, value)
DO UPDATE SET live_events = distinct_values.live_events + excluded.live_events
"""
# A seat value's live events, when it has a row.
_SELECT_SEAT: Final = """
SELECT live_events FROM distinct_values
WHERE subject = {0} AND limit_name = {0} AND window_start_us = {0} AND value = {0}
"""


@dataclass(frozen=True, slots=True)
class Statements:
    """The shared statements with one driver's placeholder."""

    # A `counter_update` row.
    update_counter: str
    # A `counter_insert` row.
    insert_counter: str
    # A `metering.storage.results.result_row`.
    insert_result: str
    # A `metering.storage.reservations.HoldRow`.
    insert_hold: str
    # One reservation's row by id, for `metering.storage.reservations.record_of_row`.
    select_reservation: str
    # A `metering.storage.reservations.SettleRow`.
    settle_reservation: str
    # A row of `seat_rows`.
    add_seat: str
    # A seat value's subject, limit, window start and value.
    select_seat: str

    @classmethod
    def of(cls, placeholder: str) -> Statements:
        return cls(
            *(
                template.format(placeholder, positional_rate_set(placeholder))
                for template in (
                    _UPDATE_COUNTER,
                    _INSERT_COUNTER,
                    _INSERT_RESULT,
                    INSERT_HELD,
                    SELECT_RESERVATION,
                    SETTLE,
                    _ADD_SEAT,
                    _SELECT_SEAT,
                )
            )
        )


def seat_rows(added: Mapping[SeatKey, int]) -> list[tuple[str, str, int, str, int]]:
    """``added`` as `Statements.add_seat` rows, in the key order of
    `metering.storage.distinct.DistinctStore.add` (subject first)."""
    return sorted(
        (subject, name, start, value, n) for (name, subject, start, value), n in added.items()
    )


def counter_update(
    key: Sequence[Any], state: Sequence[Any], now_us: int, granted: int = 0
) -> tuple[Any, ...]:
    """A `Statements.update_counter` row: the counter's ``key`` (limit, subject,
    window start) takes ``state`` (``used`` first) at ``now_us``, and what its
    window drew on grants grows by ``granted``."""
    return (*positional_rate_values(state[0], now_us), *state, now_us, granted, *key)


def counter_insert(
    key: Sequence[Any],
    end_us: int,
    state: Sequence[Any],
    now_us: int,
    month: str | None,
    granted: int = 0,
) -> tuple[Any, ...]:
    """A `Statements.insert_counter` row; ``month`` is the window's billing
    month, ``granted`` what the window drew on grants."""
    return (*key, end_us, *state, now_us, created_rate(state[0]), now_us, month, granted)
