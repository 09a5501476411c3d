"""Which addresses the relay may send webhooks to: the pure half of the SSRF guard (no DNS,
no socket; the DNS half is :mod:`sessionhook.relay.delivery.resolve`).

:func:`is_blocked_ip` says why an address is not public (IPv4 embedded in IPv6 unwrapped
first), the default ``AddressPolicy``; :func:`ip_literal` reads the address a host spells,
legacy IPv4 forms included. :func:`destination` is the one reading of an endpoint URL: the
host after the normalization HTTP clients apply (percent-decoding, IDNA/UTS-46, legacy IPv4)
and the URL rebuilt on it, so the host judged is the host connected to; a host still not
plain is an :class:`UnusableUrlError`. :func:`literal_refusal` judges a URL without
resolving anything. The rules in full: docs/domain.md, "Address rules".

Errors::

    NetguardError
    +-- BlockedAddressError   the URL is refused; ``reason`` says which address and why
    +-- UnusableUrlError      not an http(s) URL, or no plain host once normalized
    +-- ResolutionError       (sessionhook.relay.delivery.resolve) the host name did not resolve
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, unquote

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


class UnusableUrlError(NetguardError):
    """Not an http(s) URL, or its host is no plain name or address once normalized (what
    :func:`destination` refuses, whatever ``allow_private_networks`` says)."""


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


@dataclass(frozen=True, slots=True)
class Destination:
    """Where an endpoint URL leads, as :func:`destination` reads it."""

    #: The URL rebuilt on :attr:`host`: what a sender hands its HTTP client.
    url: str
    #: The host connected to: a lower-case ASCII name (IDNA A-labels, a trailing dot kept)
    #: or an IP address's text (IPv6 compressed, without brackets).
    host: str
    port: int
    #: The address :attr:`host` spells; ``None`` for a name (resolved when connecting).
    address: IPAddress | None
    #: The host as the URL spells it (for messages: what the operator wrote).
    written: str

    @property
    def shown(self) -> str:
        """The host for a message: as written, and what it means when that differs
        (``0x7f.1 (127.0.0.1)``); escaped when it holds what a terminal would not show."""
        written = _shown(self.written)
        same = written.lower().removeprefix("[").removesuffix("]") == self.host
        return self.host if same else f"{written} ({self.host})"


# A label of a plain host name: ASCII letters (lower case by now), digits, '-' and '_'.
_LABEL: Final = re.compile(r"[a-z0-9_-]{1,63}")
# A last label that makes the host an IPv4 address, as the URL standard (WHATWG) reads it:
# digits, or 0x and hex digits. Such a host must then be an address.
_NUMERIC: Final = re.compile(r"[0-9]+|0x[0-9a-f]*")
# What a URL may never hold for the senders: controls and spaces (urllib and yarl delete tabs
# and newlines before parsing, so the URL judged and the URL sent would differ).
_CONTROLS: Final = re.compile(r"[\x00-\x20\x7f]")
# userinfo characters kept as they are (RFC 3986), '%' for escapes already there: '@' and
# anything else is percent-encoded so that only one '@' ends the userinfo.
_USERINFO_SAFE: Final = "%!$&'()*+,;=:"


def destination(url: str) -> Destination:
    """Where ``url`` leads: the host a client connects to, after the normalization HTTP
    clients apply, and ``url`` rebuilt on it (see the module docstring).

    The host is percent-decoded, mapped by IDNA/UTS-46 when it is not ASCII (as yarl maps
    it, falling back to IDNA 2003 like yarl), put in lower case, and read as an IP address
    when it is one (legacy IPv4 forms and a trailing dot included; IPv6 compressed). The
    userinfo keeps its text with ``@`` and non-ASCII characters percent-encoded; the path,
    query and fragment are kept as written.

    Raises :class:`UnusableUrlError` (one line) for a URL that is not http(s), holds a space
    or a control character, has a bad port, or whose host is no plain name (labels of
    ``a-z 0-9 - _``) or IP address once normalized. Judges nothing: see
    :func:`literal_refusal` and :func:`is_blocked_ip`.
    """
    if _CONTROLS.search(url):
        raise UnusableUrlError("the URL holds a space or a control character")
    scheme, colon, rest = url.partition(":")
    scheme = scheme.lower()
    if not colon or scheme not in ("http", "https") or not rest.startswith("//"):
        raise UnusableUrlError(f"not an http(s) URL: {scheme or '?'}://...")
    rest = rest[2:]
    # The authority ends at the first '/', '?' or '#', for urllib, yarl and httpx alike.
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "\\" in authority:
        raise UnusableUrlError("a backslash in the URL's host part")
    userinfo, at, hostport = authority.rpartition("@")
    written, port_text = _host_and_port(hostport)
    host, address = _plain_host(written)
    default = 443 if scheme == "https" else 80
    if not port_text:
        port = default
    elif port_text.isdecimal() and len(port_text) <= 5 and 0 < int(port_text) <= 0xFFFF:
        port = int(port_text)
    else:
        raise UnusableUrlError(f"invalid port in the URL of {host}")
    netloc = f"[{host}]" if isinstance(address, ipaddress.IPv6Address) else host
    if port_text:
        netloc += f":{port}"
    if at and userinfo:
        netloc = f"{quote(userinfo, safe=_USERINFO_SAFE)}@{netloc}"
    return Destination(f"{scheme}://{netloc}{tail}", host, port, address, written)


def _host_and_port(hostport: str) -> tuple[str, str]:
    """The host (brackets kept) and the port text of ``host:port``, as urllib and yarl
    split them."""
    if hostport.startswith("["):
        inside, bracket, after = hostport[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise UnusableUrlError(f"the URL's host part {_shown(hostport)} is no [IPv6]:port")
        return f"[{inside}]", after[1:]
    if "[" in hostport or "]" in hostport:
        raise UnusableUrlError("a bracket in the URL's host")
    host, _colon, port = hostport.partition(":")
    return host, port


def _plain_host(written: str) -> tuple[str, IPAddress | None]:
    """``(host, address)`` of the host ``written`` (see :func:`destination`)."""
    shown = _shown(written)
    if not written:
        raise UnusableUrlError("the URL has no host")
    if written.startswith("["):
        try:
            # A zone (fe80::1%eth0) names an interface of this machine: not a webhook's.
            v6 = None if "%" in written else ipaddress.IPv6Address(written[1:-1])
        except ValueError:
            v6 = None
        if v6 is None:
            raise UnusableUrlError(f"the host {shown} is no IPv6 address (without a zone)")
        return v6.compressed, v6
    host = written
    if "%" in host:
        try:
            host = unquote(host, errors="strict")
        except UnicodeDecodeError:
            raise UnusableUrlError(f"the host {shown} decodes to no UTF-8 text") from None
    host = host.lower() if host.isascii() else _idna(host, shown)
    name = host.removesuffix(".")
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise UnusableUrlError(f"the host {shown} is no host name or IP address")
    if _NUMERIC.fullmatch(labels[-1]):
        address = ip_literal(name)
        if address is None:
            raise UnusableUrlError(f"the host {shown} ends like an IPv4 address but is none")
        return str(address), address
    return host, None


def _shown(text: str) -> str:
    """``text`` for a one-line message: escaped when a terminal would not show it as is
    (controls, bidi overrides), cut at 100 characters."""
    return (text if text.isprintable() else ascii(text)[1:-1])[:100]


def _idna(host: str, shown: str) -> str:
    """``host`` (not ASCII) as IDNA A-labels: UTS-46 mapping first (IDNA 2008), else
    IDNA 2003's nameprep, as yarl (aiohttp's URLs) does; lower case."""
    import idna  # loaded for a non-ASCII host only (~30 ms)

    try:
        return idna.encode(host, uts46=True).decode("ascii").lower()
    except UnicodeError:
        pass
    try:
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise UnusableUrlError(f"the host {shown} is no valid international name") from None


@functools.lru_cache(maxsize=1024)  # the dispatcher asks about the same URLs on every POST
def literal_refusal(url: str, *, policy: AddressPolicy | None = None) -> str | None:
    """Why ``url`` can only reach a refused address, without asking DNS; else ``None``.

    Refused: what :func:`destination` refuses, an IP literal that ``policy`` (default
    :func:`is_blocked_ip`) refuses, and ``localhost`` names, all judged on the host
    :func:`destination` reads (``http://127.1/`` is ``127.0.0.1``). A name that needs
    resolving gets ``None`` here: :func:`vet_host` judges it when connecting.
    """
    try:
        target = destination(url)
    except UnusableUrlError as exc:
        return exc.reason
    if target.address is not None:
        reason = (policy or is_blocked_ip)(target.host)
        return None if reason is None else f"{target.shown} is a {reason}"
    if is_localhost_name(target.host):
        return f"{target.shown} is a loopback name"
    return None
