"""What the hot stores write beside the counters (`metering.storage.hot.extras`),
on both databases: notices recorded once per mark (a mark stored before, or
twice in one write, makes no message), each message delivered to the enabled
endpoints that want its type; ``grant.low`` once per grant, as
`AllowanceStore.announce_low` writes it; breakers stored and read back, many
read under lock written back in place."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy import Connection, func, select

from metering import FrozenClock, Limit, Meter
from metering.domain.breaker import Breaker
from metering.domain.notifications import Notice, payload_of
from metering.storage.database import database_of
from metering.storage.hot import Changes, ReadRequest
from metering.storage.hot.pick import hot_store
from metering.storage.tables import grants, webhook_deliveries, webhook_messages
from metering.storage.webhook_records import encode_payload
from metering.webhooks import Webhooks

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
NOW_US = int(NOW.timestamp() * 1_000_000)


def _notice(kind: str, mark: str, subject: str = "org-1") -> tuple[Notice, str]:
    notice = Notice(kind, mark, "calls", subject, 10, 10, 0, 3_600_000_000, 0, None, "e-1")  # type: ignore[arg-type]
    return notice, encode_payload(payload_of(notice, NOW_US))


def _write(meter: Meter, changes: Changes) -> None:
    def work(connection: Connection) -> None:
        hot_store(connection).write(changes, NOW_US, commit=False)

    database_of(meter).run(work)


def _outbox(meter: Meter) -> tuple[list[tuple[str, str]], int]:
    with meter.sql_engine.connect() as connection:
        query = select(webhook_messages.c.type, webhook_messages.c.payload)
        messages = [(kind, payload) for kind, payload in connection.execute(query)]
        count = select(func.count()).select_from(webhook_deliveries)
        return sorted(messages), connection.execute(count).scalar_one()


def test_notices_once_per_mark_delivered_where_wanted(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
        webhooks = Webhooks(meter)
        webhooks.add("https://example.com/all")
        webhooks.add("https://example.com/denied", types=["limit.denied"])
        denied, threshold = _notice("limit.denied", "denied"), _notice("limit.threshold", "t:50")
        _write(meter, Changes(notices=[denied, denied, threshold]))
        _write(meter, Changes(notices=[denied, _notice("limit.denied", "denied", "org-2")]))
        messages, deliveries = _outbox(meter)
        assert [kind for kind, _ in messages] == ["limit.denied", "limit.denied", "limit.threshold"]
        assert deliveries == 2 + 2 + 1  # both endpoints want denials, one thresholds
        assert (denied[1], threshold[1]) == tuple(p for k, p in messages if "org-1" in p)


def test_grant_low_once_as_announce_low_writes_it(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
        Webhooks(meter).add("https://example.com/all")
        meter.grant("user-é", "calls", 10, low=5, grant_id="g-1")
        with meter.sql_engine.begin() as connection:
            connection.execute(grants.update().values(used=6))
        _write(meter, Changes(low=["g-1", "g-unknown"]))
        _write(meter, Changes(low=["g-1"]))
        messages, deliveries = _outbox(meter)
        [(kind, payload)] = messages
        assert kind == "grant.low" and deliveries == 1
        assert json.loads(payload)["data"] == {
            "amount": 10,
            "grant_id": "g-1",
            "left": 4,
            "limit": "calls",
            "low_at": 5,
            "recurring_grant_id": None,
            "subject": "user-é",
            "used": 6,
        }
        assert "user-\\u00e9" in payload  # the encoding of every payload (`encode_payload`)


def test_breakers_are_stored_and_read_back_locked(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
        stepped = Breaker(0.5, 0.25, NOW_US, NOW_US - 10, None, NOW_US)
        _write(meter, Changes(breakers={("calls", "org-1"): stepped}, secret="s3cret"))

        def read(connection: Connection) -> object:
            pairs = [("calls", "org-1"), ("calls", "org-2")]
            return hot_store(connection).read(ReadRequest(None, [], [], breaker_pairs=pairs))

        snapshot = database_of(meter).run(read)
        assert snapshot.breakers == {("calls", "org-1"): stepped}  # type: ignore[attr-defined]
        assert snapshot.secret == "s3cret"  # type: ignore[attr-defined]


def test_many_breakers_read_locked_are_written_back_in_place(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
        pairs = [("calls", f"org-{n:02}") for n in range(20)]  # more than a few rows
        first = {pair: Breaker(0.5, 0.25, NOW_US, NOW_US - n) for n, pair in enumerate(pairs)}
        _write(meter, Changes(breakers=first))

        def step(asked: list[tuple[str, str]], at_us: int) -> dict[object, Breaker]:
            def work(connection: Connection) -> object:
                store = hot_store(connection)
                found = store.read(ReadRequest(None, [], [], breaker_pairs=asked)).breakers
                changed = {
                    pair: Breaker(1.5, 0.75, at_us, NOW_US, at_us - 1, None) for pair in asked
                }
                store.write(Changes(breakers=changed), at_us, commit=False)
                return found

            return database_of(meter).run(work)  # type: ignore[no-any-return]

        assert step(pairs, NOW_US + 1) == first  # every one read: updated where it is
        again = step([*pairs, ("calls", "org-new")], NOW_US + 2)  # one new: upserted
        assert again == {pair: Breaker(1.5, 0.75, NOW_US + 1, NOW_US, NOW_US) for pair in pairs}
        last = step([*pairs, ("calls", "org-new")], NOW_US + 3)
        assert last[("calls", "org-new")] == Breaker(1.5, 0.75, NOW_US + 2, NOW_US, NOW_US + 1)
        assert len(last) == 21
