"""Who a request is charged to: the request as key functions see it, and the keys."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from metering.domain.events import MAX_SUBJECT_LENGTH
from metering.errors import InvalidInput

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """A framework-neutral view of a request, handed to key functions.

    ``headers`` has lower-case names; repeated headers are joined with ``,``.
    ``client`` is the connected peer's address; ``user`` what the server or
    an authentication middleware attached (ASGI ``scope["user"]``, WSGI
    ``REMOTE_USER``); ``raw`` the ASGI scope or WSGI environ itself.
    """

    method: str
    path: str
    headers: Mapping[str, str]
    client: str | None
    user: Any = None
    raw: Any = field(default=None, repr=False)


Key = Callable[[RequestInfo], str | None]

ADDRESS_CACHE_SIZE: Final = 4096
HASHED_PREFIX: Final = "h:"
HASHED_HEX_DIGITS: Final = 32  # 128 bits of SHA-256


def subject_of(key: str) -> str:
    """The subject a key is charged to: the key itself, or ``h:`` + a digest.

    A key that is a valid subject (1 to 200 printable characters, no space
    at either end) and does not start with ``h:`` is its own subject. Any
    other key (an overlong API key, one with control characters, a 250
    character user name, or one that starts with ``h:``) is charged to
    ``h:`` + the first 32 hex digits of the SHA-256 of its UTF-8 bytes. So
    every distinct key has a subject of its own, a client cannot dodge its
    limit with an odd key, and no plain key can collide with a hashed one.
    """
    if not isinstance(key, str):
        raise InvalidInput("key", f"a key function must return a string or None, got {key!r}")
    if (
        0 < len(key) <= MAX_SUBJECT_LENGTH
        and not key.startswith(HASHED_PREFIX)
        and key.isprintable()
        and not key[0].isspace()
        and not key[-1].isspace()
    ):
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return HASHED_PREFIX + digest[:HASHED_HEX_DIGITS]


def _parse_networks(trusted: Iterable[str]) -> tuple[IPNetwork, ...]:
    networks = []
    for entry in trusted:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError as exc:
            raise InvalidInput(
                "trusted_proxies", f"{entry!r} is not an address or network"
            ) from exc
    return tuple(networks)


def _address(text: str) -> IPAddress | None:
    """The address in ``text`` (a port allowed); an IPv4-mapped IPv6 address as IPv4."""
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if address.version == 6 and address.ipv4_mapped is not None:  # ::ffff:a.b.c.d
        return address.ipv4_mapped
    return address


def _validate_prefix(ipv6_prefix: object) -> int:
    if isinstance(ipv6_prefix, bool) or not isinstance(ipv6_prefix, int):
        raise InvalidInput("ipv6_prefix", f"must be a whole number, got {ipv6_prefix!r}")
    if not 0 <= ipv6_prefix <= 128:
        raise InvalidInput("ipv6_prefix", f"must be between 0 and 128, got {ipv6_prefix}")
    return ipv6_prefix


def client_ip(trusted_proxies: Iterable[str] = (), *, ipv6_prefix: int = 64) -> Key:
    """Key requests by client address.

    ``X-Forwarded-For`` is believed only when the connected peer is one of
    ``trusted_proxies`` (addresses or networks): then the client is the
    rightmost address in the header that is not itself a trusted proxy.
    By default no proxy is trusted, so a client cannot pick its own key.

    An IPv4 client is keyed by its address, also when the server sees it
    as IPv4-mapped IPv6 (``::ffff:192.0.2.7`` is ``192.0.2.7``). An IPv6
    client is keyed by its network of ``ipv6_prefix`` bits, ``/64`` by
    default (``2001:db8:1:2::/64``): one host usually holds a whole /64, so
    keying by address would let it take a fresh key per request. 128 keys
    each address alone (``2001:db8:1:2::7``).
    """
    networks = _parse_networks(trusted_proxies)
    prefix = _validate_prefix(ipv6_prefix)
    mask = ((1 << prefix) - 1) << (128 - prefix)

    # Parsing an address, matching it against networks and spelling its key
    # cost microseconds (IPv6 the most); the same few peers and proxies come
    # back request after request.
    @functools.lru_cache(maxsize=ADDRESS_CACHE_SIZE)
    def resolve(text: str) -> tuple[str, bool, bool]:
        """(key, is an address, is a trusted proxy) of an address as received."""
        address = _address(text)
        if address is None:
            return text, False, False
        trusted = any(address in net for net in networks)
        if address.version == 4 or prefix == 128:
            return str(address), True, trusted
        return f"{ipaddress.IPv6Address(int(address) & mask)}/{prefix}", True, trusted

    def key(request: RequestInfo) -> str | None:
        if request.client is None:
            return None
        found, _, trusted = resolve(request.client)
        if not trusted:
            return found
        for hop in reversed(request.headers.get("x-forwarded-for", "").split(",")):
            hop_key, is_address, trusted = resolve(hop)
            if not is_address:  # a malformed entry: trust nothing to its left
                break
            found = hop_key
            if not trusted:
                break
        return found

    return key


def authenticated_user(request: RequestInfo) -> str | None:
    """Key requests by authenticated user; None (limit not applied) when anonymous.

    Understands Starlette's ``scope["user"]`` (``is_authenticated``,
    ``identity`` or ``display_name``), WSGI's ``REMOTE_USER`` and plain strings.
    """
    user = request.user
    if user is None or user == "":
        return None
    if isinstance(user, str):
        return user
    if not getattr(user, "is_authenticated", False):
        return None
    for attribute in ("identity", "display_name", "username"):
        value = getattr(user, attribute, None)
        if isinstance(value, str) and value:
            return value
    return None


def header(name: str) -> Key:
    """Key requests by a header's value (an API key, a tenant id)."""
    wanted = name.lower()
    return lambda request: request.headers.get(wanted) or None
