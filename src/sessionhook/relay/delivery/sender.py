"""The HTTP clients that carry webhooks: one POST in, status / ``Retry-After`` / answer out.

A :class:`Poster` sends one request and reads at most ``body_limit`` bytes of the answer,
never following a redirect. :func:`~sessionhook.relay.delivery.post.post_event`
signs, bounds the whole exchange and turns failures into an ``AttemptResult``; the
posters only move bytes.

Neither hands its client the URL as stored: both hand it the URL
:func:`~sessionhook.relay.domain.addresses.destination` rebuilt on the host it read (IDNA,
percent-decoding, legacy IPv4 forms... normalized), parsed once by the client's own URL
class, and refuse it (nothing sent) when that class reads another host: the host judged is
the host connected to, whatever the client's normalization would have made of the original.

* :class:`AiohttpPoster` (the daemon's deliveries, ``endpoints test``, the ping of the
  management API and the console): aiohttp, chosen by measurement for the delivery path only
  (the Sessions API client stays on httpx). Its resolver is
  :func:`sessionhook.relay.delivery.resolve.vet_host`: a name is resolved ONCE per new connection,
  every address checked, and the connection goes to a vetted address (no DNS rebinding;
  ``Host`` and TLS SNI stay the URL's name). aiohttp does not ask the resolver about an IP
  literal, so literals are judged before each POST
  (:func:`~sessionhook.relay.domain.addresses.literal_refusal`). No proxy from the
  environment (a proxy would resolve the name itself). On this project's bench
  (``bench/throughput.py``, a bare loop of signed POSTs, 16 in flight, loopback receiver
  answering 204) httpx 0.28 spent 2.7-4.5 ms of CPU per POST and aiohttp 0.24-0.41 ms.
  Keep-alive holds (one pool, no per-host limit: the dispatcher bounds concurrency).
* :class:`HttpxPoster`: an injected ``httpx.AsyncClient``, for the transports tests and the
  demo put in place of the network (ASGI, mock); it judges no address (the dispatcher's
  guard and ``test_endpoint`` judge before it).

Errors::

    PostError           no usable answer (connection refused, reset, TLS, protocol error);
                        ``str()`` is one line for the delivery log
    NetguardError       (domain.addresses) the URL is refused: nothing was sent
"""

from __future__ import annotations

import socket
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

__all__ = [
    "AiohttpPoster",
    "Answer",
    "HttpxPoster",
    "PostError",
    "Poster",
    "VettingResolver",
    "aiohttp_target",
    "httpx_target",
]


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

    ``bounds_exchange``: ``True`` when :meth:`post` itself bounds the WHOLE exchange
    (connect, send, every byte of the answer) by ``timeout`` and raises ``TimeoutError``
    past it; ``post_event`` then sets no deadline of its own (one timer per POST, not two).
    ``False``: the caller bounds it (``post_event`` cancels the exchange)."""

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
    """``url`` as httpx is handed it: rebuilt on the host
    :func:`~sessionhook.relay.domain.addresses.destination` reads, parsed by ``httpx.URL``;
    :class:`UnusableUrlError` when httpx reads another host from it (or cannot parse it)."""
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
    """aiohttp's resolver hook on :func:`~sessionhook.relay.delivery.resolve.vet_host`: the only
    addresses aiohttp may connect to are the ones vetted here (raises
    :class:`~sessionhook.relay.domain.addresses.BlockedAddressError` or
    :class:`~sessionhook.relay.delivery.resolve.ResolutionError` otherwise)."""

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

    ``allow_private``, ``resolve`` and ``policy`` go to the vetting (tests inject a resolver
    and a policy). Create it inside a running event loop.

    aiohttp's ``ClientTimeout(total=timeout)`` covers the whole exchange, reading the
    answer included (a consumer dripping it byte by byte times out), so ``post_event``
    adds no deadline of its own: an anyio cancel scope per POST cost about 5 % of the
    relay's CPU per delivery on the bench.
    """

    bounds_exchange = True

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
            connector=aiohttp.TCPConnector(limit=0, use_dns_cache=False, resolver=resolver),
            # No cookies across consumers, no default headers beyond what we set.
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("Accept", "Accept-Encoding"),
            # The whole exchange is bounded by post_event; no client default cuts it.
            timeout=aiohttp.ClientTimeout(total=None),
            trust_env=False,
        )

    def _target(self, url: str) -> yarl.URL:
        """What aiohttp is handed for ``url`` (:func:`aiohttp_target`), its literal host
        judged (aiohttp connects to an IP literal without asking the resolver). Remembered
        per URL (the dispatcher posts to the same few URLs: parsing each one again was
        about 1 % of the CPU per delivery)."""
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
        bound = self._timeouts.get(timeout)
        if bound is None:
            if len(self._timeouts) >= 16:
                self._timeouts.clear()
            bound = self._timeouts[timeout] = aiohttp.ClientTimeout(total=timeout)
        try:
            async with self._session.post(
                target,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=bound,  # the whole exchange
            ) as response:
                received = bytearray()
                while len(received) < body_limit:
                    chunk = await response.content.read(body_limit - len(received))
                    if not chunk:
                        break
                    received += chunk
                return Answer(response.status, response.headers.get("retry-after"), bytes(received))
        except TimeoutError:
            raise
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise PostError(_one_line(exc)) from None

    async def aclose(self) -> None:
        """Close the session and its connections."""
        await self._session.close()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
