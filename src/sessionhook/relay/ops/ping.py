"""The endpoint test: a signed ``ping`` POSTed now, never archived, never retried."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Final

import httpx

from sessionhook.api.models import Session

from ..config import Config, EndpointConfig
from ..delivery.post import post_event, refused
from ..delivery.render_process import Renderer, RenderProcess
from ..delivery.resolve import Resolver
from ..delivery.sender import AiohttpPoster, HttpxPoster, Poster
from ..domain import render
from ..domain.addresses import AddressPolicy, UnusableUrlError, destination, literal_refusal
from ..domain.events import session_summary
from ..domain.retry import AttemptResult
from .errors import OperatorError, shown_name, shown_names

#: Type of the event ``endpoints test`` sends (never archived, never retried).
PING_TYPE: Final = "ping"


def ping_event(endpoint: str, now: float) -> tuple[str, bytes]:
    """A fresh ``(event id, body)`` for an endpoint test: never archived, unique id.

    The body has the envelope of every event (``type``, ``timestamp``, ``data.session``),
    with an empty session, so that a consumer written against the documented shape does
    not fail on the ping itself and the answer reflects its reachability and signature
    check; ``type`` is ``ping``, which a consumer can acknowledge and ignore.
    """
    event_id = "evt_" + secrets.token_hex(16)
    body: dict[str, Any] = {
        "type": PING_TYPE,
        "timestamp": datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z"),
        "data": {
            "session": session_summary(Session(name="")),
            "endpoint": endpoint,
            "message": "sessionhook endpoints test",
        },
    }
    return event_id, json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


async def test_endpoint(
    config: Config,
    name: str,
    *,
    poster: Poster,
    now: float,
    endpoint: EndpointConfig | None = None,
    policy: AddressPolicy | None = None,
    renderer: Renderer | None = None,
) -> tuple[str, AttemptResult]:
    """POST a signed ``ping`` to the configured endpoint ``name`` (its secrets, its
    payload/format/template) through ``poster`` (the daemon's: :func:`ping_poster`);
    returns the ping's webhook-id and the answer. Never archived, never retried.
    ``endpoint``: one created at run time (:func:`.endpoint_edits.endpoint_config`).
    ``renderer``: the daemon's; by default a template renders in a child process of its
    own, as a delivery's does (``delivery.render_timeout``).

    A URL the address rules refuse without DNS (its host, once normalized, private or not
    plain: :func:`~sessionhook.relay.domain.addresses.literal_refusal` with ``policy``) is
    an :class:`OperatorError` and nothing is sent; a name resolving to a refused address
    is a failed attempt, as for a delivery."""
    endpoint = configured_endpoint(config, name, endpoint)
    event_id, body = ping_event(name, now)
    result = await send_to_endpoint(
        config,
        endpoint,
        event_id,
        body,
        poster=poster,
        policy=policy,
        renderer=renderer,
        what="the ping",
    )
    return event_id, result


def configured_endpoint(
    config: Config, name: str, endpoint: EndpointConfig | None
) -> EndpointConfig:
    """``endpoint`` (one created at run time), else the configured endpoint ``name``;
    :class:`OperatorError` naming the known ones when there is none."""
    if endpoint is None:
        endpoint = config.endpoint_by_name(name)
    if endpoint is None:
        known = shown_names([e.name for e in config.endpoints]) or "none"
        raise OperatorError(f"no endpoint named {shown_name(name)} in the config (known: {known})")
    return endpoint


async def send_to_endpoint(
    config: Config,
    endpoint: EndpointConfig,
    event_id: str,
    body: bytes,
    *,
    poster: Poster,
    policy: AddressPolicy | None = None,
    renderer: Renderer | None = None,
    what: str,
) -> AttemptResult:
    """POST one event (``event_id``, standard ``body``) to ``endpoint`` as a delivery is:
    its URL judged first, rendered through its shape (payload, format, template), signed
    with its secrets, through ``poster``; never archived, never retried. ``what`` names
    the event in a refusal (``the ping``)."""
    name = endpoint.name
    try:
        destination(endpoint.url)
    except UnusableUrlError as exc:
        raise OperatorError(f"{name}: refused: {exc.reason}") from None
    if not config.delivery.allow_private_networks:
        reason = literal_refusal(endpoint.url, policy=policy)
        if reason is not None:
            raise OperatorError(f"{name}: {refused(reason)}")
    own = RenderProcess()  # starts a child only if it renders
    try:
        # Shaped like the endpoint's deliveries: a chat webhook gets a chat message.
        body, content_type = await (renderer or own).render(
            event_id, body, endpoint.shape, time_budget=config.delivery.render_timeout
        )
    except render.RenderError as exc:
        raise OperatorError(f"{name}: {what} does not render: {exc}") from None
    finally:
        await own.aclose()
    # The one place that signs and POSTs, shared with the dispatcher.
    return await post_event(
        poster,
        url=endpoint.url,
        secrets=[s.get_secret_value() for s in endpoint.secrets],
        event_id=event_id,
        body=body,
        timeout=config.delivery.timeout,
        body_limit=config.delivery.response_body_limit,
        content_type=content_type,
    )


@asynccontextmanager
async def ping_poster(
    config: Config,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    resolve: Resolver | None = None,
    policy: AddressPolicy | None = None,
) -> AsyncIterator[Poster]:
    """The poster :func:`test_endpoint` sends through outside the daemon: the daemon's
    (aiohttp, each name resolved once and every address vetted, the connection made to a
    vetted one; ``resolve`` and ``policy`` replace DNS and the address judgement), or an
    httpx client on ``transport`` (a stand-in for the network), closed at the end."""
    if transport is not None:
        async with httpx.AsyncClient(transport=transport, follow_redirects=False) as http:
            yield HttpxPoster(http)
        return
    poster = AiohttpPoster(
        allow_private=config.delivery.allow_private_networks, resolve=resolve, policy=policy
    )
    try:
        yield poster
    finally:
        await poster.aclose()
