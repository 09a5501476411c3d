"""``GET /v1/actions``: the actions people took through signed links, Slack, the console or the API
(who, when, what, the service's answer), newest first, paged; ``?session=sessions/<id>``
keeps one session's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ...ops.wire import object_times
from ...store import ActionQueries
from ...store.actions import ActionRow
from ..context import WebContext
from .common import bad_request, page_answer, page_request, query_text, require_store

__all__ = ["action_json", "actions_routes"]


def action_json(row: ActionRow) -> dict[str, Any]:
    """One action as JSON (``taken_at`` as RFC 3339; ``token_hash``: the SHA-256 of the
    link's token, never the token)."""
    return object_times(asdict(row))


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
        more = len(rows) > page.size
        rows = rows[: page.size]
        after = str(rows[-1].id) if more else None
        return JSONResponse(page_answer("actions", [action_json(r) for r in rows], after))

    return [Route("/v1/actions", actions, methods=["GET"])]
