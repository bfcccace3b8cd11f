"""Limits: named policies with a maximum per period.

A `Limit` is a validated value object. Periods are parsed once into a
`Period`, which is either a whole number of seconds or of calendar months
(``1mo`` is a billing month; ``1y`` is twelve months).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from metering.domain.bounds import shown, validate_whole
from metering.domain.breaker import parse_factor, parse_floor, quarantine_cap
from metering.domain.jsonable import fields_dict
from metering.domain.money import format_amount, parse_amount, validate_currency
from metering.domain.pacing import DEFAULT_BURST, Burst, parse_burst
from metering.errors import InvalidLimit

Algorithm = Literal["fixed_window", "token_bucket", "concurrent"]
WindowKind = Literal["first_use", "calendar"]
Enforcement = Literal["hard", "soft", "shadow"]
Aggregation = Literal["sum", "max", "latest"]

ALGORITHMS: Final = ("fixed_window", "token_bucket", "concurrent")
WINDOWS: Final = ("first_use", "calendar")
ENFORCEMENTS: Final = ("hard", "soft", "shadow")
# ``sum``: usage is a flow, the costs add up. ``max`` and ``latest`` make a
# gauge: each event reports a level (`metering.domain.windows.gauge_level`).
AGGREGATIONS: Final = ("sum", "max", "latest")
GAUGES: Final = ("max", "latest")  # a level, not a sum

NAME_PATTERN: Final = re.compile(r"[a-z0-9_.:\-]{1,64}")
# Limits named so belong to the product (the API's own rate limit per key):
# users cannot create, change or delete them (`is_reserved`).
RESERVED_PREFIX: Final = "metering."
MAX_MAXIMUM: Final = 10**15
MAX_PERIOD_SECONDS: Final = 3653 * 86_400  # ten years, leap days included
MAX_PERIOD_MONTHS: Final = 120
MAX_THRESHOLD_PERCENT: Final = 1000
MAX_THRESHOLDS: Final = 16
# Metadata keys a limit records usage by (`metering.domain.rollups`).
DIMENSION_PATTERN: Final = re.compile(r"[a-zA-Z0-9_.\-]{1,64}")
MAX_DIMENSIONS: Final = 4
# Ten years is 315,532,800 s: more significant digits than this are never a period.
MAX_PERIOD_DIGITS: Final = 12
MAX_PERIOD_CHARS: Final = 32
DEFAULT_LATENESS: Final = "1d"

_SECONDS_PER_UNIT: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_PERIOD_PATTERN: Final = re.compile(r"[ \t]*([0-9]+)[ \t]*(s|m|h|d|w|mo|y)[ \t]*")


@dataclass(frozen=True, slots=True)
class Period:
    """A duration: exactly one of ``seconds`` and ``months`` is non-zero."""

    seconds: int = 0
    months: int = 0

    @property
    def is_calendar_months(self) -> bool:
        return self.months > 0

    def __str__(self) -> str:
        if self.months:
            return f"{self.months // 12}y" if self.months % 12 == 0 else f"{self.months}mo"
        for unit in ("w", "d", "h", "m"):
            size = _SECONDS_PER_UNIT[unit]
            if self.seconds % size == 0:
                return f"{self.seconds // size}{unit}"
        return f"{self.seconds}s"


def parse_period(text: str, *, field_name: str = "period") -> Period:
    """Parse ``30s``, ``2m``, ``1h``, ``1d``, ``7d``, ``2w``, ``1mo``, ``1y``."""
    if not isinstance(text, str):
        raise InvalidLimit(field_name, f"expected a string like '2m' or '1mo', got {shown(text)}")
    match = _PERIOD_PATTERN.fullmatch(text)
    if match is None:
        raise InvalidLimit(
            field_name, f"{shown(text)} is not a period; use a number and s, m, h, d, w, mo or y"
        )
    digits, unit = match.group(1).lstrip("0"), match.group(2)
    if len(digits) > MAX_PERIOD_DIGITS:
        # int() of thousands of digits is slow, and refused beyond 4,300.
        raise InvalidLimit(field_name, f"{shown(text)} is longer than 10 years")
    if len(text) > MAX_PERIOD_CHARS:  # it is stored as given
        raise InvalidLimit(
            field_name, f"{shown(text)} is longer than {MAX_PERIOD_CHARS} characters"
        )
    amount = int(digits or "0")
    if amount <= 0:
        raise InvalidLimit(field_name, f"{shown(text)} must be longer than zero")
    if unit in ("mo", "y"):
        months = amount * (12 if unit == "y" else 1)
        if months > MAX_PERIOD_MONTHS:
            raise InvalidLimit(field_name, f"{shown(text)} is longer than 10 years")
        return Period(months=months)
    seconds = amount * _SECONDS_PER_UNIT[unit]
    if seconds > MAX_PERIOD_SECONDS:
        raise InvalidLimit(field_name, f"{shown(text)} is longer than 10 years")
    return Period(seconds=seconds)


def validate_limit_name(name: object) -> str:
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise InvalidLimit("name", f"{shown(name)} must be 1 to 64 of a-z 0-9 _ . : -")
    return name


def is_reserved(name: str) -> bool:
    """Whether ``name`` is one of the product's own limits (``metering.*``)."""
    return name.startswith(RESERVED_PREFIX)


def _positive_int(field_name: str, value: object, ceiling: int) -> int:
    return validate_whole(field_name, value, 1, ceiling, error=InvalidLimit)


def _choice(field_name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidLimit(field_name, f"must be one of {', '.join(choices)}; got {shown(value)}")
    return str(value)


# `Limit.to_dict`'s keys, in order (then the money of a priced limit, and ``distinct``).
LIMIT_KEYS: Final = (
    "name",
    "maximum",
    "period",
    "algorithm",
    "window",
    "enforcement",
    "thresholds",
    "lateness",
    "thresholds_units",
    "dimensions",
    "aggregation",
)


@dataclass(frozen=True, slots=True)
class Limit:
    """A named policy: at most ``maximum`` per ``period``.

    >>> Limit("send_message", maximum=5, period="2m")
    >>> Limit("api", maximum=10, period="10s", algorithm="token_bucket")
    >>> Limit("seats", maximum=1000, period="1mo", window="calendar", enforcement="soft",
    ...       thresholds=(80, 100), thresholds_units=(900,))
    >>> Limit("api_calls", maximum=10_000, period="1d", dimensions=("route", "model"))
    >>> Limit("cad", maximum=5, algorithm="concurrent")
    >>> Limit("seats", maximum=5, period="1mo", window="calendar", distinct="user")

    ``enforcement="shadow"`` decides like ``hard`` and records what a hard
    limit would have denied (``would_deny``), but never denies: a way to try
    a limit on live traffic before enforcing it. ``thresholds`` are
    percentages of the maximum, ``thresholds_units`` absolute amounts of
    usage; each notifies once per window. ``currency`` makes it a spend
    limit: its maximum and usage are integers of the currency's minor unit,
    charged by the priced charges of its subjects (`metering.domain.money`). ``dimensions`` are the
    event-metadata keys whose values the limit's usage is rolled up by, hour
    by hour (``metering report usage --group-by``). ``window`` is a fixed
    window's (a token bucket has none: ``window="calendar"`` with one is
    refused, not ignored). ``distinct`` makes a fixed window count the
    distinct values of that metadata key (seats, monthly active users; see
    `metering.domain.distinct`); a token bucket has no window to count them
    in, so ``distinct`` with one is refused.

    ``aggregation="max"`` or ``"latest"`` makes a gauge: an event's cost is
    the level it reports (storage held, nodes running; 0 is a level too),
    and ``used`` is the window's peak (``max``) or its last allowed level by
    event time (``latest``), not a sum. A hard gauge denies a level above
    the maximum; a soft one bills ``used - maximum``. A gauge is a fixed
    window with no grants, seats, price or reservation: those add up usage,
    and are refused (`_check_gauge`).

    ``algorithm="concurrent"`` is a floating license (`metering.licenses`):
    at most ``maximum`` units held at once, checked out and in, with no
    period, no window and nothing that happens once per window (hard
    enforcement only; no thresholds, no dimensions).

    Validation happens here, so a `Limit` that exists is a valid one.
    """

    name: str
    maximum: int
    period: str = ""
    algorithm: Algorithm = "fixed_window"
    window: WindowKind = "first_use"
    enforcement: Enforcement = "hard"
    thresholds: tuple[int, ...] = ()
    lateness: str = DEFAULT_LATENESS
    thresholds_units: tuple[int, ...] = ()
    dimensions: tuple[str, ...] = ()
    currency: str | None = None
    distinct: str | None = None
    aggregation: Aggregation = "sum"
    pacing: bool = False
    burst: Burst | None = None
    # How long before a forecast exhaustion ``limit.forecast`` goes out
    # (docs/forecasts.md); None: never.
    forecast_lead: str | None = None
    # The runaway breaker (docs/breaker.md): a factor like ``"10x"``, a floor
    # for the baseline (units per second) and the quarantine maximum; None: no breaker.
    breaker: str | None = None
    breaker_floor: float | None = None
    quarantine_max: int | None = None
    parsed_period: Period = field(init=False, repr=False, compare=False)
    lateness_seconds: int = field(init=False, repr=False, compare=False)
    forecast_lead_seconds: int | None = field(init=False, repr=False, compare=False)
    breaker_factor: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_limit_name(self.name)
        _positive_int("maximum", self.maximum, MAX_MAXIMUM)
        _choice("algorithm", self.algorithm, ALGORITHMS)
        if self.algorithm == "concurrent":
            _check_concurrent(self)
            parsed = Period()
        elif self.period in ("", None):
            raise InvalidLimit("period", "is required (only a concurrent limit has none)")
        else:
            parsed = parse_period(self.period)
        _choice("window", self.window, WINDOWS)
        _choice("enforcement", self.enforcement, ENFORCEMENTS)
        if self.algorithm == "token_bucket" and parsed.is_calendar_months:
            raise InvalidLimit("period", "a token bucket refills over seconds, not months")
        if self.algorithm == "token_bucket" and self.enforcement == "soft":
            raise InvalidLimit("enforcement", "a token bucket is hard or shadow, never soft")
        if self.algorithm == "token_bucket" and self.window != "first_use":
            raise InvalidLimit(
                "window", "a token bucket has no windows; window calendar is for fixed_window"
            )
        if self.currency is not None:
            if self.algorithm != "fixed_window":
                raise InvalidLimit("currency", "a spend limit is a fixed window, not a bucket")
            object.__setattr__(self, "currency", validate_currency(self.currency))
        if self.distinct is not None:
            _distinct_key(self.distinct)
            if self.algorithm == "token_bucket":
                raise InvalidLimit(
                    "distinct", "a token bucket has no windows to count distinct values in"
                )
            if self.algorithm == "concurrent":
                raise InvalidLimit("distinct", "a concurrent limit holds licenses, not seats")
            if self.currency is not None:
                raise InvalidLimit("distinct", "a spend limit counts money, not distinct values")
        _choice("aggregation", self.aggregation, AGGREGATIONS)
        if self.aggregation != "sum":
            _check_gauge(self)
        object.__setattr__(self, "burst", _paced(self))
        thresholds = _thresholds(self.thresholds)
        units = _thresholds(self.thresholds_units, "thresholds_units", MAX_MAXIMUM)
        lateness = parse_period(self.lateness, field_name="lateness")
        if lateness.is_calendar_months:
            raise InvalidLimit("lateness", "use seconds, minutes, hours or days")
        object.__setattr__(self, "period", str(self.period or "").strip())
        object.__setattr__(self, "thresholds", thresholds)
        object.__setattr__(self, "thresholds_units", units)
        object.__setattr__(self, "dimensions", _dimensions(self.dimensions))
        object.__setattr__(self, "parsed_period", parsed)
        object.__setattr__(self, "lateness_seconds", lateness.seconds)
        lead = _forecast_lead(self)
        object.__setattr__(self, "forecast_lead", None if lead is None else lead[0])
        object.__setattr__(self, "forecast_lead_seconds", None if lead is None else lead[1])
        _check_breaker(self)

    def quarantined(self) -> Limit:
        """This limit (with the maximum in force) as it holds a quarantined
        subject: its maximum the quarantine's, enforced as hard (a shadow
        limit stays shadow), unpaced."""
        assert self.breaker_factor is not None, "a limit without a breaker"
        cap = quarantine_cap(self.maximum, self.breaker_factor, self.quarantine_max)
        enforcement: Enforcement = "shadow" if self.enforcement == "shadow" else "hard"
        return replace(
            self,
            maximum=cap,
            enforcement=enforcement,
            pacing=False,
            burst=None,
            breaker=None,
            breaker_floor=None,
            quarantine_max=None,
        )

    def with_maximum(self, maximum: int) -> Limit:
        """This limit with another maximum: a subject's entitlement."""
        return self if maximum == self.maximum else replace(self, maximum=maximum)

    @property
    def window_maximum(self) -> int | None:
        """What a window holds by default, as usage pages and history show it;
        None for a token bucket, which has no windows."""
        return None if self.algorithm == "token_bucket" else self.maximum

    @property
    def is_gauge(self) -> bool:
        """Whether an event reports a level (``max``, ``latest``) rather than adds a cost."""
        return self.aggregation != "sum"

    @property
    def period_seconds(self) -> int:
        """The period in seconds; 0 for calendar months (see `parsed_period`)."""
        return self.parsed_period.seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            **fields_dict(self, LIMIT_KEYS),
            **(_money(self.maximum, self.currency) if self.currency else {}),
            "distinct": self.distinct,
            **({"pacing": True, "burst": self.burst} if self.pacing else {}),
            **({"forecast_lead": self.forecast_lead} if self.forecast_lead else {}),
            **(_breaker_dict(self) if self.breaker else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, name: str | None = None) -> Limit:
        """Build a limit from a mapping (a row, or an entry of a limits file)."""
        known = {"name", "maximum", "period", "algorithm", "window", "enforcement"}
        known |= {"thresholds", "lateness", "thresholds_units", "dimensions", "currency"}
        known |= {"max_amount", "distinct", "aggregation", "pacing", "burst", "forecast_lead"}
        known |= {"breaker", "breaker_floor", "quarantine_max"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidLimit(unknown[0], f"unknown field; expected some of {sorted(known)}")
        values = dict(data)
        if name is not None:
            values.setdefault("name", name)
        if "max_amount" in values:
            amount = values.pop("max_amount")
            if values.get("currency") is None:
                raise InvalidLimit("currency", "a spend limit (max_amount) needs a currency")
            values["maximum"] = parse_amount(
                amount, validate_currency(values["currency"]), field_name="max_amount"
            )
        required_fields: tuple[str, ...] = ("name", "maximum")
        if values.get("algorithm") != "concurrent":
            required_fields += ("period",)
        for required in required_fields:
            if required not in values:
                raise InvalidLimit(required, "is required")
        for listed in ("thresholds", "thresholds_units"):
            found = values.get(listed) or ()
            if not isinstance(found, list | tuple):
                noun = "percentages" if listed == "thresholds" else "amounts of usage"
                raise InvalidLimit(listed, f"must be a list of {noun}, got {shown(found)}")
            values[listed] = tuple(found)
        if "dimensions" in values:
            values["dimensions"] = _dimension_list(values["dimensions"])
        return cls(**values)


def _forecast_lead(limit: Limit) -> tuple[str, int] | None:
    """A forecast lead as text and seconds (a duration of seconds to weeks,
    more than 0), on a windowed limit; None when there is none."""
    if limit.forecast_lead is None:
        return None
    lead = parse_period(limit.forecast_lead, field_name="forecast_lead")
    if lead.is_calendar_months or lead.seconds <= 0:
        raise InvalidLimit("forecast_lead", "use seconds, minutes, hours, days or weeks, above 0")
    if limit.algorithm != "fixed_window" or limit.is_gauge:
        raise InvalidLimit(
            "forecast_lead", "only a fixed window that adds costs up runs out before its reset"
        )
    return str(lead), lead.seconds


def _check_breaker(limit: Limit) -> None:
    """A breaker's factor, floor and quarantine maximum, normalised; only a
    fixed window that adds costs up has one (its quarantine holds a window)."""
    if limit.breaker is None:
        object.__setattr__(limit, "breaker_factor", None)
        if limit.breaker_floor is not None or limit.quarantine_max is not None:
            field_name = "breaker_floor" if limit.breaker_floor is not None else "quarantine_max"
            raise InvalidLimit(field_name, "only a limit with a breaker has one: add breaker")
        return
    factor = parse_factor(limit.breaker)
    if limit.algorithm != "fixed_window" or limit.is_gauge:
        raise InvalidLimit("breaker", "only a fixed window that adds costs up has a breaker")
    if limit.breaker_floor is not None:
        object.__setattr__(limit, "breaker_floor", parse_floor(limit.breaker_floor))
    quarantine_cap(limit.maximum, factor, limit.quarantine_max)
    object.__setattr__(limit, "breaker", f"{factor}x")
    object.__setattr__(limit, "breaker_factor", factor)


def _breaker_dict(limit: Limit) -> dict[str, Any]:
    return {
        "breaker": limit.breaker,
        "breaker_floor": limit.breaker_floor,
        "quarantine_max": limit.quarantine_max,
    }


def _check_concurrent(limit: Limit) -> None:
    """A concurrent limit has none of what belongs to a window: say so, do not ignore it."""
    if limit.period not in ("", None):
        raise InvalidLimit(
            "period", "a concurrent limit has no period: licenses are held, not spent"
        )
    if limit.window != "first_use":
        raise InvalidLimit("window", "a concurrent limit has no windows")
    if limit.enforcement != "hard":
        raise InvalidLimit(
            "enforcement", "a concurrent limit is hard: never more held than its maximum"
        )
    if limit.thresholds or limit.thresholds_units:
        raise InvalidLimit(
            "thresholds", "a concurrent limit has no thresholds (they fire per window)"
        )
    if limit.dimensions:
        raise InvalidLimit("dimensions", "a concurrent limit records no usage to roll up")


def _check_gauge(limit: Limit) -> None:
    """A gauge reports levels in fixed windows: what adds usage up is refused, not ignored."""
    if limit.algorithm != "fixed_window":
        raise InvalidLimit("aggregation", "a gauge is a fixed window, not a bucket or licenses")
    if limit.distinct is not None:
        raise InvalidLimit("aggregation", "a gauge reports a level; seats (distinct) count values")
    if limit.currency is not None:
        raise InvalidLimit("aggregation", "a spend limit adds money up; a gauge reports a level")
    if limit.dimensions:
        raise InvalidLimit("dimensions", "a gauge's levels do not add up by dimension")


def _paced(limit: Limit) -> Burst | None:
    """A paced limit's burst (the default if none is given); None when not paced."""
    if not isinstance(limit.pacing, bool):
        raise InvalidLimit("pacing", f"must be true or false, got {shown(limit.pacing)}")
    if not limit.pacing:
        if limit.burst is not None:
            raise InvalidLimit("burst", "only a paced limit has a burst: add pacing")
        return None
    if limit.algorithm != "fixed_window":
        raise InvalidLimit("pacing", "a bucket refills at its own pace; licenses are held")
    if limit.is_gauge:
        raise InvalidLimit("pacing", "a gauge reports a level, which is not spent over time")
    return parse_burst(DEFAULT_BURST if limit.burst is None else limit.burst, limit.maximum)


def _money(maximum: int, currency: str) -> dict[str, str]:
    return {"currency": currency, "max_amount": format_amount(maximum, currency)}


def _thresholds(
    values: Iterable[object],
    field_name: str = "thresholds",
    ceiling: int = MAX_THRESHOLD_PERCENT,
) -> tuple[int, ...]:
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        noun = "percentages" if field_name == "thresholds" else "amounts of usage"
        raise InvalidLimit(field_name, f"must be a list of {noun}")
    listed = list(values)
    if len(listed) > MAX_THRESHOLDS:
        raise InvalidLimit(field_name, f"at most {MAX_THRESHOLDS}, got {len(listed)}")
    checked = {_positive_int(field_name, v, ceiling) for v in listed}
    return tuple(sorted(checked))


def _distinct_key(value: object) -> str:
    if not isinstance(value, str) or DIMENSION_PATTERN.fullmatch(value) is None:
        raise InvalidLimit("distinct", f"{shown(value)} must be 1 to 64 of a-z A-Z 0-9 _ . -")
    return value


def _dimension_list(values: object) -> tuple[object, ...]:
    if not isinstance(values, list | tuple):
        raise InvalidLimit("dimensions", f"must be a list of metadata keys, got {shown(values)}")
    return tuple(values)


def _dimensions(values: object) -> tuple[str, ...]:
    """At most `MAX_DIMENSIONS` distinct keys, in the order given (a key named
    twice is kept once: it would only record the same usage twice)."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidLimit("dimensions", "must be a list of metadata keys")
    keys: list[str] = []
    for value in values:
        if not isinstance(value, str) or DIMENSION_PATTERN.fullmatch(value) is None:
            raise InvalidLimit("dimensions", f"{shown(value)} must be 1 to 64 of a-z A-Z 0-9 _ . -")
        if value not in keys:
            keys.append(value)
        if len(keys) > MAX_DIMENSIONS:
            raise InvalidLimit("dimensions", f"at most {MAX_DIMENSIONS} keys")
    return tuple(keys)


def spend_limit(
    name: str,
    max_amount: object,
    currency: str,
    period: str,
    **options: Any,
) -> Limit:
    """A spend limit: at most ``max_amount`` (major units: ``"50"``, ``"1.00"``) of
    ``currency`` per ``period``, held as minor units (`metering.domain.money`).

    >>> spend_limit("spend", "50", "USD", "1mo", window="calendar").maximum
    5000
    """
    code = validate_currency(currency)
    maximum = parse_amount(max_amount, code, field_name="max_amount")
    if maximum < 1:
        raise InvalidLimit("max_amount", f"must be more than 0 {code}")
    return Limit(name, maximum=maximum, period=period, currency=code, **options)
