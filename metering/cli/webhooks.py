"""``metering webhooks``: endpoints, deliveries, replays and test pings.

Secrets are printed only by ``add`` and ``rotate``, once; listings show them
masked. They are stored encrypted under ``METERING_SECRET_KEY``
(`metering.webhooks.encryption`); without it ``add`` and ``rotate`` warn that
they are stored in plaintext.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Final

import click

from metering.cli.context import CliError, SentenceGroup, current_meter
from metering.cli.options import format_option, parse_datetime
from metering.cli.output import echo_listing, when_us
from metering.cli.tables import print_table, table
from metering.domain.bounds import MAX_LISTING, MAX_ROW_ID
from metering.domain.instants import from_us
from metering.domain.notifications import MESSAGE_TYPES
from metering.storage.webhooks import AttemptRecord, DeliveryRecord
from metering.webhooks.encryption import generate_key
from metering.webhooks.endpoints import STATUSES, Endpoint, Webhooks

PLAINTEXT_WARNING: Final = (
    "warning: METERING_SECRET_KEY is not set: the secret is stored in plaintext "
    "(`metering webhooks keygen` makes a key; `metering webhooks reencrypt` then encrypts)"
)
ENDPOINT_COLUMNS: Final = ("id", "url", "types", "state", "secret", "stored")
DELIVERY_COLUMNS: Final = (
    "id",
    "type",
    "endpoint",
    "status",
    "attempts",
    "last result",
    "next attempt",
)


def _hooks() -> Webhooks:
    return Webhooks(current_meter())


def _print(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print_table(table(columns, rows, numeric=()))


@click.group(cls=SentenceGroup)
def webhooks() -> None:
    """Webhook endpoints and deliveries (limit.denied, .threshold, .exceeded, .reset)."""


@webhooks.command("add")
@click.argument("url")
@click.option("--secret", help="whsec_ + base64; generated when not given.")
@click.option(
    "--types",
    "types",
    multiple=True,
    type=click.Choice(MESSAGE_TYPES),
    help="Message types to send (repeat; default: every type).",
)
def add(url: str, secret: str | None, types: tuple[str, ...]) -> None:
    """Add an endpoint; prints its id and secret (the secret is not shown again)."""
    hooks = _hooks()
    endpoint, full_secret = hooks.add(url, secret=secret, types=types)
    click.echo(f"added {endpoint.id} {endpoint.url}")
    click.echo(f"secret {full_secret}  (store it now: it is not shown again)")
    if not hooks.encrypts_secrets:
        click.echo(PLAINTEXT_WARNING, err=True)
    refused = hooks.destination_warning(url)
    if refused is not None:
        click.echo(f"warning: {refused}", err=True)


def _endpoint_row(endpoint: Endpoint) -> list[object]:
    state = "enabled" if endpoint.enabled else f"disabled ({endpoint.disabled_reason})"
    types = ", ".join(endpoint.types) or "all"
    stored = "encrypted" if endpoint.secret_encrypted else "plaintext"
    return [endpoint.id, endpoint.url, types, state, endpoint.secret_masked, stored]


@webhooks.command("list")
@format_option
def list_endpoints(fmt: str) -> None:
    """List endpoints (secrets masked)."""
    found = _hooks().endpoints()
    echo_listing(found, fmt, "no webhook endpoints", ENDPOINT_COLUMNS, _endpoint_row, numeric=())


@webhooks.command("remove")
@click.argument("endpoint_id")
def remove(endpoint_id: str) -> None:
    """Remove an endpoint with its deliveries."""
    _hooks().remove(endpoint_id)
    click.echo(f"removed {endpoint_id}")


@webhooks.command("disable")
@click.argument("endpoint_id")
def disable(endpoint_id: str) -> None:
    """Stop sending to an endpoint; its pending deliveries wait."""
    _hooks().set_enabled(endpoint_id, False)
    click.echo(f"disabled {endpoint_id}")


@webhooks.command("enable")
@click.argument("endpoint_id")
def enable(endpoint_id: str) -> None:
    """Send to an endpoint again (waiting deliveries go out)."""
    _hooks().set_enabled(endpoint_id, True)
    click.echo(f"enabled {endpoint_id}")


@webhooks.command("rotate")
@click.argument("endpoint_id")
@click.option("--secret", help="The new secret; generated when not given.")
@click.option("--grace", type=float, help="Seconds the old secret still signs (default 86400).")
def rotate(endpoint_id: str, secret: str | None, grace: float | None) -> None:
    """Give an endpoint a new secret; both sign during the grace period."""
    hooks = _hooks()
    new_secret = hooks.rotate(endpoint_id, secret=secret, grace_seconds=grace)
    click.echo(f"rotated {endpoint_id}")
    click.echo(f"secret {new_secret}  (store it now: it is not shown again)")
    if not hooks.encrypts_secrets:
        click.echo(PLAINTEXT_WARNING, err=True)


@webhooks.command("reencrypt")
def reencrypt() -> None:
    """Store every secret under the first key of METERING_SECRET_KEY.

    Key rotation: set METERING_SECRET_KEY=NEW,OLD, run this, then remove OLD.
    Plaintext secrets (stored without a key) are encrypted too.
    """
    changed = _hooks().reencrypt()
    noun = "endpoint" if changed == 1 else "endpoints"
    click.echo(f"{changed} {noun} re-encrypted under the first key of METERING_SECRET_KEY")


@webhooks.command("keygen")
def keygen() -> None:
    """Print a new key for METERING_SECRET_KEY (it touches no database)."""
    click.echo(generate_key())


def _delivery_json(record: DeliveryRecord, attempts: Sequence[AttemptRecord]) -> dict[str, object]:
    return {
        "id": record.id,
        "message_id": record.message_id,
        "type": record.message_type,
        "endpoint_id": record.endpoint_id,
        "status": record.status,
        "attempts": record.attempts,
        "last_status_code": record.last_status_code,
        "last_error": record.last_error,
        "next_attempt_at": from_us(record.next_attempt_at_us).isoformat()
        if record.next_attempt_at_us is not None and record.status == "pending"
        else None,
        "created_at": from_us(record.created_at_us).isoformat(),
        "attempt_log": [
            {
                "attempt": a.attempt,
                "at": from_us(a.attempted_at_us).isoformat(),
                "status_code": a.status_code,
                "duration_ms": a.duration_ms,
                "error": a.error,
            }
            for a in attempts
        ],
    }


def _delivery_row(record: DeliveryRecord) -> list[object]:
    last_code = f"HTTP {record.last_status_code}" if record.last_status_code else None
    pending = record.status == "pending"
    return [
        record.id,
        record.message_type,
        record.endpoint_id,
        record.status,
        record.attempts,
        record.last_error or last_code,
        when_us(record.next_attempt_at_us) if pending else None,
    ]


@webhooks.command("deliveries")
@click.option("--status", type=click.Choice(STATUSES), help="Only deliveries in this state.")
@click.option("--endpoint", "endpoint_id", help="Only deliveries to this endpoint.")
@click.option(
    "--last",
    type=click.IntRange(1, MAX_LISTING),
    default=50,
    show_default=True,
    help="How many to show.",
)
@format_option
def deliveries(status: str | None, endpoint_id: str | None, last: int, fmt: str) -> None:
    """List deliveries, newest first, with their attempts."""
    hooks = _hooks()
    found = hooks.deliveries(status=status, endpoint_id=endpoint_id, count=last)
    if fmt == "json":
        documents = [_delivery_json(d, hooks.attempts(d.id)) for d in found]
        click.echo(json.dumps(documents, indent=2))
    elif not found:
        click.echo("no deliveries")
    else:
        _print(DELIVERY_COLUMNS, [_delivery_row(d) for d in found])


@webhooks.command("replay")
@click.argument("delivery_ids", nargs=-1, type=click.IntRange(1, MAX_ROW_ID))
@click.option(
    "--since",
    metavar="TIME",
    callback=parse_datetime,
    help="Replay every delivery created since (RFC 3339; naive means UTC).",
)
def replay(delivery_ids: tuple[int, ...], since: datetime | None) -> None:
    """Send deliveries again (failed or not), by id or --since.

    An id that names no delivery (or none created since --since) is an
    error, exit 1; the other ids given are queued again all the same.
    """
    hooks = _hooks()
    if not delivery_ids:
        queued = hooks.replay([], since=since)
        click.echo(f"{queued} deliveries queued again")
        return
    wanted = list(dict.fromkeys(delivery_ids))
    # One at a time: a count per id says which ids name no delivery.
    missing = [i for i in wanted if hooks.replay([i], since=since) == 0]
    if missing:
        noun = "delivery" if len(missing) == 1 else "deliveries"
        text = f"no {noun} {', '.join(map(str, missing))}"
        if since is not None:
            text += f" created since {since.isoformat()}"
        done = len(wanted) - len(missing)
        if done:
            queued_noun = "delivery" if done == 1 else "deliveries"
            text += f" (of {len(wanted)} ids given); {done} {queued_noun} queued again"
        raise CliError(text)
    click.echo(f"{len(wanted)} deliveries queued again")


@webhooks.command("test")
@click.argument("endpoint_id")
def test(endpoint_id: str) -> None:
    """Send a signed webhook.test ping now; exit 1 if it was not accepted."""
    record, attempts = _hooks().send_test(endpoint_id)
    last = attempts[-1] if attempts else None
    detail = (last.error if last and last.error else f"HTTP {record.last_status_code}") or "-"
    duration = f" in {last.duration_ms} ms" if last else ""
    click.echo(f"{record.status} {endpoint_id}: {detail}{duration} (delivery {record.id})")
    if record.status != "delivered":
        click.get_current_context().exit(1)
