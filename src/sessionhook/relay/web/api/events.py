"""``/v1/events``: the event archive, one event with its deliveries, replay.

``GET /v1/events`` (ingest order; filters ``type`` glob and ``session``; a page of a rare
type may come back short with a token), ``GET /v1/events/{id}`` and
``POST /v1/events/{id}:replay`` (``{"endpoint"}``: the same webhook-id and body).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ....wording import counted
from ... import ops as operator
from ...domain.api_models import ApiEventDetail, ApiEventPage, ApiReplayBody, ApiReplayed
from ...ops import OperatorError, UnknownEndpointError, pages
from ...ops.wire import delivery_answer, event_answer
from ...telemetry.logs import get_logger
from ..answers import api_answer, api_route
from ..context import WebContext
from .common import (
    bad_request,
    not_found,
    page_answer,
    page_request,
    query_text,
    read_json,
    require_store,
)
from .inputs import delivery_id, event_id

_log = get_logger()


def events_routes(ctx: WebContext) -> Sequence[BaseRoute]:
    """The routes of the module docstring."""

    async def listing(request: Request) -> Response:
        store = require_store(ctx)
        page = page_request(request)
        # The position in ingest order: a number, like a delivery id.
        after = 0 if page.after is None else delivery_id(page.after)
        found = await store.run(
            pages.event_page,
            size=page.size,
            after=after,
            type_glob=query_text(request, "type"),
            session=query_text(request, "session"),
        )
        items = [event_answer(row) for row in found.items]
        return api_answer(page_answer(ApiEventPage, items, found.after))

    async def one(request: Request) -> Response:
        store = require_store(ctx)
        key = event_id(request.path_params["id"])
        try:
            event, rows = await store.run(pages.event_detail, key)
        except OperatorError as exc:
            raise not_found(str(exc)) from None
        deliveries = [delivery_answer(d) for d in rows]
        return api_answer(ApiEventDetail(event=event_answer(event), deliveries=deliveries))

    async def replay(request: Request) -> Response:
        store = require_store(ctx)
        key = event_id(request.path_params["id"])
        body = await read_json(request, ApiReplayBody)
        try:
            result = await store.run(operator.replay, body.endpoint, event_ids=[key])
        except UnknownEndpointError as exc:
            raise not_found(str(exc)) from None
        except OperatorError as exc:  # no such event
            raise (not_found if "no archived event" in str(exc) else bad_request)(
                str(exc)
            ) from None
        if result.queued:
            ctx.wake()
        _log.info("api.replay", endpoint=body.endpoint, event_id=key, queued=result.queued)
        message = f"queued {counted(result.queued, 'delivery')} of {key} to {body.endpoint}"
        if result.reason:
            message += f": {result.reason}"
        return api_answer(ApiReplayed(queued=result.queued, reason=result.reason, message=message))

    return [
        api_route("listEvents", listing),
        api_route("replayEvent", replay),
        api_route("getEvent", one),
    ]
