"""The console's actions: replay, retry now, recover, enable/disable an endpoint, send a
test event, approve a session's plan or answer its agent.

Each is a POST of an HTML form (``application/x-www-form-urlencoded``, at most
:data:`~.auth.MAX_FORM_BYTES`) carrying a CSRF token; the answer is a 303 redirect back to the
page the form was on, with the outcome in a one-shot flash cookie that the next page shows
(escaped) and clears. A request with a missing or wrong token, or from another origin, is
refused with 403 and changes nothing.

* ``/console/actions/replay``: ``endpoint`` and either ``event`` (one event id) or
  ``since``/``until`` (a time range of the events' upstream time, ``until`` exclusive):
  queued again through the store's replay, so the consumer sees the same ``webhook-id``.
* ``/console/actions/retry``: ``delivery`` (an id): sent again now, the same row (a failed
  or dead one re-opened), its session's order kept (:mod:`...ops.requeue`).
* ``/console/actions/recover``: ``endpoint``, ``since`` (an age such as ``1h``, or a time):
  every failed or dead delivery of its events since then, due now.
* ``/console/actions/endpoint``: ``name``, ``enabled`` (``1``/``0``), optional ``reason``.
* ``/console/actions/test``: ``name``: a signed ``ping`` sent now, never archived.
* ``/console/actions/session``: ``session``, ``action`` (``approve_plan`` or ``reply``) and
  for a reply its ``text``: made upstream with the session's account by the daemon
  (:attr:`~.common.ConsoleDeps.act`); the flash says what the service answered (its
  one-line message when it refused).

The access control in front (:mod:`.auth`) refuses a cookie session's POST without its CSRF
token before it gets here; the actions check the token again (defence in depth: a route
table without that middleware must not make them forgeable). Requests that showed the
bearer token need none (a browser never adds that header on its own).
"""

from __future__ import annotations

import hmac
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

__all__ = ["REPLY_MAX", "Actions", "checked_form", "flash_redirect"]

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


_done = flash_redirect


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


class Actions:
    """The POST handlers (see the module docstring)."""

    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps

    def routes(self) -> list[Route]:
        """The action routes."""
        return [
            Route("/console/actions/replay", self.replay, methods=["POST"]),
            Route("/console/actions/retry", self.retry, methods=["POST"]),
            Route("/console/actions/recover", self.recover, methods=["POST"]),
            Route("/console/actions/endpoint", self.endpoint, methods=["POST"]),
            Route("/console/actions/test", self.test, methods=["POST"]),
            Route("/console/actions/session", self.session, methods=["POST"]),
        ]

    async def _form(self, request: Request) -> dict[str, str] | Response:
        return await checked_form(request)

    async def _store_form(self, request: Request) -> tuple[dict[str, str], AsyncStore] | Response:
        """The form (see :meth:`_form`) and the open store; else the answer to give."""
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        store = self.deps.store()
        if store is None:
            return _done(form.get("back", ""), "error", "the store is not open yet")
        return form, store

    async def replay(self, request: Request) -> Response:
        """Queue one event, or a time range of events, again for an endpoint."""
        prepared = await self._store_form(request)
        if isinstance(prepared, Response):
            return prepared
        form, store = prepared
        back = form.get("back", "")
        endpoint = form.get("endpoint", "")
        event_id = form.get("event", "").strip()
        now = self.deps.clock()
        since, until = parse_when(form.get("since"), now), parse_when(form.get("until"), now)
        if not endpoint:
            return _done(back, "error", "replay: choose an endpoint")
        if not event_id and since is None:
            return _done(back, "error", "replay: give an event, or a start time (e.g. 2h)")
        what = f"event {event_id}" if event_id else "the events of that time range"
        try:
            # The operator layer's replay (as `sessionhook replay`): a range is queued a
            # chunk at a time, each chunk one short transaction.
            result = await store.run(
                operator.replay,
                endpoint,
                event_ids=[event_id] if event_id else (),
                since=None if event_id else since,
                until=None if event_id else until,
            )
        except (OperatorError, StoreError) as exc:
            return _done(back, "error", f"replay: {exc}")
        queued = result.queued
        self.deps.wake()
        _log.info("console.replay", endpoint=endpoint, event_id=event_id or None, queued=queued)
        if queued == 0:
            return _done(back, "error", f"nothing queued for {endpoint}: {result.reason}")
        return _done(back, "ok", f"queued {counted(queued, 'delivery')} of {what} to {endpoint}")

    async def retry(self, request: Request) -> Response:
        """Send one delivery again now (the same row: same webhook-id and body)."""
        prepared = await self._store_form(request)
        if isinstance(prepared, Response):
            return prepared
        form, store = prepared
        back = form.get("back", "")
        key = form.get("delivery", "").strip()
        if not key.isascii() or not key.isdigit() or len(key) > 18:
            return _done(back, "error", "retry: choose a delivery")
        try:
            result = await store.run(requeue.retry, int(key))
        except (OperatorError, StoreError) as exc:
            return _done(back, "error", f"retry: {exc}")
        self.deps.wake()
        _log.info("console.retry", delivery=int(key), previous=result.previous)
        return _done(back, "ok", result.message)

    async def recover(self, request: Request) -> Response:
        """Send again now every failed or dead delivery of an endpoint since a time."""
        prepared = await self._store_form(request)
        if isinstance(prepared, Response):
            return prepared
        form, store = prepared
        back = form.get("back", "")
        endpoint = form.get("endpoint", "")
        try:
            since = parse_moment(form.get("since", "").strip() or "1h", self.deps.clock())
        except ValueError as exc:
            return _done(back, "error", f"recover: since: {exc}")
        try:
            result = await store.run(requeue.recover, endpoint, since)
        except (OperatorError, StoreError) as exc:
            return _done(back, "error", f"recover: {exc}")
        if result.queued:
            self.deps.wake()
        _log.info("console.recover", endpoint=endpoint, queued=result.queued)
        return _done(back, "ok" if result.queued else "error", result.message)

    async def endpoint(self, request: Request) -> Response:
        """Enable or disable an endpoint."""
        prepared = await self._store_form(request)
        if isinstance(prepared, Response):
            return prepared
        form, store = prepared
        back = form.get("back", "")
        name = form.get("name", "")
        enable = form.get("enabled") == "1"
        reason = form.get("reason", "").strip()[:200] or "disabled in the console"
        try:
            if enable:
                waiting = await store.run(operator.enable_endpoint, name)
            else:
                await store.run(operator.disable_endpoint, name, reason)
        except (OperatorError, StoreError) as exc:
            return _done(back, "error", str(exc))
        _log.info(
            "console.endpoint", endpoint=name, enabled=enable, reason=None if enable else reason
        )
        if enable:
            self.deps.wake()
            return _done(back, "ok", enabled_line(name, waiting))
        return _done(back, "ok", f"endpoint {name} disabled: {reason}")

    async def test(self, request: Request) -> Response:
        """Send an endpoint a signed test event now and report the answer."""
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        back = form.get("back", "")
        name = form.get("name", "")
        if self.deps.send_test is None:
            return _done(back, "error", "test events are not available here")
        try:
            result = await self.deps.send_test(name)
        except OperatorError as exc:
            return _done(back, "error", str(exc))
        answer = "no answer" if result.status_code is None else f"HTTP {result.status_code}"
        _log.info("console.test_event", endpoint=name, status=result.status_code, ok=result.ok)
        if result.ok:
            return _done(
                back, "ok", f"test event to {name}: {answer} in {result.duration_ms:.0f} ms"
            )
        detail = f" ({result.error})" if result.error else ""
        return _done(back, "error", f"test event to {name} failed: {answer}{detail}")

    async def session(self, request: Request) -> Response:
        """Approve a session's plan, or answer its agent, upstream."""
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        back = form.get("back", "")
        name = form.get("session", "").strip()
        action = form.get("action", "")
        text = form.get("text", "").strip() or None
        if action not in ACTION_KINDS:
            return _done(back, "error", "choose approve_plan or reply")
        kind: ActionKind = "approve_plan" if action == "approve_plan" else "reply"
        what = _DONE[kind]
        if not name:
            return _done(back, "error", "the form names no session: reload the page")
        if kind == "reply" and text is None:
            return _done(back, "error", "answer: write something to send")
        if text is not None and len(text) > REPLY_MAX:
            return _done(back, "error", f"answer: at most {REPLY_MAX} characters")
        if self.deps.act is None:
            return _done(back, "error", "acting on sessions is not available here")
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
            return _done(back, "ok", f"{name}: {outcome.detail}")
        status = "" if outcome.status is None else f" (HTTP {outcome.status})"
        return _done(back, "error", f"could not {what} {name}{status}: {outcome.detail}")
