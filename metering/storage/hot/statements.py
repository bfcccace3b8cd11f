"""The statements both hot stores run alike, written once.

They differ only in the driver's placeholder (psycopg's ``%s``, sqlite3's
``?``), written ``{0}`` here; `Statements.of` fills it in once, when a
store's module is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from metering.storage.reservations import INSERT_HELD, SELECT_RESERVATION, SETTLE
from metering.storage.results import RESET_TICK, ResultRecord

VERSION: Final = "SELECT version FROM limits_version WHERE id = 1"
# A recurring grant's issue made on the hot path (as `BUMP_LIMITS_VERSION`).
BUMP_VERSION: Final = "UPDATE limits_version SET version = version + 1 WHERE id = 1"

# The results' columns in `ResultRecord`'s order, which `record_from_row` reads
# and `result_row` writes.
RESULT_COLUMNS: Final = ", ".join(ResultRecord._fields)

_UPDATE_COUNTER: Final = """
UPDATE counters SET used = {0}, denied_count = {0}, denied_cost = {0}, first_denied_at_us = {0},
                    tat_us = {0}, tat_rem = {0}, tat_scale = {0}, updated_at_us = {0}
WHERE limit_name = {0} AND subject = {0} AND window_start_us = {0}
"""
_INSERT_COUNTER: Final = """
INSERT INTO counters (limit_name, subject, window_start_us, window_end_us, used, denied_count,
                      denied_cost, first_denied_at_us, tat_us, tat_rem, tat_scale, updated_at_us)
VALUES ({0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, {0})
"""
_INSERT_RESULT: Final = f"""
INSERT INTO results ({RESULT_COLUMNS}, reset_tick)
VALUES ({{0}}, {{0}}, {{0}}, {{0}}, {{0}}, {{0}}, {{0}}, {{0}}, {{0}}, {RESET_TICK})
"""


@dataclass(frozen=True, slots=True)
class Statements:
    """The shared statements with one driver's placeholder."""

    # A counter's state, then its update time, then its key.
    update_counter: str
    # A counter's key, window end, state and update time.
    insert_counter: str
    # A `metering.storage.results.result_row`.
    insert_result: str
    # A `metering.storage.reservations.HoldRow`.
    insert_hold: str
    # One reservation's row by id, for `metering.storage.reservations.record_of_row`.
    select_reservation: str
    # A `metering.storage.reservations.SettleRow`.
    settle_reservation: str

    @classmethod
    def of(cls, placeholder: str) -> Statements:
        return cls(
            *(
                template.format(placeholder)
                for template in (
                    _UPDATE_COUNTER,
                    _INSERT_COUNTER,
                    _INSERT_RESULT,
                    INSERT_HELD,
                    SELECT_RESERVATION,
                    SETTLE,
                )
            )
        )
