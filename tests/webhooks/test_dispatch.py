"""The dispatcher's bounds, with stub claims and attempts (no database, no HTTP);
and `deliver_due` past a real receiver that never answers."""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Collection, Iterator

import pytest
from pytest_httpserver import HTTPServer
from waiting import wait_for

from metering import Limit, Meter
from metering.errors import ConfigurationError
from metering.settings import dispatching, poll_seconds
from metering.storage.webhook_records import DeliveryJob, EndpointRecord
from metering.webhooks import DeliverySettings, Webhooks
from metering.webhooks.dispatch import CRASHED, Dispatcher


def job(number: int, endpoint: str) -> DeliveryJob:
    record = EndpointRecord(endpoint, "http://x", "whsec_x", None, None, (), True, None, 0)
    return DeliveryJob(number, "token", 0, f"msg_{number}", "limit.denied", "{}", record)


class Table:
    """Due jobs, claimed in order, skipping the endpoints the dispatcher is full on."""

    def __init__(self, jobs: list[DeliveryJob]) -> None:
        self.jobs = list(jobs)
        self.lock = threading.Lock()

    def claim(self, busy: Collection[str]) -> DeliveryJob | None:
        with self.lock:
            for found in self.jobs:
                if found.endpoint.id not in busy:
                    self.jobs.remove(found)
                    return found
        return None


class Receivers:
    """Attempts that wait while their endpoint is held; records what ran together."""

    def __init__(self, held: set[str]) -> None:
        self.held = {endpoint: threading.Event() for endpoint in held}
        self.running: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.done: list[int] = []
        self.lock = threading.Lock()

    def attempt(self, claimed: DeliveryJob) -> str:
        endpoint = claimed.endpoint.id
        with self.lock:
            self.running[endpoint] += 1
            self.peak[endpoint] = max(self.peak[endpoint], self.running[endpoint])
        gate = self.held.get(endpoint)
        if gate is not None:
            gate.wait(10)
        with self.lock:
            self.running[endpoint] -= 1
            self.done.append(claimed.delivery_id)
        return "delivered"


def test_a_held_endpoint_takes_only_its_own_slots() -> None:
    jobs = [job(n, "slow") for n in range(5)] + [job(n, "fast") for n in range(5, 10)]
    table, receivers = Table(jobs), Receivers({"slow"})
    dispatcher = Dispatcher(receivers.attempt, max_in_flight=8, max_in_flight_per_endpoint=2)
    finished = threading.Event()
    tally: Counter[str] = Counter()

    def drain() -> None:
        tally.update(dispatcher.drain(table.claim, most=100))
        finished.set()

    threading.Thread(target=drain).start()
    wait_for(lambda: sorted(receivers.done) == [5, 6, 7, 8, 9], lambda: str(receivers.done))
    assert not finished.is_set() and receivers.running["slow"] == 2
    assert [j.delivery_id for j in table.jobs] == [2, 3, 4]  # left for later, unclaimed
    receivers.held["slow"].set()
    assert finished.wait(10)
    dispatcher.close()
    assert tally == {"delivered": 10}
    assert receivers.peak["slow"] == 2 and receivers.peak["fast"] <= 2


def test_the_total_bound_holds_across_endpoints() -> None:
    jobs = [job(n, f"ep-{n}") for n in range(6)]
    table, receivers = Table(jobs), Receivers({f"ep-{n}" for n in range(6)})
    dispatcher = Dispatcher(receivers.attempt, max_in_flight=3, max_in_flight_per_endpoint=4)
    assert dispatcher.fill(table.claim) == 3
    assert len(table.jobs) == 3
    for gate in receivers.held.values():
        gate.set()
    dispatcher.drain(table.claim, most=100)
    assert dispatcher.tally == {"delivered": 6} and max(receivers.peak.values()) == 1
    dispatcher.close()


def test_an_attempt_that_raises_frees_its_slot() -> None:
    def attempt(claimed: DeliveryJob) -> str:
        raise RuntimeError("the database went away while recording")

    dispatcher = Dispatcher(attempt, max_in_flight=1, max_in_flight_per_endpoint=1)
    table = Table([job(1, "a"), job(2, "a")])
    # One slot: the second attempt ran only because the first one's was freed
    # (and drain returns only when no attempt is in flight).
    assert dispatcher.drain(table.claim, most=10) == {CRASHED: 2}
    dispatcher.close()


def test_serve_claims_what_falls_due_until_stopped() -> None:
    table, receivers = Table([]), Receivers(set())
    dispatcher = Dispatcher(receivers.attempt, max_in_flight=2, max_in_flight_per_endpoint=1)
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.serve, args=(table.claim, stop, 0.05))
    thread.start()
    with table.lock:
        table.jobs.extend([job(1, "a"), job(2, "b")])
    wait_for(lambda: sorted(receivers.done) == [1, 2], lambda: str(receivers.done))
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    dispatcher.close()


@pytest.fixture
def silent() -> Iterator[socket.socket]:
    """A receiver that takes connections (into its backlog) and never answers."""
    sock = socket.create_server(("127.0.0.1", 0))
    yield sock
    sock.close()


def test_deliver_due_reaches_an_endpoint_while_another_hangs(
    db_url: str, receiver: HTTPServer, silent: socket.socket
) -> None:
    receiver.expect_request("/hook").respond_with_data("ok")
    settings = DeliverySettings(timeout_seconds=20.0, allow_private=True)
    with Meter(db_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter, settings)
        hooks.add(f"http://127.0.0.1:{silent.getsockname()[1]}/hook")
        hooks.add(receiver.url_for("/hook"))
        meter.consume("visitor-1", "send")
        assert not meter.consume("visitor-1", "send").allowed
        run = threading.Thread(target=hooks.deliver_due)
        run.start()
        wait_for(lambda: len(receiver.log) == 1, lambda: str(hooks.deliveries()), 5)
        assert run.is_alive()  # the hanging attempt is still in flight
        silent.close()  # its connection is reset: the run ends
        run.join(10)
        assert not run.is_alive()
        statuses = sorted(d.status for d in hooks.deliveries())
    assert statuses == ["delivered", "pending"]


def test_the_bounds_and_the_poll_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = DeliverySettings.from_env()
    assert (settings.max_in_flight, settings.max_in_flight_per_endpoint) == (16, 4)
    assert poll_seconds() == 0.25 and dispatching()
    monkeypatch.setenv("METERING_WEBHOOKS_CONCURRENCY", "32")
    monkeypatch.setenv("METERING_WEBHOOKS_PER_ENDPOINT", "1")
    monkeypatch.setenv("METERING_WEBHOOKS_POLL_INTERVAL", "0.1")
    monkeypatch.setenv("METERING_WEBHOOKS_DISPATCH", "0")
    settings = DeliverySettings.from_env()
    assert (settings.max_in_flight, settings.max_in_flight_per_endpoint) == (32, 1)
    assert poll_seconds() == 0.1 and not dispatching()
    for bad in ("0", "2.5", "-1", "many"):
        monkeypatch.setenv("METERING_WEBHOOKS_PER_ENDPOINT", bad)
        with pytest.raises(ConfigurationError):
            DeliverySettings.from_env()
