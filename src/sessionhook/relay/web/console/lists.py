"""The console's searchable lists (GET): ``/console/deliveries`` and ``/console/events``.

Newest first, filtered from the query string (so a list can be linked to), each text
cleaned by :func:`~.text.query_text` first. ``q`` searches by event id or session name; a
search that names neither shows nothing and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response

from ...domain.events import EVENT_TYPES
from ...store import AsyncStore, ConsoleQueries, EndpointQueries, OperatorQueries
from .common import ConsoleDeps, bad_request, render_page, with_store
from .text import BadNumber, parse_when, query_text, url_int

DELIVERY_STATUSES: Final = ("pending", "failed", "dead", "delivered")
#: Rows a list shows at once ("Older" pages further back).
PAGE: Final = 100


@dataclass(frozen=True, slots=True)
class Search:
    """What ``q`` named: an event, a session, or nothing (``missing``: a search was given
    and names neither, so the list is empty)."""

    text: str = ""
    event_id: str | None = None
    session: str | None = None

    @property
    def missing(self) -> bool:
        """A search that named no event and no session."""
        return bool(self.text) and self.event_id is None and self.session is None


async def find(store: AsyncStore, text: str) -> Search:
    """Resolve a search: an archived event's id first, else a session's name."""
    if not text:
        return Search()
    if await store.run(ConsoleQueries.console_events, event_id=text, limit=1):
        return Search(text, event_id=text)
    return Search(text, session=await store.run(ConsoleQueries.find_session, text))


def _choice(params: QueryParams, name: str, allowed: tuple[str, ...] | list[str]) -> str:
    """A filter that must be one of ``allowed`` (anything else filters nothing)."""
    value = query_text(params.get(name))
    return value if value in allowed else ""


class Lists:
    """The list handlers (see the module docstring)."""

    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps

    @with_store
    async def deliveries(self, request: Request, store: AsyncStore) -> Response:
        """The deliveries list."""
        q, now = request.query_params, self.deps.clock()
        try:
            before = url_int(q.get("before"), "before")
        except BadNumber as exc:
            return bad_request(request, str(exc))
        endpoints = [e.name for e in await store.run(EndpointQueries.endpoint_states)]
        types = EVENT_TYPES
        filters = {
            "q": query_text(q.get("q")),
            "endpoint": _choice(q, "endpoint", endpoints),
            "status": _choice(q, "status", DELIVERY_STATUSES),
            "type": _choice(q, "type", types),
            "since": query_text(q.get("since")),
            "until": query_text(q.get("until")),
        }
        search = await find(store, filters["q"])
        rows = []
        if not search.missing:
            rows = await store.run(
                OperatorQueries.list_deliveries,
                endpoint=filters["endpoint"] or None,
                status=filters["status"] or None,
                since=parse_when(filters["since"], now),
                until=parse_when(filters["until"], now),
                before_id=before,
                limit=PAGE,
                session=search.session,
                event_id=search.event_id,
                event_type=filters["type"] or None,
            )
        return render_page(
            request,
            "deliveries.html",
            {
                "title": "Deliveries",
                "rows": rows,
                "now": now,
                "endpoints": endpoints,
                "statuses": DELIVERY_STATUSES,
                "types": types,
                "filters": filters,
                "search": search,
                "older": rows[-1].id if len(rows) >= PAGE else None,
            },
        )

    @with_store
    async def events(self, request: Request, store: AsyncStore) -> Response:
        """The events list."""
        q = request.query_params
        try:
            before = url_int(q.get("before"), "before")
        except BadNumber as exc:
            return bad_request(request, str(exc))
        types = EVENT_TYPES
        filters = {
            "q": query_text(q.get("q")),
            "type": _choice(q, "type", types),
            "status": _choice(q, "status", DELIVERY_STATUSES),
        }
        search = await find(store, filters["q"])
        rows = []
        if not search.missing:
            rows = await store.run(
                ConsoleQueries.console_events,
                session=search.session,
                event_id=search.event_id,
                event_type=filters["type"] or None,
                status=filters["status"] or None,
                before_seq=before,
                limit=PAGE,
            )
        return render_page(
            request,
            "events.html",
            {
                "title": "Events",
                "rows": rows,
                "statuses": DELIVERY_STATUSES,
                "types": types,
                "filters": filters,
                "search": search,
                "older": rows[-1].seq if len(rows) >= PAGE else None,
            },
        )
