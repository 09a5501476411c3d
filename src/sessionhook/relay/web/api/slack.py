"""``POST /v1/integrations/slack/interactions``: a Slack app's button clicks (``[slack]``).

Public: Slack's request signature stands in for the console token. Each step refuses before
the next runs: no ``[slack]`` is a 404; a body over :data:`MAX_BODY` bytes a 413, unread; a
bad signature (:mod:`...domain.slack_signing`) a 401 and ``web.slack_refused`` before the
body is parsed, so a forged or replayed request makes no upstream call; a bad payload
(:mod:`.slack_payload`) a 400. An approve or reply click is answered 200 at once (Slack
wants an answer within 3 s), then performed through the action links
(:func:`..action_pages.perform_for_chat`), and the message updated through its allowed
``response_url`` (:func:`.slack_payload.response_url_refusal`), never following a redirect.
Other clicks are a 200 that does nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Final

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ...config import SlackConfig
from ...domain.chat_markup import mrkdwn
from ...domain.slack_signing import SlackSignatureError, verify_slack_request
from ...telemetry.logs import get_logger
from ..action_pages import perform_for_chat
from ..answers import api_route
from ..auth import client_address
from ..context import PerformLink, WebContext
from .common import ApiProblem, bad_request, not_found
from .slack_payload import (
    PayloadError,
    SlackClick,
    read_interaction,
    response_url_refusal,
)

#: Largest interaction body read (a click on one of the relay's messages is a few KB).
MAX_BODY: Final = 256 * 1024
#: Seconds the message update may take.
UPDATE_TIMEOUT: Final = 10.0

_log = get_logger()


def slack_routes(ctx: WebContext) -> Sequence[BaseRoute]:
    """The interactivity route (see the module docstring)."""

    async def interactions(request: Request) -> Response:
        slack = ctx.config().slack
        if slack is None:
            raise not_found("Slack interactivity is off (no [slack] in the config)")
        body = await _bounded_body(request)
        try:
            verify_slack_request(
                slack.signing_secret.get_secret_value(),
                timestamp=request.headers.get("x-slack-request-timestamp"),
                signature=request.headers.get("x-slack-signature"),
                body=body,
                now=ctx.clock(),
            )
        except SlackSignatureError as exc:
            _log.warning(
                "web.slack_refused", client=client_address(request.scope), reason=exc.reason
            )
            raise ApiProblem(401, f"not signed by Slack: {exc.reason}") from None
        try:
            click = read_interaction(body)
        except PayloadError as exc:
            raise bad_request(str(exc)) from None
        if click.kind == "other":
            return Response(status_code=200)
        performer = ctx.perform_link or functools.partial(perform_for_chat, ctx)
        task = BackgroundTask(_act, performer, click, slack)
        return Response(status_code=200, background=task)

    return [api_route("slackInteractions", interactions)]


async def _bounded_body(request: Request) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise ApiProblem(413, f"the body is larger than {MAX_BODY} bytes")
    return bytes(body)


async def _act(perform: PerformLink, click: SlackClick, slack: SlackConfig) -> None:
    """Perform the click, then tell the message how it went (after Slack got its 200)."""
    if click.kind == "reply" and click.text is None:
        done, reason = False, "type your answer in the box first, then press Reply"
    else:
        try:
            done, reason = await perform(click.token, click.user, click.text)
        except Exception as exc:  # the update must still say something, and the loop go on
            _log.error("web.slack_action_failed", error=repr(exc)[:300])
            done, reason = False, "the relay failed to act; see its log"
    _log.info("web.slack_action", action=click.kind, user=click.user, done=done, reason=reason)
    await _update_message(click, slack, _update(click, done, reason))


def _update(click: SlackClick, done: bool, reason: str) -> dict[str, Any]:
    """The ``response_url`` body: the message without its buttons and with who acted, or a
    note to the clicking user alone when nothing was done."""
    who = mrkdwn(click.user, 200)
    if not done:
        text = f"Not done: {mrkdwn(reason, 2000)}"
        return {"response_type": "ephemeral", "replace_original": False, "text": text}
    what = "Plan approved" if click.kind == "approve" else "Answer sent"
    line = f"{what} by {who}"
    done_line = {"type": "context", "elements": [{"type": "mrkdwn", "text": line}]}
    return {"replace_original": True, "text": line, "blocks": [*click.blocks, done_line]}


async def _update_message(click: SlackClick, slack: SlackConfig, body: dict[str, Any]) -> None:
    if click.response_url is None:
        _log.warning("web.slack_update_skipped", reason="the payload had no response_url")
        return
    refusal = response_url_refusal(click.response_url, slack.response_url_hosts)
    if refusal is not None:
        _log.warning("web.slack_update_skipped", reason=refusal)
        return
    try:
        async with httpx.AsyncClient(timeout=UPDATE_TIMEOUT, follow_redirects=False) as http:
            answer = await http.post(click.response_url, json=body)
    except httpx.HTTPError as exc:
        _log.warning("web.slack_update_failed", error=type(exc).__name__)
        return
    if not answer.is_success:
        _log.warning("web.slack_update_failed", status=answer.status_code)
