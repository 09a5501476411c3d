"""``/v1/deliveries``: the delivery log, one delivery with its attempts, retry now, recover.

``GET /v1/deliveries`` (newest first; filters ``endpoint``, ``status``, ``session``,
``event``), ``GET /v1/deliveries/{id}``, ``POST /v1/deliveries/{id}:retry`` (409 for a
delivered one) and ``POST /v1/deliveries:recover`` (``{"endpoint", "since"}``). A retry or
a recovery wakes the dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ... import ops as operator
from ...domain.api_models import ApiDeliveryPage, ApiEmptyBody, ApiRecoverBody
from ...ops import OperatorError, UnknownEndpointError, pages, requeue
from ...ops.wire import attempts_answer, delivery_answer
from ...telemetry.logs import get_logger
from ..answers import api_answer, api_route
from ..context import WebContext
from .common import (
    ApiProblem,
    bad_request,
    not_found,
    page_answer,
    page_request,
    query_text,
    read_json,
    require_store,
)
from .inputs import delivery_id, since_time

_log = get_logger()


def deliveries_routes(ctx: WebContext) -> Sequence[BaseRoute]:
    """The routes of the module docstring."""

    async def listing(request: Request) -> Response:
        store = require_store(ctx)
        page = page_request(request)
        before = None if page.after is None else delivery_id(page.after)
        now = ctx.clock()
        try:
            found, claims = await store.run(
                pages.delivery_page,
                now,
                size=page.size,
                before=before,
                endpoint=query_text(request, "endpoint"),
                status=query_text(request, "status"),
                session=query_text(request, "session"),
                event=query_text(request, "event"),
            )
        except UnknownEndpointError as exc:
            raise not_found(str(exc)) from None
        except OperatorError as exc:
            raise bad_request(str(exc)) from None
        items = [delivery_answer(row, claims.get(row.id)) for row in found.items]
        return api_answer(page_answer(ApiDeliveryPage, items, found.after))

    async def one(request: Request) -> Response:
        store = require_store(ctx)
        key = delivery_id(request.path_params["id"])
        try:
            event, found = await store.run(operator.attempts, str(key))
        except OperatorError as exc:
            raise not_found(str(exc)) from None
        return api_answer(attempts_answer(event, found))

    async def retry(request: Request) -> Response:
        store = require_store(ctx)
        key = delivery_id(request.path_params["id"])
        await read_json(request, ApiEmptyBody)  # an empty body, or {}
        try:
            result = await store.run(requeue.retry, key)
        except OperatorError as exc:
            status = 404 if str(exc).startswith("no delivery") else 409
            raise ApiProblem(status, str(exc) + (f" ({exc.hint})" if exc.hint else "")) from None
        ctx.wake()
        _log.info("api.retry", delivery=key, previous=result.previous, head=result.head)
        return api_answer(result.answer())

    async def recover(request: Request) -> Response:
        store = require_store(ctx)
        body = await read_json(request, ApiRecoverBody)
        since = since_time(body.since, ctx.clock())
        try:
            result = await store.run(requeue.recover, body.endpoint, since)
        except UnknownEndpointError as exc:
            raise not_found(str(exc)) from None
        if result.queued:
            ctx.wake()
        _log.info("api.recover", endpoint=body.endpoint, queued=result.queued)
        return api_answer(result.answer())

    return [
        api_route("listDeliveries", listing),
        api_route("recoverDeliveries", recover),
        api_route("retryDelivery", retry),
        api_route("getDelivery", one),
    ]
