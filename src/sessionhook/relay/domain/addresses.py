"""SSRF guard: may the relay connect to this endpoint, and to which address?

Unless ``delivery.allow_private_networks`` is set, an endpoint whose host is, or resolves to,
an address that is not public is refused: loopback, private (RFC 1918, ULA ``fc00::/7``),
link-local, cloud metadata (``169.254.169.254``, ``fd00:ec2::254``, ``100.100.100.200``),
unspecified, carrier-grade NAT ``100.64.0.0/10``, multicast, broadcast, documentation and
other reserved ranges. IPv4 embedded in IPv6 (``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``,
6to4 ``2002::/16``) is unwrapped first, so it cannot smuggle a private IPv4 address.

Resolve once, connect to what was checked. :func:`vet_host` resolves a name ONCE, refuses
it if any address is not public (a name with one public and one private address is
refused), and returns the vetted addresses; the caller must connect to one of those and
never resolve the name again. Checking a name and letting the HTTP client resolve it a
second time would let DNS answer a public address to the check and ``127.0.0.1`` to the
connection (DNS rebinding). :mod:`sessionhook.relay.delivery.pinning` does this for httpx (a network
backend whose ``connect_tcp`` connects only to vetted addresses, so the ``Host`` header and
TLS SNI stay the URL's name); another HTTP client uses :func:`vet_host` as its resolver.

:func:`literal_refusal` is the DNS-free part: a URL whose host can only be private (an IP
literal in a refused range, ``localhost``) is refused without resolving anything; the config
refuses such endpoints at load time.

What counts as public is :func:`is_blocked_ip`, replaceable by an ``AddressPolicy`` (tests
treat ``127.0.0.2`` as public to exercise the pinning on loopback only).

Errors::

    NetguardError
    +-- BlockedAddressError   the URL is refused; ``reason`` says which address and why
    +-- ResolutionError       the host name did not resolve (a transient failure, retry)
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import anyio.to_thread

__all__ = [
    "AddressPolicy",
    "BlockedAddressError",
    "NetguardError",
    "ResolutionError",
    "Resolver",
    "blocked_reason",
    "check_url",
    "is_blocked_ip",
    "literal_refusal",
    "resolve_host",
    "vet_host",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: ``async (host, port) -> [address text, ...]``; tests inject one instead of real DNS.
Resolver = Callable[[str, int], Awaitable[list[str]]]
#: ``address text -> refusal reason`` (``None``: public); :func:`is_blocked_ip` by default.
AddressPolicy = Callable[[str], str | None]


class NetguardError(Exception):
    """Base of the guard's refusals; ``reason`` is one line for logs and the delivery log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BlockedAddressError(NetguardError):
    """The URL's host is or resolves to an address that is not public."""


class ResolutionError(NetguardError):
    """The URL's host name could not be resolved."""


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


async def resolve_host(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (``getaddrinfo`` in a worker thread)."""
    try:
        # getaddrinfo cannot be interrupted; a caller's deadline must not wait for it.
        infos = await anyio.to_thread.run_sync(
            functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM),
            abandon_on_cancel=True,
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise ResolutionError(f"cannot resolve {host}: {exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _split(url: str) -> tuple[str, int]:
    """``(host, port)`` of an http(s) URL; :class:`BlockedAddressError` for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BlockedAddressError(f"not an http(s) URL: {parts.scheme or '?'}://...")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise BlockedAddressError(f"invalid port in the URL of {parts.hostname}") from None
    return parts.hostname, port


_LEGACY_IPV4 = re.compile(r"(?i)[0-9a-fx.]*[0-9][0-9a-fx.]*")


def _literal(host: str) -> IPAddress | None:
    """The address ``host`` spells, including the legacy IPv4 forms every resolver accepts
    (``127.1``, ``0x7f.0.0.1``, ``2130706433``), or ``None`` for a name."""
    text = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if _LEGACY_IPV4.fullmatch(text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def _is_localhost(host: str) -> bool:
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
        host, _port = _split(url)
    except BlockedAddressError as exc:
        return exc.reason
    literal = _literal(host)
    if literal is not None:
        reason = (policy or is_blocked_ip)(str(literal))
        return None if reason is None else f"{literal} is a {reason}"
    if _is_localhost(host):
        return f"{host} is a loopback name"
    return None


async def vet_host(
    host: str,
    port: int,
    *,
    allow_private: bool,
    resolve: Resolver | None = None,
    policy: AddressPolicy | None = None,
) -> list[str]:
    """Resolve ``host`` once and return the addresses a connection may use, in order.

    An IP literal is checked as is; ``localhost`` names are refused without asking DNS;
    any other name is resolved (``resolve``, default :func:`resolve_host`) and EVERY
    address must pass ``policy`` (default :func:`is_blocked_ip`). With ``allow_private``
    nothing is refused, but the name is still resolved here, once. Connect only to the
    addresses returned: resolving the name again would undo the check.

    Raises :class:`BlockedAddressError` or :class:`ResolutionError`.
    """
    judge = policy or is_blocked_ip
    literal = _literal(host)
    if literal is not None:
        if not allow_private and (reason := judge(str(literal))) is not None:
            raise BlockedAddressError(f"{literal} is a {reason}")
        return [str(literal)]
    if not allow_private and _is_localhost(host):
        raise BlockedAddressError(f"{host} is a loopback name")
    addresses = await (resolve or resolve_host)(host, port)
    if not addresses:
        raise ResolutionError(f"{host} resolves to no address")
    vetted = []
    for text in addresses:
        address = _literal(text)
        if address is None:
            raise ResolutionError(f"{host} resolved to a non-address {text!r}")
        if not allow_private and (reason := judge(str(address))) is not None:
            raise BlockedAddressError(f"{host} resolves to {text}, a {reason}")
        vetted.append(str(address))
    return vetted


async def check_url(
    url: str,
    *,
    allow_private: bool,
    resolve: Resolver | None = None,
    policy: AddressPolicy | None = None,
) -> list[str]:
    """Vet ``url``'s host (:func:`vet_host`) and return the addresses it may connect to.

    Raises :class:`NetguardError` when the URL is refused or does not resolve. Only the
    returned addresses are safe to connect to: do not hand the URL to a client that
    resolves it again (see :mod:`sessionhook.relay.delivery.pinning`).
    """
    host, port = _split(url)
    return await vet_host(host, port, allow_private=allow_private, resolve=resolve, policy=policy)


async def blocked_reason(
    url: str,
    *,
    allow_private: bool = False,
    resolve: Resolver | None = None,
    policy: AddressPolicy | None = None,
) -> str | None:
    """:func:`check_url` as a value: the refusal reason, or ``None`` when allowed."""
    try:
        await check_url(url, allow_private=allow_private, resolve=resolve, policy=policy)
    except NetguardError as exc:
        return exc.reason
    return None
