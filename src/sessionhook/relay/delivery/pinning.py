"""HTTP connections pinned to vetted addresses: the SSRF guard without a DNS-rebinding gap.

:class:`PinnedTransport` is an ``httpx.AsyncHTTPTransport`` whose connection pool opens
every new TCP connection through :class:`PinnedBackend`. Its ``connect_tcp(host, port)``
resolves ``host`` ONCE through :func:`sessionhook.relay.delivery.resolve.vet_host` (every address
checked, a single private one refuses the name) and connects to a vetted address, never to
the name. httpx and httpcore still take the ``Host`` header and the TLS server name (SNI,
certificate check) from the URL, so HTTPS works as usual; only the address lookup moved
here. A connection kept alive for reuse was vetted when it was opened.

A refused host raises :class:`~sessionhook.relay.domain.addresses.BlockedAddressError` out of
``http.send`` (and a name that does not resolve
:class:`~sessionhook.relay.delivery.resolve.ResolutionError`); ``post_event`` turns both into a
failed attempt. Nothing is sent to a refused address.

No proxy is used (``trust_env=False``): a proxy would resolve the name itself, out of reach
of the guard.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpcore
import httpx

from ..domain.addresses import AddressPolicy
from .resolve import Resolver, vet_host

__all__ = ["PinnedBackend", "PinnedTransport"]


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that connects only to addresses :func:`vet_host` vetted.

    ``allow_private``, ``resolve`` and ``policy`` are passed to :func:`vet_host`; ``backend``
    makes the actual connections (httpcore's anyio backend by default).
    """

    def __init__(
        self,
        *,
        allow_private: bool,
        resolve: Resolver | None = None,
        policy: AddressPolicy | None = None,
        backend: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        self.allow_private = allow_private
        self._resolve = resolve
        self._policy = policy
        self._backend = backend if backend is not None else httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's backend interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Vet ``host`` (resolving it once) and connect to the first vetted address that
        answers; raise the last connection error when none does."""
        addresses = await vet_host(
            host,
            port,
            allow_private=self.allow_private,
            resolve=self._resolve,
            policy=self._policy,
        )
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._backend.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None  # vet_host never returns an empty list
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's backend interface
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Refused: endpoints are URLs, never local sockets."""
        raise httpcore.ConnectError("unix sockets are not used for deliveries")

    async def sleep(self, seconds: float) -> None:
        """Sleep (httpcore's retry and keep-alive bookkeeping use it)."""
        await self._backend.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` whose connections go through :class:`PinnedBackend`.

    Use it as the transport of the webhook client:
    ``httpx.AsyncClient(transport=PinnedTransport(allow_private=False))``.
    """

    def __init__(
        self,
        *,
        allow_private: bool,
        resolve: Resolver | None = None,
        policy: AddressPolicy | None = None,
        limits: httpx.Limits = httpx.Limits(max_connections=100, max_keepalive_connections=20),
        verify: bool = True,
    ) -> None:
        super().__init__(verify=verify, trust_env=False, limits=limits)
        #: The backend, for tests and for reading its ``allow_private``.
        self.backend = PinnedBackend(allow_private=allow_private, resolve=resolve, policy=policy)
        # httpx offers no argument for the network backend, so the pool it built is
        # replaced by the same pool on ours (tests/test_pinning.py fails if this stops
        # taking effect: they check which address a real connection reached).
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=self.backend,
        )
