"""The signed POST of one webhook: :func:`post_event`, and the URL guard before it.

:func:`post_event` is the one place that signs and sends a webhook (the dispatcher, the test
ping, ``listen --forward-to``): no redirect followed, at most ``body_limit`` bytes read, the
whole exchange bounded by ``timeout``, a fresh ``webhook-timestamp`` on every attempt. A
:class:`UrlGuard` checks the URL before each POST (default :func:`literal_guard`, no DNS);
the poster and the resolver judge again, and a refusal is a failed attempt worded by
:func:`refused`, nothing sent.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import anyio
import httpx

from sessionhook import __version__
from sessionhook.api.errors import parse_retry_after
from sessionhook.redact import redact_userinfo

from ..domain.addresses import BlockedAddressError, UnusableUrlError, literal_refusal
from ..domain.retry import AttemptResult
from ..domain.signing import signature_header
from .resolve import ResolutionError
from .sender import Answer, HttpxPoster, Poster, PostError

USER_AGENT = f"sessionhook/{__version__}"


class UrlGuard(Protocol):
    """Checks that an endpoint URL may be contacted: a refusal reason, or ``None``."""

    def __call__(self, url: str, *, allow_private: bool) -> Awaitable[str | None]: ...


def refused(reason: str) -> str:
    """The delivery-log error of an attempt refused by the address guard (no password)."""
    return redact_userinfo(
        f"refused: {reason} (set delivery.allow_private_networks = true to allow)"
    )


async def literal_guard(url: str, *, allow_private: bool) -> str | None:
    """The dispatcher's default pre-check: refuses, WITHOUT DNS, a URL that can only be
    private; names are vetted once, when the connection is made."""
    return None if allow_private else literal_refusal(url)


async def post_event(
    http: Poster | httpx.AsyncClient,
    *,
    url: str,
    secrets: Sequence[str],
    event_id: str,
    body: bytes,
    timeout: float,  # noqa: ASYNC109 - the design contract's signature; bounds the exchange
    body_limit: int,
    now: Callable[[], float] = time.time,
    content_type: str = "application/json",
    user_agent: str = USER_AGENT,
) -> AttemptResult:
    """Sign ``body`` and POST it to ``url`` once; never raises for a network failure.

    A URL or host the address guard refuses is a failed attempt (``refused: ...``), nothing
    sent. Headers: ``webhook-id`` (``event_id``), a fresh ``webhook-timestamp``,
    ``webhook-signature`` (one per secret: ``v1,`` for ``whsec_``, ``v1a,`` for ``whsk_``),
    ``content-type`` and ``user-agent``. The result has the status (``None``: no answer), an
    error text, the duration, at most ``body_limit`` bytes of the answer and ``Retry-After``.
    """
    poster = HttpxPoster(http) if isinstance(http, httpx.AsyncClient) else http
    started_at = now()
    timestamp = int(started_at)
    headers = {
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature_header(secrets, event_id, timestamp, body),
        "content-type": content_type,
        "user-agent": user_agent,
    }
    answer: Answer | None = None
    error: str | None = None
    clock = time.perf_counter()
    # The whole exchange is bounded, so a consumer dripping its answer byte by byte cannot
    # hold a slot: by the poster itself when it says so (aiohttp), else by move_on_after.
    deadline = (
        contextlib.nullcontext(None)
        if getattr(poster, "bounds_exchange", False)
        else anyio.move_on_after(timeout)
    )
    with deadline as scope:
        try:
            answer = await poster.post(url, body, headers, timeout=timeout, body_limit=body_limit)
        except TimeoutError:
            error = f"timeout after {timeout:g} s"
        except PostError as exc:
            # Kept in the delivery log and shown by the CLI: never with the URL's password.
            error = redact_userinfo(str(exc))
        except BlockedAddressError as exc:
            # From the poster or its resolver: the host is, or resolved to, a refused address.
            error = refused(exc.reason)
        except UnusableUrlError as exc:
            error = redact_userinfo(f"refused: {exc.reason}")
        except ResolutionError as exc:
            error = redact_userinfo(exc.reason)
    if scope is not None and scope.cancelled_caught:
        error = f"timeout after {timeout:g} s"
    duration_ms = (time.perf_counter() - clock) * 1000.0
    if answer is None:
        return AttemptResult(
            status_code=None,
            error=error,
            duration_ms=duration_ms,
            response_body="",
            retry_after=None,
            started_at=started_at,
        )
    return AttemptResult(
        status_code=answer.status,
        error=None,
        duration_ms=duration_ms,
        response_body=answer.body[:body_limit].decode("utf-8", "replace"),
        retry_after=parse_retry_after(answer.retry_after),
        started_at=started_at,
    )
