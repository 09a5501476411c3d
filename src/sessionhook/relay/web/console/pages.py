"""The operator console's pages: server-rendered views under ``/console`` (GET).

``docs/web.md`` ("Console") has the contract:

* ``/console``: every endpoint's health (last success, failing since, outbox depth, why it is
  disabled), upstream health (last good poll, errors, budget used) and a chart of attempts
  per minute over the last 24 h, 2xx against the rest (:mod:`.chart`).
* ``/console/sessions``: sessions (state, title, source, account, last event), filterable;
  new events appear live.
* ``/console/timeline?session=NAME``: a session's events, each with its deliveries per
  endpoint and their attempts; new events appear live.
* ``/console/deliveries``: deliveries filtered by endpoint, status and time;
  ``/console/deliveries/{id}`` and ``/console/attempts/{id}`` show one delivery with its
  attempts (status, duration, error, response body) and the event it carries.

The actions (POST) are in :mod:`.actions`, the live feed in :mod:`.live`, the route list in
:mod:`.routes`; rendering, the flash message and the error pages in :mod:`.common`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from ...store import AsyncStore, AttemptRow, DeliveryRow, EventRow
from .chart import minute_chart
from .common import ConsoleDeps, error_page, render_page
from .text import BadNumber, parse_when, url_int

__all__ = ["DAY_MINUTES", "DELIVERY_STATUSES", "Pages"]

DAY_MINUTES: Final = 24 * 60
DELIVERY_STATUSES: Final = ("pending", "failed", "dead", "delivered")


def _unavailable(request: Request) -> Response:
    return error_page(request, 503, "Store not open", "the daemon has not opened its store yet")


def _not_found(request: Request, what: str) -> Response:
    return error_page(request, 404, "Not found", what)


def _bad_request(request: Request, reason: str) -> Response:
    return error_page(request, 400, "Bad request", reason)


def _path_id(request: Request, name: str) -> int | None:
    """The id in the path; ``None`` when it cannot be one (no such row: a 404)."""
    try:
        return url_int(request.path_params[name], name)
    except BadNumber:
        return None


class Pages:
    """The GET handlers (see the module docstring)."""

    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps

    async def overview(self, request: Request) -> Response:
        store = self.deps.store()
        if store is None:
            return _unavailable(request)
        now = self.deps.clock()
        start = (int(now) // 60 + 1) * 60 - DAY_MINUTES * 60
        summary = await store.console.status_summary(now)
        counts = await store.console.attempts_per_minute(start, DAY_MINUTES)
        used = await store.console.budget_used(now - 60.0)
        budgets = [
            {"account": account, "limit": limit, "used": used.get(account, 0)}
            for account, limit in sorted(self.deps.budgets().items())
        ]
        return render_page(
            request,
            "overview.html",
            {
                "title": "Overview",
                "now": now,
                "summary": summary,
                "budgets": budgets,
                "chart": minute_chart(counts, start=start, minutes=DAY_MINUTES),
                # The last hour of the same counts, one bar a minute, readable.
                "hour": minute_chart(
                    [replace(c, minute=c.minute - (DAY_MINUTES - 60)) for c in counts],
                    start=start + (DAY_MINUTES - 60) * 60,
                    minutes=60,
                    tick_every=10,
                ),
            },
        )

    async def sessions(self, request: Request) -> Response:
        store = self.deps.store()
        if store is None:
            return _unavailable(request)
        q = request.query_params
        state, account, text = q.get("state") or None, q.get("account") or None, q.get("q")
        rows = await store.console.console_sessions(state=state, account=account, text=text or None)
        states, accounts = await store.console.console_session_facets()
        last_seq = await store.console.last_event_seq()
        return render_page(
            request,
            "sessions.html",
            {
                "title": "Sessions",
                "sessions": rows,
                "states": states,
                "accounts": accounts,
                "filters": {"state": state or "", "account": account or "", "q": text or ""},
                "live_after": last_seq,
                # Live rows are added only when no filter hides them.
                "live": not (state or account or text),
            },
        )

    async def timeline(self, request: Request) -> Response:
        store = self.deps.store()
        if store is None:
            return _unavailable(request)
        name = request.query_params.get("session", "")
        session = await store.console.get_session(name) if name else None
        if session is None:
            return _not_found(request, "no such session in the archive")
        try:
            after = url_int(request.query_params.get("after"), "after") or 0
        except BadNumber as exc:
            return _bad_request(request, str(exc))
        events: list[EventRow] = await store.console.console_timeline(
            name, after_seq=after, limit=200
        )
        deliveries = await store.console.deliveries_of_events([e.id for e in events])
        attempts = await store.console.attempts_of_deliveries([d.id for d in deliveries][:500])
        by_delivery: dict[int, list[AttemptRow]] = {}
        for a in attempts:
            by_delivery.setdefault(a.delivery_id, []).append(a)
        by_event: dict[str, list[tuple[DeliveryRow, list[AttemptRow]]]] = {}
        for d in deliveries:
            by_event.setdefault(d.event_id, []).append((d, by_delivery.get(d.id, [])))
        endpoints = await store.console.endpoint_states()
        # Approvals and answers given through the relay (links, Slack, console), newest first.
        taken = await store.actions.list_actions(session=name, limit=50)
        last = events[-1].seq if events else after
        return render_page(
            request,
            "timeline.html",
            {
                "title": session.title or session.name,
                "session": session,
                "events": events,
                "deliveries": by_event,
                "endpoints": [e.name for e in endpoints],
                "next_after": last if len(events) >= 200 else None,
                "live_after": last,
                "actions_taken": taken,
            },
        )

    async def deliveries(self, request: Request) -> Response:
        store = self.deps.store()
        if store is None:
            return _unavailable(request)
        q = request.query_params
        now = self.deps.clock()
        status = q.get("status") or None
        if status not in (None, *DELIVERY_STATUSES):
            status = None
        try:
            before = url_int(q.get("before"), "before")
        except BadNumber as exc:
            return _bad_request(request, str(exc))
        rows = await store.console.console_deliveries(
            endpoint=q.get("endpoint") or None,
            status=status,
            since=parse_when(q.get("since"), now),
            until=parse_when(q.get("until"), now),
            before_id=before,
            limit=100,
        )
        endpoints = await store.console.endpoint_states()
        filters = {k: q.get(k, "") for k in ("endpoint", "status", "since", "until")}
        return render_page(
            request,
            "deliveries.html",
            {
                "title": "Deliveries",
                "rows": rows,
                "now": now,
                "endpoints": [e.name for e in endpoints],
                "statuses": DELIVERY_STATUSES,
                "filters": filters,
                "older": rows[-1].id if len(rows) >= 100 else None,
            },
        )

    async def delivery(self, request: Request) -> Response:
        store = self.deps.store()
        if store is None:
            return _unavailable(request)
        delivery_id = _path_id(request, "delivery_id")
        if delivery_id is None:
            return _not_found(request, "no such delivery")
        return await self._delivery_page(request, store, delivery_id, None)

    async def attempt(self, request: Request) -> Response:
        store = self.deps.store()
        if store is None:
            return _unavailable(request)
        attempt_id = _path_id(request, "attempt_id")
        attempt = None
        if attempt_id is not None:
            attempt = await store.console.get_attempt(attempt_id)
        if attempt is None:
            return _not_found(request, "no such attempt (pruned by the delivery-log retention?)")
        return await self._delivery_page(request, store, attempt.delivery_id, attempt.id)

    async def _delivery_page(
        self, request: Request, store: AsyncStore, delivery_id: int, selected: int | None
    ) -> Response:
        delivery = await store.console.get_delivery(delivery_id)
        if delivery is None:
            return _not_found(request, "no such delivery")
        attempts = await store.console.list_attempts(delivery_id)
        event = await store.console.get_event(delivery.event_id)
        others = await store.console.deliveries_of_events([delivery.event_id])
        current = next((a for a in attempts if a.id == selected), None)
        return render_page(
            request,
            "delivery.html",
            {
                "title": f"Attempt {current.attempt}" if current else f"Delivery {delivery.id}",
                "delivery": delivery,
                "attempts": attempts,
                "selected": current,
                "event": event,
                "others": [d for d in others if d.id != delivery.id],
                "now": self.deps.clock(),
            },
        )
