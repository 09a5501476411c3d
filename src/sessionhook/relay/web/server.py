"""The daemon's small HTTP server: ``/healthz``, ``/readyz``, ``/openapi.json``, ``/metrics``.

``/healthz`` is 200 while the event loop runs; ``/readyz`` is 200 or 503 with the reasons
(:func:`check_ready`) and names the store (never a password), answering from the start;
``/openapi.json`` is the webhook contract (:mod:`sessionhook.relay.domain.contract`);
``/metrics`` refreshes the outbox gauges and renders the Prometheus text. :func:`serve` runs
uvicorn in the caller's task group behind :mod:`sessionhook.relay.web.listener`'s bounds,
with no signal handlers, lifespan or logging of its own.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.abc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ...sockets import listening_socket
from ..config import DEFAULT_TRUSTED_PROXIES
from ..domain.contract import shipped_document
from ..telemetry.logs import get_logger
from ..telemetry.metrics import CONTENT_TYPE, Metrics
from .listener import ConnectionLimits, serve_socket

#: Returns ``(ready, reasons)``; may be a coroutine function (it may touch the store).
ReadinessCheck = Callable[[], tuple[bool, Sequence[str]] | Awaitable[tuple[bool, Sequence[str]]]]
#: Called before each scrape to refresh gauges from the database.
ScrapeHook = Callable[[], Awaitable[None]]

_log = get_logger()


def always_ready() -> tuple[bool, Sequence[str]]:
    """The readiness of an app with nothing behind it to wait for: ready whenever asked."""
    return True, ()


class HealthServerError(Exception):
    """The ``[server] listen`` address is malformed or cannot be bound."""


def check_ready(
    *,
    store_writable: bool,
    last_successful_poll: float | None,
    now: float,
    max_poll_age: float,
    started_at: float | None = None,
    store_problem: str | None = None,
) -> tuple[bool, list[str]]:
    """Readiness from facts the daemon has at hand; pure.

    Ready when the store is writable (``store_problem`` says why not) and the last successful
    upstream poll is at most ``max_poll_age`` old, or the daemon started less than that ago.
    """
    reasons: list[str] = []
    if not store_writable:
        reasons.append(store_problem or "store is not writable")
    if last_successful_poll is None:
        if started_at is None or now - started_at > max_poll_age:
            reasons.append("no successful upstream poll yet")
    else:
        age = now - last_successful_poll
        if age > max_poll_age:
            reasons.append(
                f"last successful upstream poll {age:.0f}s ago (bound {max_poll_age:.0f}s)"
            )
    return (not reasons, reasons)


def create_app(
    *,
    metrics: Metrics,
    readiness: ReadinessCheck,
    before_scrape: ScrapeHook | None = None,
    store: Mapping[str, str] | None = None,
) -> Starlette:
    """A Starlette app serving only the routes above (the daemon serves them beside the console)."""
    return Starlette(
        routes=health_routes(
            metrics=metrics, readiness=readiness, before_scrape=before_scrape, store=store
        )
    )


def health_routes(
    *,
    metrics: Metrics,
    readiness: ReadinessCheck,
    before_scrape: ScrapeHook | None = None,
    store: Mapping[str, str] | None = None,
) -> list[BaseRoute]:
    """The unauthenticated routes above, for the web layer's route table. ``store``
    (``backend`` and ``database``, never a password) is reported by /readyz as it is."""

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(_request: Request) -> Response:
        try:
            result = readiness()
            ready, reasons = await result if inspect.isawaitable(result) else result
        except Exception as exc:  # a failing check is an answer, not a crash
            _log.warning("health.readiness_failed", error=repr(exc))
            ready, reasons = False, [f"readiness check failed: {exc}"]
        body: dict[str, Any] = {"ready": bool(ready), "reasons": list(reasons)}
        if store is not None:
            body["store"] = dict(store)
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_route(_request: Request) -> Response:
        if before_scrape is not None:
            try:
                await before_scrape()
            except Exception as exc:  # stale gauges beat no metrics at all
                _log.warning("health.metrics_refresh_failed", error=repr(exc))
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def openapi(_request: Request) -> Response:
        return JSONResponse(shipped_document())

    return [
        Route("/openapi.json", openapi, methods=["GET", "HEAD"]),
        Route("/healthz", healthz, methods=["GET", "HEAD"]),
        Route("/readyz", readyz, methods=["GET", "HEAD"]),
        Route("/metrics", metrics_route, methods=["GET", "HEAD"]),
    ]


def parse_listen(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:9187"``, ``"[::1]:9187"`` or ``"localhost:0"`` -> ``(host, port)``."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host:
        raise HealthServerError(f"listen address {listen!r}: expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise HealthServerError(f"listen address {listen!r}: write IPv6 hosts as [addr]:port")
    try:
        port = int(port_text)
    except ValueError:
        raise HealthServerError(f"listen address {listen!r}: port must be a number") from None
    if not 0 <= port <= 65535:
        raise HealthServerError(f"listen address {listen!r}: port out of range")
    return host, port


async def serve(
    listen: str,
    app: Any,
    *,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
    graceful_shutdown: int = 2,
    limits: ConnectionLimits | None = None,
    metrics: Metrics | None = None,
    trusted_proxies: Sequence[str] = DEFAULT_TRUSTED_PROXIES,
) -> None:
    """Serve ``app`` on ``listen`` until cancelled; use with ``task_group.start``
    (``task_status.started`` receives the bound ``(host, port)``). ``limits`` bound the
    connections (default: ``[server]``'s defaults), forwarded headers count from
    ``trusted_proxies`` only (:func:`.listener.serve_socket`).
    """
    host, port = parse_listen(listen)
    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        raise HealthServerError(f"cannot listen on {listen}: {exc.strerror or exc}") from exc
    bound = sock.getsockname()
    # Connections that come before the accept loop runs wait in the listen queue.
    _log.info("health.listening", host=bound[0], port=bound[1])
    async with contextlib.AsyncExitStack() as services:
        # What runs beside the routes (the MCP server's sessions): for as long as they serve.
        for service in getattr(getattr(app, "state", None), "services", ()):
            await services.enter_async_context(service())
        await serve_socket(
            sock,
            app,
            limits=limits or ConnectionLimits.of(),
            metrics=metrics,
            graceful_shutdown=graceful_shutdown,
            trusted_proxies=trusted_proxies,
            task_status=task_status,
        )
