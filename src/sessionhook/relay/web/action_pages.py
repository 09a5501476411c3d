"""The pages behind signed action links (``[actions]``): ``/actions/<token>``.

``GET`` shows the plan or the question with a confirm button or a reply box and never
changes anything (link previews fetch links). ``POST`` from that page performs
(:func:`~sessionhook.relay.ops.actions.perform`) with a form token bound to the link, so a
person who never logged in can act, unless ``actions.require_login``. A link that can do
nothing gives a page that says so, and no upstream call. Every answer is ``no-store`` and
sends no referrer (the token is in the URL).
"""

from __future__ import annotations

from html import escape
from typing import Final

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from ..config import ConfigError
from ..domain.action_links import check_form_token, form_token
from ..ops.actions import (
    MAX_REPLY_CHARS,
    REFUSALS,
    SAMPLE_NOTICE,
    Actor,
    Looked,
    look,
    perform,
)
from ..telemetry.logs import get_logger
from .auth import FormError, client_address, csrf_field, read_form
from .context import WebContext

ACTIONS_PREFIX: Final = "/actions/"
#: Status of a page per reason nothing can be done.
_STATUS: Final = {"malformed": 404, "bad signature": 404, "expired": 410, "sample": 200}
_HEADERS: Final = {"cache-control": "no-store", "referrer-policy": "no-referrer"}

_log = get_logger()

_PAGE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>sessionhook: {heading}</title>
<link rel="stylesheet" href="/login.css">
</head><body><main class="action card">
<h1>{heading}</h1>
{body}
</main></body></html>
"""


def is_public_path(ctx: WebContext, path: str) -> bool:
    """Whether ``path`` is an action page served without the console's login."""
    return path.startswith(ACTIONS_PREFIX) and not ctx.config().actions.require_login


def _page(heading: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        _PAGE.format(heading=escape(heading), body=body), status_code=status, headers=_HEADERS
    )


def _refused(reason: str, detail: str = "") -> HTMLResponse:
    text = REFUSALS.get(reason, detail or reason)
    body = f'<p class="error" role="alert">{escape(text)}</p>'
    return _page("Nothing was done", body, _STATUS.get(reason, 409))


class ActionPages:
    """The two routes over a :class:`WebContext`."""

    def __init__(self, ctx: WebContext) -> None:
        self._ctx = ctx

    def _keys(self, request: Request) -> tuple[bytes, ...] | None:
        ctx = self._ctx
        actions = ctx.config().actions
        if ctx.link_keys is None or not actions.enabled:
            return None
        if actions.require_login and "web_session" not in request.scope.get("state", {}):
            return None  # no login behind it: the console is off (a reload turned it on)
        return ctx.link_keys.ring().all(ctx.clock())

    async def show(self, request: Request) -> Response:
        """``GET /actions/<token>``: what the link would do (reads only)."""
        token = request.path_params["token"]
        keys = self._available(request)
        if isinstance(keys, Response):
            return keys
        store = self._ctx.store()
        if store is None:
            return _page("Not ready", "<p>The relay is starting: try again in a moment.</p>", 503)
        looked = await look(store, keys, token, now=self._ctx.clock())
        if looked.claims is None or looked.problem is not None:
            return _refused(looked.problem or "malformed")
        return _page(_heading(looked), self._form(request, token, looked))

    async def act(self, request: Request) -> Response:
        """``POST /actions/<token>``: do it, once, and say how it went."""
        token = request.path_params["token"]
        keys = self._available(request)
        if isinstance(keys, Response):
            return keys
        ctx = self._ctx
        store, act = ctx.store(), ctx.act
        if store is None or act is None:
            return _page("Not ready", "<p>The relay is starting: try again in a moment.</p>", 503)
        try:
            form = await read_form(request)
        except FormError as exc:
            return _page("Nothing was done", f"<p class=error>{escape(str(exc))}</p>", 400)
        if not check_form_token(keys, token, form.get("form_token", "")):
            _log.warning("actions.form_refused", client=client_address(request.scope))
            body = "<p class=error>This form did not come from this link's page: open the link.</p>"
            return _page("Nothing was done", body, 403)
        actor = Actor("link", client_address(request.scope), request.headers.get("user-agent", ""))
        done = await perform(
            store,
            act,
            keys,
            token,
            actor=actor,
            text=form.get("text"),
            now=ctx.clock(),
            metrics=ctx.metrics,
        )
        _log.info("actions.link", reason=done.reason, client=actor.address)
        if done.reason == "sample":
            text = escape(REFUSALS["sample"])
            return _page("Sample: nothing was sent", f'<p class="notice">{text}</p>')
        if done.outcome is None:
            return _refused(done.reason)
        if not done.ok:
            body = f"<p class=error>The service refused: {escape(done.outcome.detail)}</p>"
            return _page("Not done", body, 502)
        said = form.get("text", "")
        echo = f"<blockquote class=reply>{escape(said)}</blockquote>" if said else ""
        return _page("Done", f"<p>{escape(done.outcome.detail.capitalize())}.</p>{echo}")

    def _available(self, request: Request) -> tuple[bytes, ...] | Response:
        try:
            keys = self._keys(request)
        except ConfigError as exc:
            _log.error("actions.key_unreadable", error=str(exc))
            return _page("Not available", "<p>The relay cannot read its link key.</p>", 503)
        if keys is None:
            return _page("Not found", "<p>No such page.</p>", 404)
        return keys

    def _form(self, request: Request, token: str, looked: Looked) -> str:
        assert looked.claims is not None
        ctx = self._ctx
        assert ctx.link_keys is not None
        key = ctx.link_keys.ring().current
        parts = [
            f"<p>Session: <strong>{escape(looked.title or looked.claims.session)}</strong></p>"
        ]
        if looked.sample:
            parts.insert(0, f'<p class="notice" role="note">{escape(SAMPLE_NOTICE)}</p>')
        activity = looked.activity
        if looked.claims.action == "approve_plan":
            plan = activity.plan_generated if activity is not None else None
            steps = plan.plan.steps if plan is not None else []
            items = "".join(
                f"<li><strong>{escape(s.title)}</strong>"
                + (f"<br>{escape(s.description)}" if s.description else "")
                + "</li>"
                for s in steps
            )
            parts.append(f"<ol class=steps>{items}</ol>" if items else "<p>(no plan archived)</p>")
            control = '<button type="submit">Approve the plan</button>'
        else:
            asked = activity.agent_messaged if activity is not None else None
            question = asked.agent_message if asked is not None else ""
            parts.append(f"<blockquote class=question>{escape(question)}</blockquote>")
            control = (
                f'<label for="text">Your answer</label>'
                f'<textarea id="text" name="text" rows="6" maxlength="{MAX_REPLY_CHARS}" '
                "required></textarea>"
                '<button type="submit">Send the answer</button>'
            )
        login = str(csrf_field(request)) if ctx.config().actions.require_login else ""
        parts.append(
            f'<form method="post" action="{escape(ACTIONS_PREFIX + token)}">'
            f'<input type="hidden" name="form_token" value="{escape(form_token(key, token))}">'
            f"{login}{control}</form>"
        )
        return "\n".join(parts)


def _heading(looked: Looked) -> str:
    assert looked.claims is not None
    if looked.sample:
        return (
            "Sample: approve the plan?"
            if looked.claims.action == "approve_plan"
            else ("Sample: the agent asks")
        )
    return "Approve the plan?" if looked.claims.action == "approve_plan" else "The agent asks"


async def perform_for_chat(
    ctx: WebContext, token: str, chat_user: str, text: str | None
) -> tuple[bool, str]:
    """Act on a link ``token`` for a chat service's button, as ``chat_user``: ``(done, one
    line for the user)``; bind it with ``functools.partial(perform_for_chat, ctx)``."""
    store, act = ctx.store(), ctx.act
    if store is None or act is None or ctx.link_keys is None:
        return False, "the relay is starting: try again in a moment"
    if not ctx.config().actions.enabled:
        return False, "action links are off on this relay"
    try:
        keys = ctx.link_keys.ring().all(ctx.clock())
    except ConfigError as exc:
        _log.error("actions.key_unreadable", error=str(exc))
        return False, "the relay cannot read its link key"
    actor = Actor("slack", "slack", "Slack interactivity", chat_user)
    done = await perform(
        store, act, keys, token, actor=actor, text=text, now=ctx.clock(), metrics=ctx.metrics
    )
    if done.outcome is not None:
        return done.ok, done.outcome.detail
    return False, REFUSALS.get(done.reason, done.reason)


def action_routes(ctx: WebContext) -> list[BaseRoute]:
    """``GET``/``HEAD``/``POST /actions/{token}`` (404 while ``[actions]`` is off)."""
    pages = ActionPages(ctx)
    return [
        Route(ACTIONS_PREFIX + "{token}", pages.show, methods=["GET", "HEAD"]),
        Route(ACTIONS_PREFIX + "{token}", pages.act, methods=["POST"]),
    ]
