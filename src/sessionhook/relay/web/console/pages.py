"""The operator console's pages: server-rendered views under ``/console`` (GET).

``docs/web.md`` ("Console") has the contract: the overview (endpoint and upstream health,
replicas, the attempts chart of :mod:`.chart`), the sessions, a session's timeline (with
the forms of :mod:`.actions` while it waits for its user), and one delivery with its
attempts. The searchable lists are in :mod:`.lists`, the live feed in :mod:`.live`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from ...domain.actions import ActionKind
from ...domain.events import SESSION_ACTION_REQUIRED
from ...domain.rows import AttemptRow, DeliveryRow, EventRow
from ...store import (
    ActionQueries,
    AsyncStore,
    ConsoleQueries,
    EndpointQueries,
    Leases,
    OperatorQueries,
)
from .chart import minute_chart
from .common import ConsoleDeps, bad_request, not_found, render_page, with_store
from .text import BadNumber, query_text, url_int

DAY_MINUTES: Final = 24 * 60
#: Session states in which it waits for its user, and the action each asks for.
WAITING: Final[dict[str, ActionKind]] = {
    "AWAITING_PLAN_APPROVAL": "approve_plan",
    "AWAITING_USER_FEEDBACK": "reply",
}


def _path_id(request: Request, name: str) -> int | None:
    """The id in the path; ``None`` when it cannot be one (no such row: a 404)."""
    try:
        return url_int(request.path_params[name], name)
    except BadNumber:
        return None


def _waiting_on(state: str, events: list[EventRow]) -> dict[str, str] | None:
    """What the session waits for: the latest ``session.action_required`` on this page, the
    action and the agent's question; ``None`` when it waits for nobody."""
    kind = WAITING.get(state)
    asking = [e for e in events if e.type == SESSION_ACTION_REQUIRED]
    if kind is None or not asking:
        return None
    try:
        data = json.loads(asking[-1].body).get("data") or {}
        question = data.get("question") if isinstance(data, dict) else None
    except (ValueError, AttributeError):  # an archived body is JSON; said plainly if not
        question = None
    return {
        "event": asking[-1].id,
        "kind": kind,
        "question": question if isinstance(question, str) else "",
    }


class Pages:
    """The GET handlers (see the module docstring)."""

    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps

    @with_store
    async def overview(self, request: Request, store: AsyncStore) -> Response:
        now = self.deps.clock()
        start = (int(now) // 60 + 1) * 60 - DAY_MINUTES * 60
        summary = await store.run(OperatorQueries.status_summary, now)
        counts = await store.run(ConsoleQueries.attempts_per_minute, start, DAY_MINUTES)
        used = await store.run(ConsoleQueries.budget_used, now - 60.0)
        replicas = await store.run(Leases.replicas)
        # Where each endpoint is defined: the config file's are read-only here.
        sources = {e.name: e.source for e in await store.run(EndpointQueries.endpoint_states)}
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
                "replicas": replicas,
                "sources": sources,
                "backend": self.deps.backend,
                # The last hour of the same counts, one bar a minute, readable.
                "hour": minute_chart(
                    [replace(c, minute=c.minute - (DAY_MINUTES - 60)) for c in counts],
                    start=start + (DAY_MINUTES - 60) * 60,
                    minutes=60,
                    tick_every=10,
                ),
            },
        )

    @with_store
    async def sessions(self, request: Request, store: AsyncStore) -> Response:
        q = request.query_params
        state = query_text(q.get("state")) or None
        account = query_text(q.get("account")) or None
        text = query_text(q.get("q"))
        rows = await store.run(
            ConsoleQueries.console_sessions, state=state, account=account, text=text or None
        )
        states, accounts = await store.run(ConsoleQueries.console_session_facets)
        last_seq = await store.run(OperatorQueries.last_event_seq)
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

    @with_store
    async def timeline(self, request: Request, store: AsyncStore) -> Response:
        name = query_text(request.query_params.get("session"))
        session = await store.run(OperatorQueries.get_session, name) if name else None
        if session is None:
            return not_found(request, "no such session in the archive")
        try:
            after = url_int(request.query_params.get("after"), "after") or 0
        except BadNumber as exc:
            return bad_request(request, str(exc))
        # Taken first: the live feed resumes from here, so nothing archived while the page
        # is read is missed (the script skips an event shown already).
        newest = await store.run(OperatorQueries.last_event_seq)
        events: list[EventRow] = await store.run(
            ConsoleQueries.console_timeline, name, after_seq=after, limit=200
        )
        deliveries = await store.run(ConsoleQueries.deliveries_of_events, [e.id for e in events])
        attempts = await store.run(
            ConsoleQueries.attempts_of_deliveries, [d.id for d in deliveries][:500]
        )
        by_delivery: dict[int, list[AttemptRow]] = {}
        for a in attempts:
            by_delivery.setdefault(a.delivery_id, []).append(a)
        by_event: dict[str, list[tuple[DeliveryRow, list[AttemptRow]]]] = {}
        for d in deliveries:
            by_event.setdefault(d.event_id, []).append((d, by_delivery.get(d.id, [])))
        endpoints = await store.run(EndpointQueries.endpoint_states)
        # Approvals and answers given through the relay (links, Slack, console), newest first.
        taken = await store.run(ActionQueries.list_actions, session=name, limit=50)
        more = len(events) >= 200
        return render_page(
            request,
            "timeline.html",
            {
                "title": session.title or session.name,
                "session": session,
                "events": events,
                "deliveries": by_event,
                "endpoints": [e.name for e in endpoints],
                "next_after": events[-1].seq if more else None,
                "live_after": newest,
                "waiting": _waiting_on(session.state, events),
                "can_act": self.deps.act is not None,
                "actions_taken": taken,
            },
        )

    @with_store
    async def delivery(self, request: Request, store: AsyncStore) -> Response:
        delivery_id = _path_id(request, "delivery_id")
        if delivery_id is None:
            return not_found(request, "no such delivery")
        return await self._delivery_page(request, store, delivery_id, None)

    @with_store
    async def attempt(self, request: Request, store: AsyncStore) -> Response:
        attempt_id = _path_id(request, "attempt_id")
        attempt = None
        if attempt_id is not None:
            attempt = await store.run(ConsoleQueries.get_attempt, attempt_id)
        if attempt is None:
            return not_found(request, "no such attempt (pruned by the delivery-log retention?)")
        return await self._delivery_page(request, store, attempt.delivery_id, attempt.id)

    async def _delivery_page(
        self, request: Request, store: AsyncStore, delivery_id: int, selected: int | None
    ) -> Response:
        delivery = await store.run(OperatorQueries.get_delivery, delivery_id)
        if delivery is None:
            return not_found(request, "no such delivery")
        attempts = await store.run(OperatorQueries.list_attempts, delivery_id)
        event = await store.run(OperatorQueries.get_event, delivery.event_id)
        others = await store.run(ConsoleQueries.deliveries_of_events, [delivery.event_id])
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
