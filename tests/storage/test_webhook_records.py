"""The webhook tables' records (`storage/webhook_records.py`, no SQL): what an
endpoint wants, a payload's text and size bound, and the columns a record
is stored in."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from metering.domain.notifications import MAX_PAYLOAD_BYTES, TEST_TYPE, DeliveryStatus
from metering.errors import InvalidInput
from metering.storage.webhook_records import (
    DELIVERY,
    ENDPOINT,
    DeliveryRecord,
    EndpointRecord,
    encode_payload,
    types_text,
)


def _endpoint(types: tuple[str, ...]) -> EndpointRecord:
    return EndpointRecord("ep_1", "https://example.com/hook", "s", None, None, types, True, None, 7)


def test_an_endpoint_wants_its_types_or_all_and_always_a_test_ping() -> None:
    chosen = _endpoint(("limit.denied",))
    assert chosen.wants("limit.denied")
    assert not chosen.wants("limit.threshold")
    assert chosen.wants(TEST_TYPE)
    every = _endpoint(())
    assert every.wants("limit.threshold") and every.wants("anything")


def test_a_payload_is_compact_json_with_sorted_keys() -> None:
    assert encode_payload({"b": [1, 2], "a": {"z": None, "y": "é"}}) == (
        '{"a":{"y":"\\u00e9","z":null},"b":[1,2]}'
    )


def test_a_payload_is_refused_past_its_bound() -> None:
    overhead = len('{"a":""}')
    fits = {"a": "x" * (MAX_PAYLOAD_BYTES - overhead)}
    assert len(encode_payload(fits)) == MAX_PAYLOAD_BYTES
    with pytest.raises(InvalidInput) as raised:
        encode_payload({"a": "x" * (MAX_PAYLOAD_BYTES - overhead + 1)})
    assert raised.value.field == "payload"
    assert "larger than 65536 bytes" in str(raised.value)


def test_an_endpoints_types_and_flag_are_stored_as_text_and_a_number() -> None:
    endpoint = _endpoint(("limit.denied", "grant.low"))
    row = ENDPOINT.values(endpoint)
    assert row["types"] == types_text(endpoint.types) == '["limit.denied", "grant.low"]'
    stored = SimpleNamespace(**{**row, "enabled": 1})
    assert ENDPOINT.of_row(stored) == endpoint


def test_a_deliverys_type_and_status_have_columns_of_their_own() -> None:
    record = DeliveryRecord(
        1, "msg_1", "limit.denied", "ep_1", DeliveryStatus.PENDING, 0, 5, None, None, 3, 4
    )
    row = DELIVERY.values(record)
    assert row["type"] == "limit.denied" and "message_type" not in row
    read = DELIVERY.of_row(SimpleNamespace(**{**row, "status": "pending"}))
    assert read == record and type(read.status) is DeliveryStatus
