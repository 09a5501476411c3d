"""The operator console: server-rendered pages under ``/console`` on the daemon's listener.

Pages (GET; ``docs/design.md`` has the contract):

* ``/console``: every endpoint's health (last success, failing since, outbox depth, why it is
  disabled), upstream health (last good poll, errors, budget used) and a chart of attempts
  per minute over the last 24 h, 2xx against the rest (:mod:`.console_chart`).
* ``/console/sessions``: sessions (state, title, source, account, last event), filterable;
  new events appear live.
* ``/console/timeline?session=NAME``: a session's events, each with its deliveries per
  endpoint and their attempts; new events appear live.
* ``/console/deliveries``: deliveries filtered by endpoint, status and time;
  ``/console/deliveries/{id}`` and ``/console/attempts/{id}`` show one delivery with its
  attempts (status, duration, error, response body) and the event it carries.

Actions (POST, CSRF-checked, answered with a redirect and a flash message) are in
:mod:`.console_actions`; the live feed (Server-Sent Events) in :mod:`.console_live`.

Everything shown that came from upstream or a consumer (titles, prompts, diffs, response
bodies, error texts) is hostile input: the templates are Jinja2 with autoescaping on, the
script builds live rows with ``textContent``, and every page carries a strict
Content-Security-Policy (scripts and styles from this server only, no inline script).
All assets ship in ``relay/web/static``; nothing is loaded from another host.

:func:`console_provider` is the route provider the daemon's route table
(:mod:`sessionhook.relay.web`) includes: every console path is behind its access control
(:mod:`.auth`: bearer token or login cookie; POSTs need the session's CSRF token, which
every form carries as ``csrf_token``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ...config.models import DEFAULT_ACCOUNT
from ...domain.retry import AttemptResult
from ...store import AsyncStore, AttemptRow, DeliveryRow, EventRow
from ..auth import CSRF_FIELD, csrf_token
from ..bell import Bell
from .chart import minute_chart

if TYPE_CHECKING:
    from .. import WebContext

__all__ = [
    "MAX_ID",
    "BadNumber",
    "ConsoleDeps",
    "console_provider",
    "console_routes",
    "render_page",
    "store_failed_page",
    "url_int",
]

_HERE: Final = Path(__file__).parent
#: Shown of an event body or a response body before "... (N bytes more)".
BODY_SHOWN: Final = 64 * 1024
DAY_MINUTES: Final = 24 * 60
DELIVERY_STATUSES: Final = ("pending", "failed", "dead", "delivered")
#: The largest id or position in the stores (SQLite INTEGER, PostgreSQL BIGINT).
MAX_ID: Final = 2**63 - 1

#: Sends endpoint NAME a signed test event now; the answer (never raises for the network;
#: :class:`~sessionhook.relay.ops.OperatorError` for a name the config does not have).
SendTest = Callable[[str], Awaitable[AttemptResult]]



@dataclass
class ConsoleDeps:
    """What the console needs from the daemon (seams for tests).

    ``store`` returns the daemon's open store, or ``None`` while it is not open (the pages
    answer 503). ``budgets`` maps each account to its ``requests_per_minute``. ``send_test``
    sends a test event (``None``: the action is unavailable). ``wake`` tells the dispatcher
    that deliveries were queued (a replay, an endpoint enabled).
    """

    store: Callable[[], AsyncStore | None]
    budgets: Callable[[], Mapping[str, int]] = dict
    send_test: SendTest | None = None
    wake: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.time
    #: Rung by the daemon when it archives events: wakes the live feed at once.
    bell: Bell = field(default_factory=Bell)
    #: Live feed: seconds between two looks at the store, and how long one stream lasts
    #: before the browser reconnects (with Last-Event-ID, nothing missed).
    live_interval: float = 1.0
    live_duration: float = 300.0
    live_max_streams: int = 16


# --------------------------------------------------------------------------- rendering


def _stamp(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d"


def _clip(text: str | bytes | None, limit: int = BODY_SHOWN) -> str:
    """At most ``limit`` characters of ``text``, with a note of how much was left out."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n... ({len(text) - limit} characters more)"


def _pretty(body: bytes) -> str:
    """An event body pretty-printed (as it is stored when it is not JSON)."""
    try:
        return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except ValueError:
        return body.decode("utf-8", "replace")


def _outcome(attempt: AttemptRow) -> str:
    if attempt.status_code is not None and 200 <= attempt.status_code < 300:
        return "ok"
    return "failed"


_ENV: Final = jinja2.Environment(
    loader=jinja2.FileSystemLoader(_HERE / "templates"),
    autoescape=True,  # every {{ }} is escaped: upstream and consumer text is hostile
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters.update(stamp=_stamp, age=_age, clip=_clip, pretty=_pretty, outcome=_outcome)


def render_page(
    request: Request,
    template: str,
    context: Mapping[str, Any],
    *,
    status_code: int = 200,
) -> Response:
    """Render ``console/<template>`` with the flash message and the CSRF token of the
    request's session."""
    from .actions import pop_flash  # the actions module imports this one

    flash, clear = pop_flash(request)
    path = request.url.path
    here = f"{path}?{request.url.query}" if request.url.query else path
    html = _ENV.get_template(f"console/{template}").render(
        {
            "flash": flash,
            "csrf": csrf_token(request),
            "csrf_field": CSRF_FIELD,
            "path": path,
            "here": here,
            **context,
        }
    )
    # Its security headers come with every HTML page's (headers.SecurityHeaders).
    response = HTMLResponse(html, status_code=status_code)
    if clear:
        response.delete_cookie(clear, path="/console")
    return response


def _unavailable(request: Request) -> Response:
    return render_page(
        request,
        "unavailable.html",
        {"title": "Store not open", "reason": "the daemon has not opened its store yet"},
        status_code=503,
    )


def store_failed_page(request: Request, error: str) -> Response:
    """The page for a store that could not be read (the database down or restarting): a
    503 that names the error; reloading works again once the database is back."""
    response = render_page(
        request,
        "unavailable.html",
        {
            "title": "Store unavailable",
            "reason": f"the database cannot be read now ({error}); "
            "reload the page once it is back",
        },
        status_code=503,
    )
    response.headers["retry-after"] = "5"
    return response


def _not_found(request: Request, what: str) -> Response:
    return render_page(
        request, "unavailable.html", {"title": "Not found", "reason": what}, status_code=404
    )


class BadNumber(ValueError):
    """A whole number in a URL beyond what the store holds; ``str()`` says so."""


def url_int(value: str | None, name: str) -> int | None:
    """``value`` (from a URL path or query) as a whole number from 0 to :data:`MAX_ID`;
    ``None`` when absent or not a number (ASCII digits only). Larger: :class:`BadNumber`,
    never an integer the store would choke on (SQLite and PostgreSQL hold 64 bits)."""
    text = (value or "").strip()
    if not text.isascii() or not text.isdigit():
        return None
    # Judged by its length first: int() of a few thousand digits is refused, or slow.
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_ID)) or int(digits) > MAX_ID:
        raise BadNumber(f"{name} must be a whole number from 0 to {MAX_ID}")
    return int(digits)


def _bad_request(request: Request, reason: str) -> Response:
    return render_page(
        request, "unavailable.html", {"title": "Bad request", "reason": reason}, status_code=400
    )


def _path_id(request: Request, name: str) -> int | None:
    """The id in the path; ``None`` when it cannot be one (no such row: a 404)."""
    try:
        return url_int(request.path_params[name], name)
    except BadNumber:
        return None


def _time(value: str | None, now: float) -> float | None:
    """A filter's time: an age (``90s``, ``30m``, ``2h``, ``7d``) or ISO 8601 (UTC unless
    an offset is given); ``None`` when empty or not understood."""
    if not value:
        return None
    text = value.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[-1:].lower() in units and text[:-1].replace(".", "", 1).isdigit():
        return now - float(text[:-1]) * units[text[-1].lower()]
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


# --------------------------------------------------------------------------- pages


class _Pages:
    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps

    def page(
        self, request: Request, template: str, context: Mapping[str, Any], status: int = 200
    ) -> Response:
        return render_page(request, template, context, status_code=status)

    async def overview(self, request: Request) -> Response:
        store = self.deps.store()
        if store is None:
            return _unavailable(request)
        now = self.deps.clock()
        start = (int(now) // 60 + 1) * 60 - DAY_MINUTES * 60
        summary = await store.call(store.store.status_summary, now)
        counts = await store.call(store.store.attempts_per_minute, start, DAY_MINUTES)
        used = await store.call(store.store.budget_used, now - 60.0)
        budgets = [
            {"account": account, "limit": limit, "used": used.get(account, 0)}
            for account, limit in sorted(self.deps.budgets().items())
        ]
        return self.page(
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
        rows = await store.call(
            store.store.console_sessions, state=state, account=account, text=text or None
        )
        states, accounts = await store.call(store.store.console_session_facets)
        last_seq = await store.call(store.store.last_event_seq)
        return self.page(
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
        session = await store.call(store.store.get_session, name) if name else None
        if session is None:
            return _not_found(request, "no such session in the archive")
        try:
            after = url_int(request.query_params.get("after"), "after") or 0
        except BadNumber as exc:
            return _bad_request(request, str(exc))
        events: list[EventRow] = await store.call(
            store.store.console_timeline, name, after_seq=after, limit=200
        )
        deliveries = await store.call(store.store.deliveries_of_events, [e.id for e in events])
        attempts = await store.call(
            store.store.attempts_of_deliveries, [d.id for d in deliveries][:500]
        )
        by_delivery: dict[int, list[AttemptRow]] = {}
        for a in attempts:
            by_delivery.setdefault(a.delivery_id, []).append(a)
        by_event: dict[str, list[tuple[DeliveryRow, list[AttemptRow]]]] = {}
        for d in deliveries:
            by_event.setdefault(d.event_id, []).append((d, by_delivery.get(d.id, [])))
        endpoints = await store.call(store.store.endpoint_states)
        last = events[-1].seq if events else after
        return self.page(
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
        rows = await store.call(
            store.store.console_deliveries,
            endpoint=q.get("endpoint") or None,
            status=status,
            since=_time(q.get("since"), now),
            until=_time(q.get("until"), now),
            before_id=before,
            limit=100,
        )
        endpoints = await store.call(store.store.endpoint_states)
        filters = {k: q.get(k, "") for k in ("endpoint", "status", "since", "until")}
        return self.page(
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
            attempt = await store.call(store.store.get_attempt, attempt_id)
        if attempt is None:
            return _not_found(request, "no such attempt (pruned by the delivery-log retention?)")
        return await self._delivery_page(request, store, attempt.delivery_id, attempt.id)

    async def _delivery_page(
        self, request: Request, store: AsyncStore, delivery_id: int, selected: int | None
    ) -> Response:
        delivery = await store.call(store.store.get_delivery, delivery_id)
        if delivery is None:
            return _not_found(request, "no such delivery")
        attempts = await store.call(store.store.list_attempts, delivery_id)
        event = await store.call(store.store.get_event, delivery.event_id)
        others = await store.call(store.store.deliveries_of_events, [delivery.event_id])
        current = next((a for a in attempts if a.id == selected), None)
        return self.page(
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


def console_routes(deps: ConsoleDeps) -> list[BaseRoute]:
    """The console's routes (pages, actions, live feed, static assets). They expect the
    access control of :mod:`.auth` in front (it attaches the session to each request)."""
    from .actions import Actions
    from .live import live_route

    pages = _Pages(deps)
    return [
        Route("/console", pages.overview, methods=["GET", "HEAD"]),
        Route("/console/sessions", pages.sessions, methods=["GET", "HEAD"]),
        Route("/console/timeline", pages.timeline, methods=["GET", "HEAD"]),
        Route("/console/deliveries", pages.deliveries, methods=["GET", "HEAD"]),
        # The ids are read by _path_id: Starlette's int convertor takes any length.
        Route("/console/deliveries/{delivery_id}", pages.delivery, methods=["GET", "HEAD"]),
        Route("/console/attempts/{attempt_id}", pages.attempt, methods=["GET", "HEAD"]),
        *Actions(deps).routes(),
        live_route(deps),
        Mount("/console/static", StaticFiles(directory=_HERE / "static"), name="console-static"),
    ]


def console_provider(ctx: WebContext) -> list[BaseRoute]:
    """The console's routes on the daemon's :class:`~sessionhook.relay.web.WebContext`."""

    def budgets() -> dict[str, int]:
        # Each account's requests_per_minute, as upstream_accounts() derives them (without
        # touching the secrets).
        config = ctx.config()
        rpm = config.api.requests_per_minute
        if not config.accounts:
            return {DEFAULT_ACCOUNT: rpm}
        return {a.name: a.requests_per_minute or rpm for a in config.accounts}

    return console_routes(
        ConsoleDeps(
            store=ctx.store,
            budgets=budgets,
            send_test=ctx.send_test,
            wake=ctx.wake,
            clock=ctx.clock,
            bell=ctx.bell,
        )
    )
