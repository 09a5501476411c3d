"""Resolving an endpoint's name once, and vetting every address it resolves to.

:func:`vet_host` resolves a name ONCE, refuses it if any address is not public
(:mod:`sessionhook.relay.domain.addresses`) and returns the vetted addresses, to which the
caller must connect without resolving again: a second lookup would let DNS answer
``127.0.0.1`` to the connection (rebinding). The sender's aiohttp client uses it as its
resolver, so ``Host`` and TLS SNI stay the URL's name.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Awaitable, Callable

import anyio.to_thread

from ..domain.addresses import (
    AddressPolicy,
    BlockedAddressError,
    NetguardError,
    destination,
    ip_literal,
    is_blocked_ip,
    is_localhost_name,
)

#: ``async (host, port) -> [address text, ...]``; tests inject one instead of real DNS.
Resolver = Callable[[str, int], Awaitable[list[str]]]


class ResolutionError(NetguardError):
    """The URL's host name could not be resolved."""


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


async def vet_host(
    host: str,
    port: int,
    *,
    allow_private: bool,
    resolve: Resolver | None = None,
    policy: AddressPolicy | None = None,
) -> list[str]:
    """Resolve ``host`` once and return the addresses a connection may use, in order.

    An IP literal is checked as is, ``localhost`` names are refused without DNS, and every
    address of any other name must pass ``policy``; ``allow_private`` refuses nothing but
    still resolves once. Raises :class:`BlockedAddressError` or :class:`ResolutionError`.
    """
    judge = policy or is_blocked_ip
    literal = ip_literal(host)
    if literal is not None:
        if not allow_private and (reason := judge(str(literal))) is not None:
            raise BlockedAddressError(f"{literal} is a {reason}")
        return [str(literal)]
    if not allow_private and is_localhost_name(host):
        raise BlockedAddressError(f"{host} is a loopback name")
    addresses = await (resolve or resolve_host)(host, port)
    if not addresses:
        raise ResolutionError(f"{host} resolves to no address")
    vetted = []
    for text in addresses:
        address = ip_literal(text)
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
    """Vet the host ``url`` leads to and return the addresses it may connect to (only
    those); :class:`NetguardError` when the URL is refused or does not resolve."""
    target = destination(url)
    return await vet_host(
        target.host, target.port, allow_private=allow_private, resolve=resolve, policy=policy
    )
