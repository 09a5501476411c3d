"""The HTTP clients that carry webhooks: one POST in, status / ``Retry-After`` / answer out.

A :class:`Poster` sends one request, reads at most ``body_limit`` bytes of the answer and
never follows a redirect; :func:`~sessionhook.relay.delivery.post.post_event` signs and
bounds the exchange. Both hand their client the URL
:func:`~sessionhook.relay.domain.addresses.destination` rebuilt, and refuse it (nothing
sent) when the client's URL class reads another host: the host judged is the host
connected to.

* :class:`AiohttpPoster` (deliveries, ``endpoints test``, pings, ``listen --forward-to``):
  its resolver vets every address of a name once per new connection (no DNS rebinding);
  IP literals are judged before each POST; no proxy from the environment. On
  ``bench/throughput.py`` httpx 0.28 spent 2.7-4.5 ms of CPU per POST, aiohttp 0.24-0.41 ms.
* :class:`HttpxPoster`: an injected ``httpx.AsyncClient`` (ASGI or mock transports in
  tests and the demo); it judges no address.

Errors::

    PostError           no usable answer (connection refused, reset, TLS, protocol error);
                        ``str()`` is one line for the delivery log
    NetguardError       (domain.addresses) the URL is refused: nothing was sent
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

import aiohttp
import aiohttp.abc
import httpx
import yarl

from ..domain.addresses import (
    AddressPolicy,
    BlockedAddressError,
    NetguardError,
    UnusableUrlError,
    destination,
    literal_refusal,
)
from .resolve import Resolver, vet_host

_U = TypeVar("_U", httpx.URL, yarl.URL)


class PostError(Exception):
    """The POST got no usable answer; the message is one line (``Type: detail``)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What came back: the status, the ``Retry-After`` header, the first bytes of the body."""

    status: int
    retry_after: str | None
    body: bytes


class Poster(Protocol):
    """Sends one POST; raises :class:`PostError` when no answer came.

    ``bounds_exchange``: whether :meth:`post` itself bounds the WHOLE exchange by
    ``timeout`` (raising ``TimeoutError``); if not, ``post_event`` does."""

    bounds_exchange: bool

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float,  # noqa: ASYNC109 - handed to the client; post_event bounds the whole
        body_limit: int,
    ) -> Answer: ...

    async def aclose(self) -> None: ...


class HttpxPoster:
    """A :class:`Poster` over an injected ``httpx.AsyncClient`` (not closed by us); httpx
    bounds each operation, not the whole exchange: ``post_event`` does."""

    bounds_exchange = False

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float,  # noqa: ASYNC109 - handed to the client; post_event bounds the whole
        body_limit: int,
    ) -> Answer:
        """See :class:`Poster`; a URL :func:`httpx_target` refuses raises
        :class:`~sessionhook.relay.domain.addresses.UnusableUrlError` (nothing is sent)."""
        target = httpx_target(url)
        try:
            # Per request: the client's own default timeout (httpx: 5 s) must not cut an
            # attempt that delivery.timeout allows.
            request = self.http.build_request(
                "POST",
                target,
                content=body,
                headers=dict(headers),
                timeout=httpx.Timeout(timeout),
            )
            response = await self.http.send(request, stream=True, follow_redirects=False)
            received = bytearray()
            try:
                async for chunk in response.aiter_bytes():
                    received += chunk
                    if len(received) >= body_limit:
                        break
            finally:
                await response.aclose()
        except httpx.TimeoutException:
            raise TimeoutError from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise PostError(_one_line(exc)) from None
        return Answer(response.status_code, response.headers.get("retry-after"), bytes(received))

    async def aclose(self) -> None:
        """Nothing to do: the client belongs to whoever passed it."""


def httpx_target(url: str) -> httpx.URL:
    """``url`` rebuilt on the host :func:`~sessionhook.relay.domain.addresses.destination`
    reads, parsed by ``httpx.URL``; :class:`UnusableUrlError` when httpx reads another host."""
    return _client_target(url, "httpx", httpx.URL, lambda u: u.raw_host.decode("ascii", "replace"))


def aiohttp_target(url: str) -> yarl.URL:
    """As :func:`httpx_target`, for aiohttp: parsed by ``yarl.URL``."""
    return _client_target(url, "aiohttp", yarl.URL, lambda u: u.raw_host)


def _client_target(
    url: str, client: str, parse: Callable[[str], _U], host_of: Callable[[_U], str | None]
) -> _U:
    target = destination(url)
    try:
        parsed = parse(target.url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise UnusableUrlError(f"{client} cannot read the URL of {target.shown}: {exc}") from None
    read = host_of(parsed)
    if read != target.host:
        raise UnusableUrlError(f"{client} reads the host of {target.shown} as {read}")
    return parsed


class VettingResolver(aiohttp.abc.AbstractResolver):
    """aiohttp's resolver hook on :func:`~sessionhook.relay.delivery.resolve.vet_host`:
    aiohttp may connect only to the addresses vetted here."""

    def __init__(
        self,
        *,
        allow_private: bool,
        resolve: Resolver | None = None,
        policy: AddressPolicy | None = None,
    ) -> None:
        self.allow_private = allow_private
        self._resolve = resolve
        self._policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        """The vetted addresses of ``host`` (``family`` is not narrowed: any vetted one)."""
        addresses = await vet_host(
            host, port, allow_private=self.allow_private, resolve=self._resolve, policy=self._policy
        )
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for address in addresses
        ]

    async def close(self) -> None:
        """Nothing to release."""


class AiohttpPoster:
    """The daemon's :class:`Poster`: one aiohttp session, keep-alive connections, every
    connection to an address :func:`~sessionhook.relay.delivery.resolve.vet_host` vetted.
    Create it inside a running event loop.

    ``ClientTimeout(total=timeout)`` covers the whole exchange, so ``post_event`` adds no
    deadline (a cancel scope per POST cost about 5 % of the CPU per delivery).

    A receiver may close an idle connection just as a POST goes out on it. So an idle
    connection is kept only ``IDLE_KEEP_S`` (under the 5 s of Node's and uvicorn's servers),
    and a POST whose connection closes before the answer's status line is sent once more,
    at once, within the same ``timeout`` (aiohttp does so for idempotent methods only; a
    webhook is one by its ``webhook-id``, which receivers dedupe on).
    """

    bounds_exchange = True
    #: Seconds an idle connection is kept for the next POST (aiohttp's default is 15).
    IDLE_KEEP_S = 4.0

    def __init__(
        self,
        *,
        allow_private: bool,
        resolve: Resolver | None = None,
        policy: AddressPolicy | None = None,
    ) -> None:
        self.allow_private = allow_private
        self._policy = policy
        # Per URL, what aiohttp is handed, or the refusal (its class and reason).
        self._targets: dict[str, yarl.URL | tuple[type[NetguardError], str]] = {}
        # One ClientTimeout per delivery.timeout value (immutable, so shared by every POST).
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        resolver = VettingResolver(allow_private=allow_private, resolve=resolve, policy=policy)
        self._session = aiohttp.ClientSession(
            # No per-host limit (the dispatcher bounds concurrency); no DNS cache: each new
            # connection is vetted afresh, and a kept-alive one was vetted when opened.
            connector=aiohttp.TCPConnector(
                limit=0,
                use_dns_cache=False,
                resolver=resolver,
                keepalive_timeout=self.IDLE_KEEP_S,
            ),
            # No cookies across consumers, no default headers beyond what we set.
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("Accept", "Accept-Encoding"),
            # The whole exchange is bounded by post_event; no client default cuts it.
            timeout=aiohttp.ClientTimeout(total=None),
            trust_env=False,
        )

    def _target(self, url: str) -> yarl.URL:
        """What aiohttp is handed for ``url``, its literal host judged (aiohttp does not
        ask the resolver about one); remembered per URL (1 % of the CPU per delivery)."""
        known = self._targets.get(url)
        if known is None:
            try:
                known = aiohttp_target(url)
                refusal = None if self.allow_private else literal_refusal(url, policy=self._policy)
                if refusal is not None:
                    known = (BlockedAddressError, refusal)
            except NetguardError as exc:
                known = (type(exc), exc.reason)
            if len(self._targets) >= 1024:
                self._targets.clear()
            self._targets[url] = known
        if isinstance(known, tuple):
            kind, reason = known
            raise kind(reason)
        return known

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float,  # noqa: ASYNC109 - handed to the client; post_event bounds the whole
        body_limit: int,
    ) -> Answer:
        """See :class:`Poster`; a refused URL or address raises
        :class:`~sessionhook.relay.domain.addresses.NetguardError` (nothing is sent)."""
        target = self._target(url)
        started = time.monotonic()
        bound = self._timeouts.get(timeout)
        if bound is None:
            if len(self._timeouts) >= 16:
                self._timeouts.clear()
            bound = self._timeouts[timeout] = aiohttp.ClientTimeout(total=timeout)
        try:
            try:
                return await self._exchange(target, body, headers, bound, body_limit)
            except _Unanswered:
                # Closed before any answer: once more, in what is left of the bound.
                left = timeout - (time.monotonic() - started)
                if left <= 0:
                    raise TimeoutError from None
                bound = aiohttp.ClientTimeout(total=left)
                return await self._exchange(target, body, headers, bound, body_limit)
        except _Unanswered as unanswered:
            raise PostError(_one_line(unanswered.cause)) from None
        except TimeoutError:
            raise
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise PostError(_one_line(exc)) from None

    async def _exchange(
        self,
        target: yarl.URL,
        body: bytes,
        headers: Mapping[str, str],
        bound: aiohttp.ClientTimeout,
        body_limit: int,
    ) -> Answer:
        """One POST; :class:`_Unanswered` when the connection closed before the status line."""
        try:
            response = await self._session.post(
                target,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=bound,  # the whole exchange
            )
        except aiohttp.ClientConnectorError:
            raise  # no connection was made: nothing to send again
        except (
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientConnectionResetError,
            aiohttp.ClientOSError,
        ) as exc:
            raise _Unanswered(exc) from None
        async with response:
            received = bytearray()
            while len(received) < body_limit:
                chunk = await response.content.read(body_limit - len(received))
                if not chunk:
                    break
                received += chunk
            return Answer(response.status, response.headers.get("retry-after"), bytes(received))

    async def aclose(self) -> None:
        """Close the session and its connections."""
        await self._session.close()


class _Unanswered(Exception):
    """The connection closed (or was reset) before the answer's status line."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
