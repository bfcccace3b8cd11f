"""Plain records of the webhook tables and their columns, and the payload's size bound (no SQL)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from metering.domain.notifications import MAX_PAYLOAD_BYTES, TEST_TYPE, DeliveryStatus
from metering.errors import InvalidInput
from metering.storage.records import RecordColumns


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    """An endpoint as stored (with its secrets: never print this as is)."""

    id: str
    url: str
    secret: str
    previous_secret: str | None
    previous_expires_at_us: int | None
    types: tuple[str, ...]
    enabled: bool
    disabled_reason: str | None
    created_at_us: int

    def wants(self, message_type: str) -> bool:
        """Whether messages of this type go here: its types, or all; a test ping always."""
        return not self.types or message_type in self.types or message_type == TEST_TYPE


@dataclass(frozen=True, slots=True)
class DeliveryJob:
    """A claimed delivery: what one HTTP attempt needs."""

    delivery_id: int
    claim_token: str
    attempts: int
    message_id: str
    message_type: str
    payload: str
    endpoint: EndpointRecord


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    id: int
    message_id: str
    message_type: str
    endpoint_id: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at_us: int | None
    last_status_code: int | None
    last_error: str | None
    created_at_us: int
    updated_at_us: int


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    delivery_id: int
    attempt: int
    attempted_at_us: int
    status_code: int | None
    duration_ms: int
    error: str | None
    next_attempt_at_us: int | None


def encode_payload(document: dict[str, Any]) -> str:
    """Compact JSON, refused beyond `MAX_PAYLOAD_BYTES`."""
    text = json.dumps(document, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidInput("payload", f"webhook payload is larger than {MAX_PAYLOAD_BYTES} bytes")
    return text


def types_text(types: Sequence[str]) -> str:
    """The ``types`` column's JSON text."""
    return json.dumps(list(types))


ENDPOINT: Final = RecordColumns(
    EndpointRecord,
    read={"types": lambda text: tuple(json.loads(text)), "enabled": bool},
    write={"types": types_text},
)
DELIVERY: Final = RecordColumns(
    DeliveryRecord, columns={"message_type": "type"}, read={"status": DeliveryStatus}
)
ATTEMPT: Final = RecordColumns(AttemptRecord)
