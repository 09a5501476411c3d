"""``listen --forward-to``'s way to the developer's consumer: the webhook sender's.

The forwarder POSTs through the delivery path (:func:`~sessionhook.relay.delivery.post.post_event`
over :class:`~sessionhook.relay.delivery.sender.AiohttpPoster`), so the URL it reaches is
the one :func:`~sessionhook.relay.domain.addresses.destination` reads, as for a delivery.
Private and loopback addresses are allowed: forwarding to this machine is the command's
purpose.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import httpx

from ..delivery.post import post_event
from ..delivery.sender import AiohttpPoster, HttpxPoster, aiohttp_target
from ..delivery.sender import Poster as Poster  # the CLI's type of a forwarder
from ..domain.addresses import destination
from ..domain.retry import AttemptResult


def forward_target(url: str) -> str:
    """``url`` rebuilt on the host :func:`~sessionhook.relay.domain.addresses.destination`
    reads (``http://0x7f.1:3000/`` is ``http://127.0.0.1:3000/``), what every POST goes to.

    Raises :class:`~sessionhook.relay.domain.addresses.UnusableUrlError` (one line) for a
    URL that is not http(s), or whose host is no plain name or address once normalized, or
    that the sender's client would read as another host."""
    target = destination(url)
    aiohttp_target(target.url)
    return target.url


@asynccontextmanager
async def forward_poster(
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[Poster]:
    """The deliveries' aiohttp poster, private networks allowed, closed at the end; or an
    httpx client on ``transport`` (a stand-in for the network, in tests)."""
    if transport is not None:
        async with httpx.AsyncClient(transport=transport, follow_redirects=False) as http:
            yield HttpxPoster(http)
        return
    poster = AiohttpPoster(allow_private=True)
    try:
        yield poster
    finally:
        await poster.aclose()


async def forward_event(
    poster: Poster | httpx.AsyncClient,
    url: str,
    secrets: Sequence[str],
    event_id: str,
    body: bytes,
    *,
    timeout: float,  # noqa: ASYNC109 - post_event bounds the whole exchange by it
    user_agent: str,
) -> AttemptResult:
    """One signed POST of ``body`` to ``url`` (:func:`post_event`: fresh timestamp, no
    redirect followed); only the answer's status is read. Never raises for the network."""
    return await post_event(
        poster,
        url=url,
        secrets=secrets,
        event_id=event_id,
        body=body,
        timeout=timeout,
        body_limit=0,
        user_agent=user_agent,
    )
