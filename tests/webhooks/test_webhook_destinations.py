"""Where deliveries may go: addresses judged by the IPv4 address they embed."""

from __future__ import annotations

from ipaddress import ip_network

import pytest

from metering.webhooks import DeliverySettings
from metering.webhooks.delivery import DestinationRefused, check_destination


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
