"""``metering alerts set|list|remove``: one subject's own threshold notifications.

``metering alerts set org-42 api_calls --at 80% --at 5000`` replaces the
limit's thresholds for org-42 alone: ``limit.threshold`` fires at 80% of
its maximum and at 5000 units, once per window each.
"""

from __future__ import annotations

import json
from typing import Final

import click

from metering.allowances import Alert
from metering.cli.context import SentenceGroup, current_meter
from metering.cli.entitlements import limit_argument, listing_filters
from metering.cli.options import format_option
from metering.cli.output import echo_listing, when

ALERT_COLUMNS: Final = ("subject", "limit", "at", "updated")


def describe_alert(alert: Alert) -> str:
    return f"{alert.subject} {alert.limit}: thresholds at {', '.join(alert.at)}"


@click.group(cls=SentenceGroup)
def alerts() -> None:
    """One subject's own thresholds for a limit (limit.threshold notifications)."""


@alerts.command("set")
@click.argument("subject")
@limit_argument
@click.option(
    "--at",
    "at",
    multiple=True,
    required=True,
    metavar="P%|N",
    help="A percentage of the maximum (80%) or an amount (5000); repeat it.",
)
@format_option
def alerts_set(subject: str, limit: str, at: tuple[str, ...], fmt: str) -> None:
    """Replace LIMIT's thresholds for SUBJECT."""
    alert = current_meter().set_alert(subject, limit, at)
    if fmt == "json":
        click.echo(json.dumps(alert.to_dict(), indent=2))
    else:
        click.echo(f"set {describe_alert(alert)}")


@alerts.command("list")
@listing_filters
def alerts_list(subject: str | None, limit: str | None, fmt: str) -> None:
    """Subjects with thresholds of their own."""
    found = current_meter().alerts(subject, limit)
    echo_listing(found, fmt, "no alerts", ALERT_COLUMNS, _alert_row)


def _alert_row(alert: Alert) -> list[object]:
    return [alert.subject, alert.limit, ", ".join(alert.at), when(alert.updated_at)]


@alerts.command("remove")
@click.argument("subject")
@limit_argument
def alerts_remove(subject: str, limit: str) -> None:
    """SUBJECT back to LIMIT's own thresholds."""
    if current_meter().remove_alert(subject, limit):
        click.echo(f"removed {subject} {limit}: the limit's thresholds apply")
    else:
        click.echo(f"{subject} {limit} had no thresholds of its own; nothing changed")
