"""``GET /v1/actions``: the actions people took through signed links, Slack, the console or the API
(who, when, what, the service's answer), newest first, paged; ``?session=sessions/<id>``
keeps one session's."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ...domain.api_models import ApiActionPage
from ...ops.pages import page_of
from ...ops.wire import action_answer
from ...store import ActionQueries
from ..answers import api_answer, api_route
from ..context import WebContext
from .common import bad_request, page_answer, page_request, query_text, require_store


def actions_routes(ctx: WebContext) -> Sequence[BaseRoute]:
    """``GET /v1/actions``."""

    async def actions(request: Request) -> Response:
        store = require_store(ctx)
        page = page_request(request)
        before: int | None = None
        if page.after is not None:
            if not page.after.isdigit() or len(page.after) > 18:
                raise bad_request("pageToken is not one this API gave")
            before = int(page.after)
        session = query_text(request, "session")
        rows = await store.run(
            ActionQueries.list_actions, session=session, before=before, limit=page.size + 1
        )
        found = page_of(rows, page.size, lambda r: r.id)
        items = [action_answer(r) for r in found.items]
        return api_answer(page_answer(ApiActionPage, items, found.after))

    return [api_route("listActions", actions)]
