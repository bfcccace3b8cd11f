"""Where deliveries may go: addresses judged by the IPv4 address they embed,
and DNS rebinding (the connection goes to the address that was checked).

The rebinding test controls name resolution (``socket.getaddrinfo``, which
both the check and any HTTP client call) and runs two real HTTP servers on
loopback: the receiver on 127.0.0.2, which the test lets through as if it
were public (``allowed_networks``), and an "internal" service on 127.0.0.1.
"""

from __future__ import annotations

import socket
import ssl
from ipaddress import ip_network
from typing import Any
from urllib.parse import urlsplit

import pytest
from pytest_httpserver import HTTPServer
from rebinding import REBIND_HOST, RebindingResolver, certificate, settings_for

from metering import Limit, Meter
from metering.webhooks import DeliverySettings, Webhooks
from metering.webhooks.destinations import (
    DestinationRefused,
    checked_addresses,
    refused_destination,
)


def check_destination(url: str, *, allow_private: bool, allowed_networks: Any = ()) -> None:
    """`checked_addresses` of ``url``'s host and port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    checked_addresses(
        parts.hostname or "", port, allow_private=allow_private, allowed_networks=allowed_networks
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://[::127.0.0.1]/hook",  # IPv4-compatible (deprecated)
        "http://[::7f00:1]:8080/hook",
        "http://[::a00:1]/hook",  # 10.0.0.1
        "http://[::ffff:127.0.0.1]/hook",  # IPv4-mapped
        "http://[64:ff9b::7f00:1]/hook",  # NAT64 well-known prefix: 127.0.0.1
        "http://[64:ff9b::a9fe:a9fe]/hook",  # NAT64: 169.254.169.254 (cloud metadata)
        "http://[64:ff9b::c0a8:101]/hook",  # NAT64: 192.168.1.1
        "http://[64:ff9b:1::a00:1]/hook",  # NAT64 local-use prefix (RFC 8215)
        "http://[2002:7f00:1::1]/hook",  # 6to4 of 127.0.0.1
        "http://[2002:a00:1::]/hook",  # 6to4 of 10.0.0.1
        "http://[2002:a9fe:a9fe::1]/hook",  # 6to4 of 169.254.169.254
        "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/hook",  # Teredo, client 10.0.0.1
        "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/hook",  # Teredo, client 127.0.0.1
        "http://127.0.0.1/hook",
        "http://[::1]/hook",
        "http://[fe80::1]/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://0.0.0.0/hook",
        "http://[::]/hook",
        "http://224.0.0.1/hook",
    ],
)
def test_a_non_public_address_is_refused_in_every_wrapping(url: str) -> None:
    with pytest.raises(DestinationRefused, match="METERING_WEBHOOKS_ALLOW_PRIVATE"):
        check_destination(url, allow_private=False)


@pytest.mark.parametrize(
    "url",
    [
        "https://8.8.8.8/hook",
        "https://[2606:4700:4700::1111]/hook",
        "https://[64:ff9b::808:808]/hook",  # NAT64 of 8.8.8.8
        "https://[2002:808:808::1]/hook",  # 6to4 of 8.8.8.8
    ],
)
def test_a_public_address_is_accepted(url: str) -> None:
    check_destination(url, allow_private=False)


def test_an_allowed_network_lets_its_addresses_through_and_no_others() -> None:
    allowed = (ip_network("10.20.0.0/16"),)
    check_destination("http://10.20.3.4/h", allow_private=False, allowed_networks=allowed)
    with pytest.raises(DestinationRefused):
        check_destination("http://10.21.0.1/h", allow_private=False, allowed_networks=allowed)


def test_allowed_networks_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from metering.errors import ConfigurationError

    monkeypatch.setenv("METERING_WEBHOOKS_ALLOW_NETWORKS", "10.20.0.0/16, fd00::/8")
    settings = DeliverySettings.from_env()
    assert settings.allowed_networks == (ip_network("10.20.0.0/16"), ip_network("fd00::/8"))
    monkeypatch.setenv("METERING_WEBHOOKS_ALLOW_NETWORKS", "10.20.0.1/16")
    with pytest.raises(ConfigurationError, match="METERING_WEBHOOKS_ALLOW_NETWORKS"):
        DeliverySettings.from_env()


# -- DNS rebinding --------------------------------------------------------------


def test_dns_rebinding_connects_to_the_checked_address(
    db_url: str, public: HTTPServer, internal: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First answer public (checked, allowed), every later one 127.0.0.1: the POST
    still reaches the public address, and the internal service gets nothing."""
    resolver = RebindingResolver("127.0.0.2", "127.0.0.1")
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    port = public.port
    with Meter(db_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter, settings_for("127.0.0.2"))
        hooks.add(f"http://alice:pw@{REBIND_HOST}:{port}/hook")
        meter.consume("s-1", "send")
        meter.consume("s-1", "send")
        report = hooks.deliver_due()
        [attempt] = hooks.attempts(hooks.deliveries()[0].id)
    assert internal.log == [], "the request went to the rebound address"
    assert report.delivered == 1 and attempt.status_code == 200, attempt
    assert len(public.log) == 1
    request, _ = public.log[0]
    assert request.headers["host"] == f"{REBIND_HOST}:{port}"
    assert request.authorization is not None and request.authorization.password == "pw"
    assert resolver.asked == 1  # one lookup: the one that was checked


def test_a_rebound_answer_at_check_time_is_refused(
    db_url: str, public: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: the check sees 127.0.0.1 and nothing is sent anywhere."""
    monkeypatch.setattr(socket, "getaddrinfo", RebindingResolver("127.0.0.1", "127.0.0.2"))
    with Meter(db_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter, settings_for("127.0.0.2"))
        hooks.add(f"http://{REBIND_HOST}:{public.port}/hook")
        meter.consume("s-1", "send")
        meter.consume("s-1", "send")
        hooks.deliver_due()
        [attempt] = hooks.attempts(hooks.deliveries()[0].id)
    assert attempt.status_code is None and (attempt.error or "").startswith("refused:")
    assert "127.0.0.1" in (attempt.error or "") and public.log == []


# -- TLS: the pinned connection still verifies the certificate for the name -------


@pytest.mark.parametrize("names", [[REBIND_HOST], ["other.example"]], ids=["right", "wrong"])
def test_tls_to_the_pinned_address_verifies_the_hostname(
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    names: list[str],
) -> None:
    from metering.webhooks.destinations import delivery_client

    ca_pem, cert_pem, key_pem = certificate(names)
    (tmp_path / "cert.pem").write_bytes(cert_pem)
    (tmp_path / "key.pem").write_bytes(key_pem)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    seen_sni: list[str | None] = []

    def note_sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        seen_sni.append(name)

    server_context.sni_callback = note_sni
    client_context = ssl.create_default_context(cadata=ca_pem.decode())
    server = HTTPServer(host="127.0.0.2", port=0, ssl_context=server_context, threaded=True)
    server.expect_request("/hook").respond_with_data("ok")
    server.start()
    monkeypatch.setattr(socket, "getaddrinfo", RebindingResolver("127.0.0.2", "127.0.0.1"))
    try:
        settings = settings_for("127.0.0.2")
        with Meter(db_url) as meter, delivery_client(settings, verify=client_context) as client:
            meter.set_limit(Limit("send", maximum=1, period="1h"))
            hooks = Webhooks(meter, settings)
            hooks.add(f"https://{REBIND_HOST}:{server.port}/hook")
            meter.consume("s-1", "send")
            meter.consume("s-1", "send")
            from metering.webhooks.delivery import deliver_due

            deliver_due(meter, settings, client=client)
            [attempt] = hooks.attempts(hooks.deliveries()[0].id)
    finally:
        server.clear()
        server.stop()
    if names == [REBIND_HOST]:
        assert attempt.status_code == 200, attempt
        assert seen_sni == [REBIND_HOST]
    else:
        assert attempt.status_code is None and "CERTIFICATE_VERIFY_FAILED" in (
            attempt.error or ""
        ), attempt


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8080/x", "http://[::1]/x", "https://10.1.2.3/x", "http://localhost:1/x"],
)
def test_a_url_to_a_non_public_host_is_reported_at_add_time(url: str) -> None:
    found = refused_destination(url, allow_private=False)
    assert found is not None and "METERING_WEBHOOKS_ALLOW_PRIVATE=1" in found
    assert refused_destination(url, allow_private=True) is None


def test_an_allowed_network_or_a_public_or_unresolved_host_is_not_reported() -> None:
    ten = (ip_network("10.0.0.0/8"),)
    assert (
        refused_destination("https://10.1.2.3/x", allow_private=False, allowed_networks=ten) is None
    )
    assert refused_destination("https://93.184.215.14/x", allow_private=False) is None
    assert refused_destination("https://no-such-host.invalid/x", allow_private=False) is None


def test_delivery_clients_share_one_checked_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """certifi's CA bundle is loaded once a process, not twice a client (a
    webhook ping made one): every client still checks certificates."""
    from metering.webhooks.destinations import delivery_client

    loads: list[Any] = []
    load = ssl.SSLContext.load_verify_locations

    def counted(context: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(args or kwargs)
        load(context, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    contexts = []
    for _ in range(3):
        with delivery_client(settings_for("127.0.0.2")) as client:
            pool = client._transport._pool  # type: ignore[attr-defined]
            contexts.append(pool._ssl_context)
    assert len(loads) <= 1, loads
    assert len({id(context) for context in contexts}) == 1
    assert all(c.verify_mode == ssl.CERT_REQUIRED and c.check_hostname for c in contexts)
