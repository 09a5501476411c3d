"""Which addresses the relay may send webhooks to: the pure rules (no DNS, no socket).

Unless ``delivery.allow_private_networks`` is set, an endpoint whose host is, or resolves to,
an address that is not public is refused: loopback, private (RFC 1918, ULA ``fc00::/7``),
link-local, cloud metadata (``169.254.169.254``, ``fd00:ec2::254``, ``100.100.100.200``),
unspecified, carrier-grade NAT ``100.64.0.0/10``, multicast, broadcast, documentation and
other reserved ranges. IPv4 embedded in IPv6 (``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``,
6to4 ``2002::/16``) is unwrapped first, so it cannot smuggle a private IPv4 address.

What counts as public is :func:`is_blocked_ip`, replaceable by an ``AddressPolicy`` (tests
treat ``127.0.0.2`` as public to exercise the pinning on loopback only). :func:`ip_literal`
reads the address a host spells, the legacy IPv4 forms every resolver accepts included
(``127.1``, ``0x7f.0.0.1``, ``2130706433``).

:func:`literal_refusal` judges a URL without resolving anything: a URL whose host can only be
private (an IP literal in a refused range, ``localhost``) is refused; the config refuses such
endpoints at load time. A name is judged when connecting, after resolving it once:
:mod:`sessionhook.relay.delivery.resolve` (``vet_host``) does that half.

Errors::

    NetguardError
    +-- BlockedAddressError   the URL is refused; ``reason`` says which address and why
    +-- ResolutionError       (sessionhook.relay.delivery.resolve) the host name did not resolve
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable
from typing import Final
from urllib.parse import urlsplit

__all__ = [
    "AddressPolicy",
    "BlockedAddressError",
    "IPAddress",
    "NetguardError",
    "ip_literal",
    "is_blocked_ip",
    "is_localhost_name",
    "literal_refusal",
    "split_url",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: ``address text -> refusal reason`` (``None``: public); :func:`is_blocked_ip` by default.
AddressPolicy = Callable[[str], str | None]


class NetguardError(Exception):
    """Base of the guard's refusals; ``reason`` is one line for logs and the delivery log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BlockedAddressError(NetguardError):
    """The URL's host is or resolves to an address that is not public."""


def _nets(
    *specs: tuple[str, str],
) -> list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]]:
    return [(ipaddress.ip_network(net), reason) for net, reason in specs]


# Order matters: the first match names the reason, so specific ranges come first.
_BLOCKED = _nets(
    ("169.254.169.254/32", "cloud metadata address"),
    ("100.100.100.200/32", "cloud metadata address"),
    ("fd00:ec2::254/128", "cloud metadata address"),
    ("0.0.0.0/8", "unspecified address"),
    ("::/128", "unspecified address"),
    ("127.0.0.0/8", "loopback address"),
    ("::1/128", "loopback address"),
    ("::/8", "reserved address (IPv4-compatible or unassigned)"),
    ("10.0.0.0/8", "private address"),
    ("172.16.0.0/12", "private address"),
    ("192.168.0.0/16", "private address"),
    ("fc00::/7", "private address (unique local)"),
    ("169.254.0.0/16", "link-local address"),
    ("fe80::/10", "link-local address"),
    ("fec0::/10", "site-local address (deprecated)"),
    ("100.64.0.0/10", "carrier-grade NAT address"),
    ("224.0.0.0/4", "multicast address"),
    ("ff00::/8", "multicast address"),
    ("255.255.255.255/32", "broadcast address"),
    ("192.0.0.0/24", "reserved address (IETF protocol assignments)"),
    ("192.0.2.0/24", "reserved address (documentation)"),
    ("198.51.100.0/24", "reserved address (documentation)"),
    ("203.0.113.0/24", "reserved address (documentation)"),
    ("2001:db8::/32", "reserved address (documentation)"),
    ("198.18.0.0/15", "reserved address (benchmarking)"),
    ("240.0.0.0/4", "reserved address"),
    ("100::/64", "reserved address (discard)"),
    ("64:ff9b:1::/48", "reserved address (local NAT64)"),
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _unwrap(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (mapped, NAT64, 6to4), else ``ip``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


def is_blocked_ip(ip: str | IPAddress) -> str | None:
    """Why ``ip`` is refused (``"loopback address"``...), or ``None`` for a public address.

    Raises :class:`ValueError` when ``ip`` is not an IP address.
    """
    address = ipaddress.ip_address(ip.split("%", 1)[0] if isinstance(ip, str) else ip)
    # An address carrying IPv4 is judged by the IPv4 it carries (its IPv6 wrapper would
    # itself sit in a reserved range).
    inner = _unwrap(address)
    for network, reason in _BLOCKED:
        if inner.version == network.version and inner in network:
            return reason
    if not inner.is_global:
        return "non-public address"
    return None


def split_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of an http(s) URL; :class:`BlockedAddressError` for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BlockedAddressError(f"not an http(s) URL: {parts.scheme or '?'}://...")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise BlockedAddressError(f"invalid port in the URL of {parts.hostname}") from None
    return parts.hostname, port


_LEGACY_IPV4: Final = re.compile(r"(?i)[0-9a-fx.]*[0-9][0-9a-fx.]*")
# One part of a legacy IPv4 address, as C's strtoul reads it with base 0: hex, octal, decimal.
_PART: Final = re.compile(r"0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*")
# The highest value of the last part, by the number of parts before it (a, a.b, a.b.c).
_LAST_MAX: Final = (0xFFFFFFFF, 0xFFFFFF, 0xFFFF, 0xFF)


def ip_literal(host: str) -> IPAddress | None:
    """The address ``host`` spells, including the legacy IPv4 forms every resolver accepts
    (``127.1``, ``0x7f.0.0.1``, ``2130706433``), or ``None`` for a name."""
    text = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    return _legacy_ipv4(text) if _LEGACY_IPV4.fullmatch(text) else None


def _legacy_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """``text`` read as C's ``inet_aton`` reads it (glibc: parts as ``strtoul`` with base 0,
    ``a.b.c`` with ``c`` as 16 bits, ``a.b`` with ``b`` as 24 bits, ``a`` as 32 bits; checked
    against ``socket.inet_aton`` on 400,000 strings), without the socket module."""
    parts = text.split(".")
    if len(parts) > 4 or not all(_PART.fullmatch(part) for part in parts):
        return None
    values = [
        int(part[2:], 16) if part[:2] in ("0x", "0X") else int(part, 8 if part[0] == "0" else 10)
        for part in parts
    ]
    *head, last = values
    if any(value > 0xFF for value in head) or last > _LAST_MAX[len(head)]:
        return None
    number = last
    for i, value in enumerate(head):
        number |= value << (24 - 8 * i)
    return ipaddress.IPv4Address(number)


def is_localhost_name(host: str) -> bool:
    """``localhost`` or a name under ``.localhost``: loopback without asking DNS."""
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


@functools.lru_cache(maxsize=1024)  # the dispatcher asks about the same URLs on every POST
def literal_refusal(url: str, *, policy: AddressPolicy | None = None) -> str | None:
    """Why ``url`` can only reach a refused address, without asking DNS; else ``None``.

    Refused: a URL that is not http(s), an IP literal that ``policy`` (default
    :func:`is_blocked_ip`) refuses, and ``localhost`` names. A name that needs resolving
    gets ``None`` here: :func:`vet_host` judges it when connecting.
    """
    try:
        host, _port = split_url(url)
    except BlockedAddressError as exc:
        return exc.reason
    literal = ip_literal(host)
    if literal is not None:
        reason = (policy or is_blocked_ip)(str(literal))
        return None if reason is None else f"{literal} is a {reason}"
    if is_localhost_name(host):
        return f"{host} is a loopback name"
    return None
