"""The HTTP clients that carry webhooks: one POST in, status / ``Retry-After`` / answer out.

A :class:`Poster` sends one request and reads at most ``body_limit`` bytes of the answer,
never following a redirect. :func:`~sessionhook.relay.delivery.post.post_event`
signs, bounds the whole exchange and turns failures into an ``AttemptResult``; the
posters only move bytes.

* :class:`AiohttpPoster` (what the daemon uses): aiohttp, chosen by measurement for the
  delivery path only (the Sessions API client stays on httpx). Its resolver is
  :func:`sessionhook.relay.delivery.resolve.vet_host`: a name is resolved ONCE per new connection,
  every address checked, and the connection goes to a vetted address (no DNS rebinding;
  ``Host`` and TLS SNI stay the URL's name). aiohttp does not ask the resolver about an IP
  literal, so literals are vetted before each POST with the same function. No proxy from
  the environment (a proxy would resolve the name itself). On this project's bench
  (``bench/throughput.py``, a bare loop of signed POSTs, 16 in flight, loopback receiver
  answering 204) httpx 0.28 spent 2.7-4.5 ms of CPU per POST and aiohttp 0.24-0.41 ms.
  Keep-alive holds (one pool, no per-host limit: the dispatcher bounds concurrency).
* :class:`HttpxPoster`: an injected ``httpx.AsyncClient``; tests, the demo and
  ``endpoints test`` hand it ASGI or mock transports.

Errors::

    PostError           no usable answer (connection refused, reset, TLS, protocol error);
                        ``str()`` is one line for the delivery log
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp
import aiohttp.abc
import httpx

from ..domain.addresses import AddressPolicy, BlockedAddressError, is_blocked_ip
from .resolve import Resolver, vet_host

__all__ = ["AiohttpPoster", "Answer", "HttpxPoster", "PostError", "Poster", "VettingResolver"]


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
        """See :class:`Poster`."""
        try:
            # Per request: the client's own default timeout (httpx: 5 s) must not cut an
            # attempt that delivery.timeout allows.
            request = self.http.build_request(
                "POST", url, content=body, headers=dict(headers), timeout=httpx.Timeout(timeout)
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
        except httpx.HTTPError as exc:
            raise PostError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
        return Answer(response.status_code, response.headers.get("retry-after"), bytes(received))

    async def aclose(self) -> None:
        """Nothing to do: the client belongs to whoever passed it."""


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
        # Per URL, why its literal host is refused (aiohttp does not resolve literals).
        self._literals: dict[str, str | None] = {}
        # One ClientTimeout per delivery.timeout value (immutable; built per POST before).
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

    def _vet_literal(self, url: str) -> None:
        """aiohttp connects to an IP literal without asking the resolver: judge it here.
        Remembered per URL (the dispatcher posts to the same few URLs: parsing each one
        again was about 1 % of the CPU per delivery)."""
        if url not in self._literals:
            host = urlsplit(url).hostname or ""
            reason: str | None = None
            if not self.allow_private:
                try:
                    literal = ipaddress.ip_address(host.split("%", 1)[0])
                except ValueError:
                    literal = None  # a name: the resolver vets it at connect time
                if literal is not None:
                    why = (self._policy or is_blocked_ip)(str(literal))
                    reason = None if why is None else f"{literal} is a {why}"
            if len(self._literals) >= 1024:
                self._literals.clear()
            self._literals[url] = reason
        refusal = self._literals[url]
        if refusal is not None:
            raise BlockedAddressError(refusal)

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float,  # noqa: ASYNC109 - handed to the client; post_event bounds the whole
        body_limit: int,
    ) -> Answer:
        """See :class:`Poster`; a refused address raises
        :class:`~sessionhook.relay.domain.addresses.NetguardError` (nothing is sent)."""
        self._vet_literal(url)
        bound = self._timeouts.get(timeout)
        if bound is None:
            if len(self._timeouts) >= 16:
                self._timeouts.clear()
            bound = self._timeouts[timeout] = aiohttp.ClientTimeout(total=timeout)
        try:
            async with self._session.post(
                url,
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
