"""What every console handler shares: its dependencies (:class:`ConsoleDeps`), the Jinja2
environment and :func:`render_page`, the one-shot flash cookie that actions leave for the
next page, and the error pages.

The templates (``templates/console/``) are Jinja2 with autoescaping on: everything shown
that came from upstream or a consumer is hostile input. Pages get their security headers
(the strict Content-Security-Policy) from :class:`~sessionhook.relay.web.headers.SecurityHeaders`.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ....redact import redact_userinfo
from ....wording import counted
from ...config import Config
from ...domain.actions import UpstreamAct
from ...store import AsyncStore
from ...telemetry.metrics import Metrics
from ..auth import CSRF_FIELD, csrf_token
from ..bell import Bell
from ..context import SendTest
from .text import age, answer, clip, outcome, pretty, stamp

#: The console package: its ``templates/`` and ``static/`` directories.
PACKAGE_DIR: Final = Path(__file__).parent
FLASH_COOKIE: Final = "sessionhook_flash"
#: Longest flash text kept (characters).
FLASH_MAX: Final = 500


@dataclass
class ConsoleDeps:
    """What the console needs from the daemon (seams for tests).

    ``store`` returns the open store, or ``None`` (the pages answer 503). A ``None``
    ``send_test``, ``act`` or ``config`` makes the test action, the session forms or the
    endpoint editor unavailable. ``wake`` tells the dispatcher deliveries were queued.
    """

    store: Callable[[], AsyncStore | None]
    budgets: Callable[[], Mapping[str, int]] = dict
    send_test: SendTest | None = None
    wake: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.time
    act: UpstreamAct | None = None
    backend: str = ""
    config: Callable[[], Config] | None = None
    metrics: Metrics | None = None
    #: Rung by the daemon when it archives events: wakes the live feed at once.
    bell: Bell = field(default_factory=Bell)
    #: Live feed: seconds between two looks at the store, and how long one stream lasts
    #: before the browser reconnects (with Last-Event-ID, nothing missed).
    live_interval: float = 1.0
    live_duration: float = 300.0
    live_max_streams: int = 16


# --------------------------------------------------------------------------- flash


def encode_flash(kind: str, text: str) -> str:
    """The flash cookie's value for an outcome (``kind`` ``ok`` or ``error``)."""
    data = json.dumps({"kind": kind, "text": text[:FLASH_MAX]}).encode()
    return base64.urlsafe_b64encode(data).decode()


def pop_flash(request: Request) -> tuple[dict[str, str] | None, str | None]:
    """The flash message the last action left (``{"kind", "text"}``), and the cookie to
    clear (``None`` when there was none). A malformed cookie is ignored."""
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None, None
    try:
        data = json.loads(base64.urlsafe_b64decode(raw.encode()))
        flash = {"kind": str(data["kind"]), "text": str(data["text"])[:FLASH_MAX]}
    except (ValueError, KeyError, TypeError):
        return None, FLASH_COOKIE
    if flash["kind"] not in ("ok", "error"):
        flash["kind"] = "error"
    return flash, FLASH_COOKIE


# --------------------------------------------------------------------------- pages

_ENV: Final = jinja2.Environment(
    loader=jinja2.FileSystemLoader(PACKAGE_DIR / "templates"),
    autoescape=True,  # every {{ }} is escaped: upstream and consumer text is hostile
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters.update(
    stamp=stamp,
    age=age,
    clip=clip,
    pretty=pretty,
    outcome=outcome,
    answer=answer,
    redacted=redact_userinfo,
    counted=counted,
)


def render_page(
    request: Request,
    template: str,
    context: Mapping[str, Any],
    *,
    status_code: int = 200,
) -> Response:
    """Render ``console/<template>`` with the flash message and the session's CSRF token."""
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


def error_page(request: Request, status_code: int, title: str, reason: str) -> Response:
    """A page saying why there is nothing to show (a 4xx or 5xx)."""
    return render_page(
        request, "unavailable.html", {"title": title, "reason": reason}, status_code=status_code
    )


def unavailable(request: Request) -> Response:
    """The 503 page of a store the daemon has not opened yet."""
    return error_page(request, 503, "Store not open", "the daemon has not opened its store yet")


class _HasDeps(Protocol):
    deps: ConsoleDeps


_H = TypeVar("_H", bound=_HasDeps)


def with_store(
    handler: Callable[[_H, Request, AsyncStore], Awaitable[Response]],
) -> Callable[[_H, Request], Awaitable[Response]]:
    """A handler method given the open store; the 503 page while the daemon has none."""

    async def page(self: _H, request: Request) -> Response:
        store = self.deps.store()
        if store is None:
            return unavailable(request)
        return await handler(self, request, store)

    return page


def not_found(request: Request, what: str) -> Response:
    """The 404 page: ``what`` is not there."""
    return error_page(request, 404, "Not found", what)


def bad_request(request: Request, reason: str) -> Response:
    """The 400 page, saying why."""
    return error_page(request, 400, "Bad request", reason)


def store_failed_page(request: Request, error: str) -> Response:
    """The page for a store that could not be read (the database down or restarting): a
    503 that names the error; reloading works again once the database is back."""
    response = error_page(
        request,
        503,
        "Store unavailable",
        f"the database cannot be read now ({error}); reload the page once it is back",
    )
    response.headers["retry-after"] = "5"
    return response
