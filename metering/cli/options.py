"""Options and parameter callbacks that several commands share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from typing import Any, Final, TypeVar, cast

import click

from metering.domain.bounds import validate_seconds
from metering.domain.instants import parse_instant
from metering.errors import InvalidInput

F = TypeVar("F", bound=Callable[..., Any])
ChargeTuple = tuple[str, str, int]

# The reports' and the backtest's output, and their progress bar.
FORMAT_OPTION: Final = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="Output on stdout.",
)
PROGRESS_OPTION: Final = click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar on stderr (default: when stderr is a terminal).",
)


def parse_datetime(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> datetime | None:
    """An RFC 3339 time option (`parse_instant`); naive means UTC, a date its midnight."""
    if value is None:
        return None
    try:
        return parse_instant(value, field_name=param.name or "datetime")
    except InvalidInput as exc:
        raise click.BadParameter(exc.message) from None


def parse_seconds(maximum: float) -> Callable[[click.Context, click.Parameter, float], float]:
    """A callback for a number of seconds: finite, from 0 to ``maximum``."""

    def parse(_ctx: click.Context, param: click.Parameter, value: float) -> float:
        try:
            return validate_seconds(param.name or "seconds", value, maximum)
        except InvalidInput as exc:
            raise click.BadParameter(exc.message) from None

    return parse


def parse_charge(value: str) -> ChargeTuple:
    """``SUBJECT:LIMIT:COST``, split from the right (a subject may contain ':')."""
    parts = value.rsplit(":", 2)
    if len(parts) != 3:
        raise click.BadParameter(f"{value!r} is not SUBJECT:LIMIT:COST")
    try:
        cost = int(parts[2])
    except ValueError:
        raise click.BadParameter(f"cost {parts[2]!r} in {value!r} is not a whole number") from None
    return (parts[0], parts[1], cost)


def parse_charges(
    _ctx: click.Context, _param: click.Parameter, values: Sequence[str]
) -> list[ChargeTuple]:
    """The callback of ``--charge``, a repeatable option."""
    return [parse_charge(value) for value in values]


def parse_meta(
    _ctx: click.Context, _param: click.Parameter, values: Sequence[str]
) -> dict[str, str] | None:
    """The callback of ``--meta KEY=VALUE``, a repeatable option: the event's metadata."""
    found: dict[str, str] = {}
    for value in values:
        key, sign, text = value.partition("=")
        if not sign or not key:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE", param_hint="--meta")
        found[key] = text
    return found or None


def chosen_charges(
    subject: str | None, limit: str | None, cost: int | None, charges: Sequence[ChargeTuple]
) -> list[ChargeTuple]:
    """The charges of SUBJECT LIMIT [--cost N], or of the ``--charge`` options."""
    if charges:
        if subject is not None or cost is not None:
            raise click.UsageError("give SUBJECT LIMIT [--cost N], or --charge, not both")
        return list(charges)
    if subject is None or limit is None:
        raise click.UsageError("give SUBJECT and LIMIT, or one or more --charge")
    return [(subject, limit, 1 if cost is None else cost)]


def stacked(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator: ``decorators`` applied as if written in this order above a function."""

    def decorate(func: F) -> F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return decorate


def format_option(func: F) -> F:
    """``--format table|json``."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="Human-readable output or JSON.",
    )(func)


def charge_options(what: str) -> Callable[[F], F]:
    """SUBJECT LIMIT [--cost N], or repeated ``--charge``; ``what`` names the stacked thing."""

    return stacked(
        click.argument("subject", required=False),
        click.argument("limit", required=False),
        click.option("--cost", type=int, help="Cost of SUBJECT LIMIT (default 1)."),
        click.option(
            "--charge",
            "charges",
            metavar="SUBJECT:LIMIT:COST",
            multiple=True,
            callback=parse_charges,
            help=f"A charge of a stacked {what} (all or nothing); repeatable.",
        ),
    )


@dataclass(frozen=True, slots=True)
class EventOptions:
    """What `decision_options` read: the event's charges (`chosen_charges`),
    its time and metadata, and the output format."""

    charges: list[ChargeTuple]
    occurred_at: datetime | None
    metadata: dict[str, str] | None
    fmt: str


def decision_options(func: F) -> F:
    """The charges, ``--at``, ``--meta`` and ``--format`` of consume, check and
    emit, passed to the command as one `EventOptions`, ``event``."""

    @wraps(func)
    def command(
        subject: str | None,
        limit: str | None,
        cost: int | None,
        charges: list[ChargeTuple],
        occurred_at: datetime | None,
        metadata: dict[str, str] | None,
        fmt: str,
        **others: Any,
    ) -> Any:
        chosen = chosen_charges(subject, limit, cost, charges)
        return func(event=EventOptions(chosen, occurred_at, metadata, fmt), **others)

    return cast(
        F,
        stacked(
            charge_options("event"),
            click.option(
                "--at",
                "occurred_at",
                metavar="TIME",
                callback=parse_datetime,
                help="When the usage happened (default now): RFC 3339, naive means UTC.",
            ),
            click.option(
                "--meta",
                "metadata",
                metavar="KEY=VALUE",
                multiple=True,
                callback=parse_meta,
                help="Event metadata (a seat limit counts its key's values); repeatable.",
            ),
            format_option,
        )(command),
    )
