"""Slack's side of its interactivity, for tests: the ``response_url`` a message is updated
through (a loopback stand-in recording every update), and the headers Slack signs a request
with, built as Slack's documentation describes (``v0=`` + hex HMAC-SHA256 of
``"v0:<timestamp>:<raw body>"`` under the app's signing secret)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["INTERACTIONS", "ResponseUrl", "slack_headers"]

INTERACTIONS = "/v1/integrations/slack/interactions"


@dataclass
class ResponseUrl:
    """A message's ``response_url`` on 127.0.0.1 (serve :attr:`app`, then set ``port``)."""

    port: int = 0
    updates: list[dict[str, Any]] = field(default_factory=list)

    async def _receive(self, request: Request) -> Response:
        self.updates.append(json.loads(await request.body()))
        return Response("ok")

    @property
    def app(self) -> Starlette:
        return Starlette(routes=[Route("/actions/{rest:path}", self._receive, methods=["POST"])])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/actions/T1/123/abc"


def slack_headers(body: bytes, *, secret: str, at: float | None = None) -> dict[str, str]:
    """The headers of a request Slack sends with ``body`` at ``at`` (default: now)."""
    stamp = str(int(time.time() if at is None else at))
    mac = hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256)
    return {
        "content-type": "application/x-www-form-urlencoded",
        "x-slack-request-timestamp": stamp,
        "x-slack-signature": "v0=" + mac.hexdigest(),
        "user-agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
    }
