"""The console's actions: replay, retry now, recover, enable/disable an endpoint, send a
test event, approve a session's plan or answer its agent (docs/console.md).

Each is a POST of a form carrying a CSRF token, under ``/console/actions/``; the answer is
a 303 back to the page the form was on, with the outcome in a one-shot flash cookie. The
actions check the CSRF token again behind :mod:`..auth` (a route table without that
middleware must not make them forgeable); a bearer request needs none.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Final

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ....wording import counted
from ... import ops as operator
from ...domain.actions import ACTION_KINDS, ActionKind
from ...ops import OperatorError, enabled_line, requeue
from ...ops.actions import Actor, record_direct
from ...ops.wire import parse_moment
from ...store import AsyncStore, StoreError
from ...telemetry.logs import get_logger
from ..auth import CSRF_FIELD, FormError, client_address, csrf_token, read_form, web_session
from ..headers import SECURITY_HEADERS
from .common import FLASH_COOKIE, ConsoleDeps, encode_flash
from .text import parse_when

_log = get_logger()
#: Longest answer to an agent sent from the console (characters).
REPLY_MAX: Final = 10_000
_DONE: Final[dict[ActionKind, str]] = {
    "approve_plan": "approve the plan of",
    "reply": "answer",
}


def _csrf_ok(request: Request, submitted: str) -> bool:
    """The form carries its session's CSRF token (or the request showed the bearer token)."""
    if web_session(request).kind == "bearer":
        return True
    expected = csrf_token(request)
    return bool(expected) and hmac.compare_digest(submitted.encode(), expected.encode())


def _back(target: str | None) -> str:
    """Where to go after an action: a console path of this server, else the overview."""
    if not target or not target.startswith("/console") or target.startswith("//"):
        return "/console"
    if any(c in target for c in "\r\n\\"):
        return "/console"
    return target


def flash_redirect(back: str, kind: str, text: str) -> Response:
    """A 303 back to ``back`` (a console path, else the overview) with the outcome in the
    one-shot flash cookie (``kind`` ``ok`` or ``error``)."""
    response = RedirectResponse(_back(back), status_code=303, headers=SECURITY_HEADERS)
    response.set_cookie(
        FLASH_COOKIE,
        encode_flash(kind, text),
        max_age=60,
        path="/console",
        httponly=True,
        samesite="strict",
    )
    return response


async def checked_form(request: Request) -> dict[str, str] | Response:
    """The POST's form when it carries its session's CSRF token; else the answer to give
    (400 or 413 for a malformed or oversized form, 403 without the token)."""
    try:
        form = await read_form(request)
    except FormError as exc:
        status = 413 if "large" in str(exc) else 400
        return Response(str(exc), status_code=status, headers=SECURITY_HEADERS)
    if not _csrf_ok(request, form.get(CSRF_FIELD, "")):
        _log.warning("console.csrf_refused", path=request.url.path)
        return Response(
            "refused: the form is stale or comes from another site; reload the page",
            status_code=403,
            headers=SECURITY_HEADERS,
        )
    return form


#: What an action answers: the flash's kind (``ok`` or ``error``) and its line.
_Flash = tuple[str, str]
_Act = Callable[[Request, dict[str, str]], Awaitable[_Flash]]


class _Refused(Exception):
    """An action refused before it was tried: the error flash's line."""


class Actions:
    """The POST handlers (see the module docstring)."""

    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps

    def routes(self) -> list[Route]:
        """The action routes."""
        acts: dict[str, tuple[_Act, str]] = {
            # name: the handler, and what the flash of an operator's refusal starts with
            "replay": (self.replay, "replay: "),
            "retry": (self.retry, "retry: "),
            "recover": (self.recover, "recover: "),
            "endpoint": (self.endpoint, ""),
            "test": (self.test, ""),
            "session": (self.session, ""),
        }
        return [
            Route(f"/console/actions/{name}", self._post(act, prefix), methods=["POST"])
            for name, (act, prefix) in acts.items()
        ]

    def _post(self, act: _Act, prefix: str) -> Callable[[Request], Awaitable[Response]]:
        """``act`` behind the form's checks, its outcome flashed on the way back."""

        async def handle(request: Request) -> Response:
            form = await checked_form(request)
            if isinstance(form, Response):
                return form
            try:
                kind, text = await act(request, form)
            except _Refused as exc:
                kind, text = "error", str(exc)
            except (OperatorError, StoreError) as exc:
                kind, text = "error", f"{prefix}{exc}"
            return flash_redirect(form.get("back", ""), kind, text)

        return handle

    def _store(self) -> AsyncStore:
        store = self.deps.store()
        if store is None:
            raise _Refused("the store is not open yet")
        return store

    async def replay(self, request: Request, form: dict[str, str]) -> _Flash:
        """Queue one event, or a time range of events, again for an endpoint."""
        store = self._store()
        endpoint = form.get("endpoint", "")
        event_id = form.get("event", "").strip()
        now = self.deps.clock()
        since, until = parse_when(form.get("since"), now), parse_when(form.get("until"), now)
        if not endpoint:
            return "error", "replay: choose an endpoint"
        if not event_id and since is None:
            return "error", "replay: give an event, or a start time (e.g. 2h)"
        what = f"event {event_id}" if event_id else "the events of that time range"
        # The operator layer's replay (as `sessionhook replay`): a range is queued a
        # chunk at a time, each chunk one short transaction.
        result = await store.run(
            operator.replay,
            endpoint,
            event_ids=[event_id] if event_id else (),
            since=None if event_id else since,
            until=None if event_id else until,
        )
        queued = result.queued
        self.deps.wake()
        _log.info("console.replay", endpoint=endpoint, event_id=event_id or None, queued=queued)
        if queued == 0:
            return "error", f"nothing queued for {endpoint}: {result.reason}"
        return "ok", f"queued {counted(queued, 'delivery')} of {what} to {endpoint}"

    async def retry(self, request: Request, form: dict[str, str]) -> _Flash:
        """Send one delivery again now (the same row: same webhook-id and body)."""
        store = self._store()
        key = form.get("delivery", "").strip()
        if not key.isascii() or not key.isdigit() or len(key) > 18:
            return "error", "retry: choose a delivery"
        result = await store.run(requeue.retry, int(key))
        self.deps.wake()
        _log.info("console.retry", delivery=int(key), previous=result.previous)
        return "ok", result.message

    async def recover(self, request: Request, form: dict[str, str]) -> _Flash:
        """Send again now every failed or dead delivery of an endpoint since a time."""
        store = self._store()
        endpoint = form.get("endpoint", "")
        try:
            since = parse_moment(form.get("since", "").strip() or "1h", self.deps.clock())
        except ValueError as exc:
            return "error", f"recover: since: {exc}"
        result = await store.run(requeue.recover, endpoint, since)
        if result.queued:
            self.deps.wake()
        _log.info("console.recover", endpoint=endpoint, queued=result.queued)
        return ("ok" if result.queued else "error"), result.message

    async def endpoint(self, request: Request, form: dict[str, str]) -> _Flash:
        """Enable or disable an endpoint."""
        store = self._store()
        name = form.get("name", "")
        enable = form.get("enabled") == "1"
        reason = form.get("reason", "").strip()[:200] or "disabled in the console"
        if enable:
            waiting = await store.run(operator.enable_endpoint, name)
        else:
            await store.run(operator.disable_endpoint, name, reason)
        _log.info(
            "console.endpoint", endpoint=name, enabled=enable, reason=None if enable else reason
        )
        if enable:
            self.deps.wake()
            return "ok", enabled_line(name, waiting)
        return "ok", f"endpoint {name} disabled: {reason}"

    async def test(self, request: Request, form: dict[str, str]) -> _Flash:
        """Send an endpoint a signed test event now and report the answer."""
        name = form.get("name", "")
        if self.deps.send_test is None:
            return "error", "test events are not available here"
        result = await self.deps.send_test(name)
        answer = "no answer" if result.status_code is None else f"HTTP {result.status_code}"
        _log.info("console.test_event", endpoint=name, status=result.status_code, ok=result.ok)
        if result.ok:
            return "ok", f"test event to {name}: {answer} in {result.duration_ms:.0f} ms"
        detail = f" ({result.error})" if result.error else ""
        return "error", f"test event to {name} failed: {answer}{detail}"

    async def session(self, request: Request, form: dict[str, str]) -> _Flash:
        """Approve a session's plan, or answer its agent, upstream."""
        name = form.get("session", "").strip()
        action = form.get("action", "")
        text = form.get("text", "").strip() or None
        if action not in ACTION_KINDS:
            return "error", "choose approve_plan or reply"
        kind: ActionKind = "approve_plan" if action == "approve_plan" else "reply"
        if not name:
            return "error", "the form names no session: reload the page"
        if kind == "reply" and text is None:
            return "error", "answer: write something to send"
        if text is not None and len(text) > REPLY_MAX:
            return "error", f"answer: at most {REPLY_MAX} characters"
        if self.deps.act is None:
            return "error", "acting on sessions is not available here"
        outcome = await self.deps.act(name, kind, text if kind == "reply" else None)
        _log.info("console.session_action", session=name, action=kind, ok=outcome.ok)
        store = self.deps.store()
        if store is not None:  # beside the links' actions; an accepted one ends their wait
            agent = request.headers.get("user-agent", "")
            who = Actor("console", client_address(request.scope), agent)
            await record_direct(
                store,
                name,
                kind,
                outcome,
                actor=who,
                now=self.deps.clock(),
                metrics=self.deps.metrics,
            )
        if outcome.ok:
            return "ok", f"{name}: {outcome.detail}"
        status = "" if outcome.status is None else f" (HTTP {outcome.status})"
        return "error", f"could not {_DONE[kind]} {name}{status}: {outcome.detail}"
