"""The queued message format (`metering.pipeline.messages`): what a producer writes and
a worker reads, on the ground floor so that a producer loads no database.

Workers of the previous version read this version's messages and the other
way round: `SAMPLE` is a message the code before `metering.pipeline.messages` wrote
(`pipeline.batch_body` of `pipeline.event_text`), kept byte for byte.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from fresh import run_fresh

from metering.domain.events import EventRecord, UsageEvent, make_event
from metering.pipeline import messages
from metering.pipeline.routing import APPLY_BATCH_TASK, SENT_AT_HEADER

AT = datetime(2026, 11, 26, 9, 0, 0, 123456, tzinfo=UTC)

EVENTS = {
    "plain": make_event([("org-1", "calls", 3)], AT, "plain-1"),
    "stacked": make_event([("org-2", "calls", 1), ("team-2", "seats", 2)], AT, "stacked-1"),
    "metadata": make_event(
        [('org-é"3', "calls", 1)], AT, "meta-1", {"route": "/x", "n": [1, 2.5, None], "ü": "😀"}
    ),
    "timed": make_event(
        [("org-4", "calls", 5)], datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "timed-1"
    ),
}

# The four events above, as the code before `metering.pipeline.messages` wrote them.
SAMPLE = (
    b'[[{"v":1,"events":[{"id":"plain-1","charges":[["org-1","calls",3]],'
    b'"at":1795683600123456,"meta":null},{"id":"stacked-1","charges":'
    b'[["org-2","calls",1],["team-2","seats",2]],"at":1795683600123456,"meta":null},'
    b'{"id":"meta-1","charges":[["org-\\u00e9\\"3","calls",1]],"at":1795683600123456,'
    b'"meta":{"route":"/x","n":[1,2.5,null],"\\u00fc":"\\ud83d\\ude00"}},'
    b'{"id":"timed-1","charges":[["org-4","calls",5]],"at":1767323045000006,"meta":null}]}],'
    b'{},{"callbacks":null,"errbacks":null,"chain":null,"chord":null}]'
)


def payload_of(body: bytes | str) -> object:
    """The batch in a message body, as Celery hands it to the task: the first
    of its ``[args, kwargs, embed]``."""
    args, kwargs, embed = json.loads(body)
    assert kwargs == {} and embed == {
        "callbacks": None,
        "errbacks": None,
        "chain": None,
        "chord": None,
    }
    [payload] = args
    return payload


def decoded(events: list[UsageEvent]) -> list[EventRecord]:
    body = messages.batch_body([messages.event_text(event) for event in events])
    records, rejected = messages.decode_records(payload_of(body))
    assert rejected == []
    return records


@pytest.mark.parametrize("kind", list(EVENTS))
def test_an_event_round_trips(kind: str) -> None:
    event = EVENTS[kind]
    assert decoded([event]) == [event.record()]
    # The event's dict (tests and old producers send it through Celery) too.
    records, _ = messages.decode_records(messages.encode_batch([messages.encode_event(event)]))
    assert records == [event.record()]


def test_a_batch_of_every_kind_round_trips_in_order() -> None:
    events = list(EVENTS.values())
    assert decoded(events) == [event.record() for event in events]


def test_the_bytes_are_those_the_previous_version_wrote() -> None:
    """Old workers read new messages: the same bytes for the same events."""
    texts = [messages.event_text(event) for event in EVENTS.values()]
    assert messages.batch_body(texts).encode() == SAMPLE
    assert json.loads(SAMPLE)[0][0] == messages.encode_batch(
        [messages.encode_event(event) for event in EVENTS.values()]
    )


def test_a_message_of_the_previous_version_decodes_the_same() -> None:
    """New workers read old messages."""
    records, rejected = messages.decode_records(payload_of(SAMPLE))
    assert rejected == []
    assert records == [event.record() for event in EVENTS.values()]


def test_the_headers_are_celerys_with_the_time_sent() -> None:
    headers = messages.task_headers("t-1", 4, "gen1@host", 1_795_000_000_000_000)
    assert headers["task"] == APPLY_BATCH_TASK
    assert headers["id"] == headers["root_id"] == "t-1"
    assert headers["argsrepr"] == messages.args_repr(4) == "[<4 events>]"
    assert headers[SENT_AT_HEADER] == 1_795_000_000_000_000
    # Celery's own headers are held to `send_task`'s in
    # tests/workers/test_guard_redis.py.


def test_importing_the_producer_loads_no_database() -> None:
    """An app that only emits events loads neither SQLAlchemy nor psycopg
    (a fresh interpreter: this one has them already)."""
    code = "import metering.pipeline.producer, metering.pipeline.messages"
    assert run_fresh(code, {"sqlalchemy", "psycopg"}) == ([], [])


def test_a_producer_with_a_broker_only_loads_no_database_when_it_emits() -> None:
    """With no database to check its limits against, `emit` stays light too."""
    code = (
        "import os\n"
        "os.environ.pop('METERING_DATABASE_URL', None)\n"
        "from metering.pipeline.producer import UsageProducer\n"
        "producer = UsageProducer('redis://127.0.0.1:1/0', flush_interval_seconds=60)\n"
        "producer.emit('org-42', 'api_calls')\n"
        "producer.discard()\n"
    )
    assert run_fresh(code, {"sqlalchemy", "psycopg"}) == ([], [])


def test_a_task_applies_its_one_argument_and_keeps_any_other_arguments_whole() -> None:
    batch = {"v": 1, "events": []}
    assert messages.batch_argument([batch], {}) == batch
    assert messages.batch_argument([batch, 2], {}) == {"args": [batch, 2], "kwargs": {}}
    assert messages.batch_argument([batch], {"x": 1}) == {"args": [batch], "kwargs": {"x": 1}}
    assert messages.batch_argument([], {}) == {"args": [], "kwargs": {}}
