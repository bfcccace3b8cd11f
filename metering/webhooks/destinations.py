"""Where deliveries may connect.

An address is refused when it is not global (loopback, private, link-local,
unspecified, reserved ...) or is multicast, and so is an IPv6 address that
carries such an IPv4 address inside it: IPv4-mapped (``::ffff:a.b.c.d``),
IPv4-compatible (``::a.b.c.d``, deprecated), NAT64 (``64:ff9b::/96``, whose
gateway would forward to the embedded address; the local-use ``64:ff9b:1::/48``
is refused whole), 6to4 (``2002::/16``) and Teredo (``2001::/32``: server and
client). ``allowed_networks`` lets chosen networks through.

The check and the connection are one step (DNS rebinding): `delivery_client`
makes an httpx client whose connections are opened by `PinnedBackend`, which
resolves the host once, checks every answer and connects to a checked address
itself, so nothing resolves the name a second time. The request still
carries the URL's host (``Host`` header) and TLS still sends it as SNI and
verifies the certificate against it: only the socket is opened by address.
Proxies from the environment are not used (a proxy would resolve the name):
with ``METERING_WEBHOOKS_PROXY`` the connection is a ``CONNECT`` tunnel to
the checked address.
`refused_destination` tells at add time that a URL's host is not public, so an
operator learns then, not from every delivery failing, which setting allows it.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import ssl

    import httpcore
    import httpx

    from metering.settings import DeliverySettings, WebhookProxy

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

IPV4_COMPATIBLE: Final = ipaddress.ip_network("::/96")
NAT64_WELL_KNOWN: Final = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL_USE: Final = ipaddress.ip_network("64:ff9b:1::/48")
ALLOW_HINT: Final = (
    "(set METERING_WEBHOOKS_ALLOW_PRIVATE=1 or METERING_WEBHOOKS_ALLOW_NETWORKS to allow)"
)


class DestinationRefused(Exception):
    """The endpoint's host resolves to an address deliveries must not reach."""


def embedded_ipv4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, compatible, NAT64,
    6to4, Teredo); empty for IPv4 and for plain IPv6."""
    if isinstance(address, ipaddress.IPv4Address):
        return []
    found = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in NAT64_WELL_KNOWN or (address in IPV4_COMPATIBLE and int(address) > 1):
        found.append(low32)
    return [v4 for v4 in found if v4 is not None]


def _public(address: IPAddress) -> bool:
    return address.is_global and not address.is_multicast and address not in NAT64_LOCAL_USE


def refusal(address: IPAddress, allowed_networks: Iterable[IPNetwork] = ()) -> str | None:
    """Why deliveries must not connect to ``address``, or None when they may."""
    allowed = tuple(allowed_networks)
    for candidate in (address, *embedded_ipv4(address)):
        if any(candidate in network for network in allowed):
            continue
        if not _public(candidate):
            shown = f"{address} (carrying {candidate})" if candidate != address else str(address)
            return f"{shown}, a loopback, private, link-local or other non-public address"
    return None


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to, in the resolver's order, once each."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # UnicodeError: a host IDNA cannot encode
        raise DestinationRefused(f"cannot resolve {host!r}: {exc}") from None
    found: dict[IPAddress, None] = {}
    for info in infos:
        found[ipaddress.ip_address(str(info[4][0]).split("%")[0])] = None
    return list(found)


def checked_addresses(
    host: str, port: int, *, allow_private: bool, allowed_networks: Iterable[IPNetwork] = ()
) -> list[IPAddress]:
    """Resolve ``host`` once and check every answer; `DestinationRefused` if any
    is refused (one bad answer among good ones is refused too: a rebinding
    attacker controls the order). Returns the addresses to connect to."""
    addresses = resolve(host, port)
    if not allow_private:
        allowed = tuple(allowed_networks)
        for address in addresses:
            reason = refusal(address, allowed)
            if reason is not None:
                raise DestinationRefused(f"{host} resolves to {reason} {ALLOW_HINT}")
    return addresses


def refused_destination(
    url: str, *, allow_private: bool, allowed_networks: Iterable[IPNetwork] = ()
) -> str | None:
    """Why deliveries to ``url`` will be refused, naming the setting that
    allows them, or None: its host resolves to a non-public address. A host
    that does not resolve now is not reported (it may by delivery time)."""
    import httpx

    try:
        parsed = httpx.URL(url)
        host = parsed.host
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except (httpx.InvalidURL, ValueError):
        return None
    if allow_private:
        return None
    try:
        addresses = resolve(host, port)
    except DestinationRefused:
        return None
    allowed = tuple(allowed_networks)
    for address in addresses:
        reason = refusal(address, allowed)
        if reason is not None:
            return f"deliveries will be refused: {host} resolves to {reason} {ALLOW_HINT}"
    return None


def url_error(url: str) -> str | None:
    """Why httpx, the client deliveries use, cannot send to ``url`` (a host its
    IDNA encoding refuses, an IPv4 address with leading zeros ...), or None.

    The same parser at add time and at delivery time: a URL that passes here
    is one `delivery_client` can send to (whether its address is allowed is
    decided as it connects)."""
    import httpx

    try:
        # What `httpx.Client.post` builds first: the URL, and the Host header
        # from its host (IDNA-decoded, which the URL alone does not do).
        request = httpx.Request("POST", url)
        # What the resolver does with the host as it connects (`resolve`):
        # Python's IDNA codec refuses a label over 63 characters, or empty.
        request.url.host.encode("idna")
    except (httpx.InvalidURL, ValueError) as exc:  # idna's IDNAError is a UnicodeError
        return str(exc) or type(exc).__name__
    return None


def _pinned_backend(
    allow_private: bool, allowed_networks: Iterable[IPNetwork], proxy: WebhookProxy | None = None
) -> Any:
    import httpcore  # with httpx, only when delivering

    class PinnedBackend(httpcore.NetworkBackend):
        """Opens a connection to an address `checked_addresses` accepted, never to a name."""

        def __init__(self) -> None:
            self.inner = httpcore.SyncBackend()
            self.allowed = tuple(allowed_networks)

        def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Iterable[Any] | None = None,
        ) -> httpcore.NetworkStream:
            addresses = checked_addresses(
                host, port, allow_private=allow_private, allowed_networks=self.allowed
            )
            failure: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
            for address in addresses:  # each is checked: trying the next one is safe
                try:
                    if proxy is not None:
                        return self.tunnel(address, port, timeout, local_address, socket_options)
                    return self.inner.connect_tcp(
                        str(address), port, timeout, local_address, socket_options
                    )
                except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                    failure = exc
            raise failure or httpcore.ConnectError(f"{host} has no address")

        def tunnel(
            self,
            address: IPAddress,
            port: int,
            timeout: float | None,
            local_address: str | None,
            socket_options: Iterable[Any] | None,
        ) -> httpcore.NetworkStream:
            """A stream to ``address`` through the proxy: ``CONNECT`` to the
            checked address, never to a name the proxy would resolve."""
            assert proxy is not None
            try:
                stream = self.inner.connect_tcp(
                    proxy.host, proxy.port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                raise type(exc)(f"the proxy {proxy}: {exc}") from exc
            target = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
            head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
            if proxy.authorization is not None:
                head += f"Proxy-Authorization: {proxy.authorization}\r\n"
            try:
                stream.write(f"{head}\r\n".encode("ascii"), timeout)
                status = _tunnel_status(stream, timeout)
            except BaseException:
                stream.close()
                raise
            if status != 200:
                stream.close()
                raise httpcore.ProxyError(
                    f"the proxy {proxy} answered {status} to CONNECT {target}"
                )
            return stream

        def connect_unix_socket(
            self, path: str, timeout: float | None = None, socket_options: Any = None
        ) -> httpcore.NetworkStream:
            raise DestinationRefused("webhooks are not delivered over Unix sockets")

        def sleep(self, seconds: float) -> None:
            self.inner.sleep(seconds)

    return PinnedBackend()


def delivery_client(
    settings: DeliverySettings, *, verify: ssl.SSLContext | bool = True
) -> httpx.Client:
    """The HTTP client deliveries use: connections pinned to checked addresses,
    no redirects, no proxies from the environment. ``verify``: certificate
    checks (an `ssl.SSLContext` with other trusted CAs, for tests)."""
    import httpcore
    import httpx

    context = (
        _default_tls() if verify is True else httpx.create_ssl_context(verify, trust_env=False)
    )
    transport = httpx.HTTPTransport(verify=context, trust_env=False)
    # The transport's own pool would open sockets by name; this one by checked address.
    transport._pool = httpcore.ConnectionPool(
        ssl_context=context,
        network_backend=_pinned_backend(
            settings.allow_private, settings.allowed_networks, settings.proxy
        ),
    )
    return httpx.Client(
        transport=transport,
        timeout=settings.timeout_seconds,
        follow_redirects=False,
        trust_env=False,
    )


# The most of a proxy's answer to CONNECT read before giving up on it.
MAX_TUNNEL_ANSWER: Final = 16_384


def _tunnel_status(stream: httpcore.NetworkStream, timeout: float | None) -> int | str:
    """The status code of the proxy's answer to CONNECT (its head read whole,
    nothing past it: the server speaks only after the client), or what it sent
    instead of one."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        if len(answer) > MAX_TUNNEL_ANSWER:
            return "an answer too long"
        chunk = stream.read(4096, timeout)
        if not chunk:
            return "nothing" if not answer else "a cut answer"
        answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split(b" ")
    if len(status) < 2 or not status[0].startswith(b"HTTP/") or not status[1].isdigit():
        return "no HTTP status"
    if status[1] == b"200" and rest:  # a refusal may have a body; a tunnel has none
        return "bytes past its answer"
    return int(status[1])


@functools.cache
def _default_tls() -> ssl.SSLContext:
    """The certificate checks of every delivery client of the process (certifi's
    CAs): loading the bundle is most of a client's making, and a context is
    shared safely between clients and threads."""
    import httpx

    return httpx.create_ssl_context(verify=True, trust_env=False)
