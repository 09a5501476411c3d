"""A webhook consumer for the black-box tests: verifies, records, misbehaves on request.

Independent of ``sessionhook``: signatures are checked with the Standard Webhooks reference
package only. Each endpoint is a path ``/hook/<name>`` with its own secret and behaviour;
every request is recorded as a :class:`Hit` with a global sequence number taken when it
arrived and another when it was answered, so a test can tell whether a request was sent
before an earlier one had been acknowledged. In-flight requests are counted globally and
per (endpoint, session).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.loopback import LoopbackServer

__all__ = ["Behaviour", "Consumer", "Hit", "new_secret", "verify_v1a"]


def new_secret() -> str:
    """A fresh Standard Webhooks secret: ``whsec_`` + base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def verify_v1a(public_key: str, headers: dict[str, str], raw: bytes) -> str | None:
    """Check a Standard Webhooks ``v1a`` (ed25519) signature with PyNaCl; the reason it
    fails, or ``None``. Tolerance: 5 minutes, as the reference verifiers use."""
    msg_id = headers.get("webhook-id", "")
    stamp = headers.get("webhook-timestamp", "")
    if not msg_id or not stamp.isdigit():
        return "missing webhook-id or webhook-timestamp"
    if abs(time.time() - int(stamp)) > 300:
        return "timestamp out of tolerance"
    key = VerifyKey(base64.b64decode(public_key.removeprefix("whpk_")))
    content = f"{msg_id}.{stamp}.".encode() + raw
    for entry in headers.get("webhook-signature", "").split():
        version, _, encoded = entry.partition(",")
        if version != "v1a":
            continue
        try:
            key.verify(content, base64.b64decode(encoded))
        except (BadSignatureError, ValueError):
            continue
        return None
    return "no matching v1a signature"


@dataclass
class Behaviour:
    """How one endpoint answers.

    ``status``: answer every request with it (410, 302...; 302 carries a ``Location`` to
    ``/redirected/<name>``, which records anything that follows it). ``refuse_first``:
    answer the first attempt of each ``webhook-id`` with ``refuse_status`` (and
    ``Retry-After: refuse_retry_after`` when set). ``delay``: seconds to wait before
    answering; ``first_delay``: seconds to wait before answering the first attempt of each
    ``webhook-id`` only (a consumer that times out once).
    """

    secret: str
    status: int | None = None
    refuse_first: bool = False
    refuse_status: int = 503
    refuse_retry_after: str | None = None
    delay: float = 0.0
    first_delay: float = 0.0
    #: A ``whpk_`` ed25519 public key: verify ``v1a`` signatures (with PyNaCl, independent
    #: of the relay's signing code) instead of the ``v1`` HMAC.
    public_key: str | None = None


@dataclass(frozen=True)
class Hit:
    """One request received on ``/hook/<endpoint>``."""

    seq: int  # global order of arrival
    answered_seq: int  # global order of the answer (same counter as seq)
    endpoint: str
    webhook_id: str
    webhook_timestamp: str
    attempt: int  # 1 for the first request with this webhook-id at this endpoint
    arrived: float  # time.monotonic()
    answered: float
    status: int  # what the consumer answered
    verified: bool
    error: str | None
    headers: dict[str, str]
    raw: bytes
    body: dict[str, Any] | None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def type(self) -> str | None:
        return None if self.body is None else self.body.get("type")

    @property
    def session(self) -> str | None:
        data = (self.body or {}).get("data") or {}
        return (data.get("session") or {}).get("name")

    @property
    def activity(self) -> dict[str, Any] | None:
        data = (self.body or {}).get("data") or {}
        activity = data.get("activity")
        return activity if isinstance(activity, dict) else None

    @property
    def activity_name(self) -> str | None:
        activity = self.activity
        return None if activity is None else activity.get("name")


class Consumer:
    """Serve ``/hook/<name>`` endpoints on 127.0.0.1; use as a context manager."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._behaviour: dict[str, Behaviour] = {}
        self._hits: list[Hit] = []
        self._attempts: Counter[tuple[str, str]] = Counter()
        self._seq = 0
        self._in_flight = 0
        self._in_flight_by_key: Counter[tuple[str, str]] = Counter()
        #: Highest number of requests being handled at once, over all endpoints.
        self.max_in_flight = 0
        #: Highest number at once for one (endpoint, session): more than 1 breaks ordering.
        self.max_in_flight_per_session = 0
        #: Requests that followed a redirect (``/redirected/<name>``).
        self.followed: list[str] = []
        #: Requests to unknown paths.
        self.strays: list[str] = []
        self._server = LoopbackServer(
            Starlette(
                routes=[
                    Route("/hook/{name}", self._hook, methods=["POST"]),
                    Route("/redirected/{name}", self._redirected, methods=["GET", "POST"]),
                    Route("/{path:path}", self._stray, methods=["GET", "POST"]),
                ]
            )
        )

    def __enter__(self) -> Consumer:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def add_endpoint(self, name: str, **behaviour: Any) -> tuple[str, str]:
        """Register ``/hook/<name>``; returns ``(url, secret)``."""
        secret = behaviour.pop("secret", None) or new_secret()
        with self._lock:
            self._behaviour[name] = Behaviour(secret=secret, **behaviour)
        return f"{self._server.url}/hook/{name}", secret

    def behave(self, name: str, **changes: Any) -> None:
        """Change an endpoint's behaviour while running."""
        with self._lock:
            for key, value in changes.items():
                setattr(self._behaviour[name], key, value)

    @property
    def in_flight(self) -> int:
        """Requests being handled right now."""
        with self._lock:
            return self._in_flight

    def hits(self, endpoint: str | None = None) -> list[Hit]:
        """Recorded requests in order of arrival."""
        with self._lock:
            hits = [h for h in self._hits if endpoint is None or h.endpoint == endpoint]
        return sorted(hits, key=lambda h: h.seq)

    def delivered(self, endpoint: str) -> list[Hit]:
        """The 2xx-answered requests of an endpoint, in order of arrival."""
        return [h for h in self.hits(endpoint) if h.ok]

    def delivered_activity_names(self, endpoint: str) -> set[str]:
        return {h.activity_name for h in self.delivered(endpoint) if h.activity_name}

    # ------------------------------------------------------------------ handlers

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def _hook(self, request: Request) -> Response:
        name = request.path_params["name"]
        raw = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        webhook_id = headers.get("webhook-id", "")
        body: dict[str, Any] | None
        try:
            parsed = json.loads(raw)
            body = parsed if isinstance(parsed, dict) else None
        except ValueError:
            body = None
        session = ((body or {}).get("data") or {}).get("session") or {}
        key = (name, str(session.get("name")))
        with self._lock:
            seq = self._next_seq()
            arrived = time.monotonic()
            behaviour = self._behaviour.get(name)
            self._attempts[(name, webhook_id)] += 1
            attempt = self._attempts[(name, webhook_id)]
            self._in_flight += 1
            self._in_flight_by_key[key] += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            self.max_in_flight_per_session = max(
                self.max_in_flight_per_session, self._in_flight_by_key[key]
            )
        try:
            verified, error = False, "no such endpoint"
            if behaviour is not None and behaviour.public_key is not None:
                error = verify_v1a(behaviour.public_key, headers, raw)
                verified = error is None
            elif behaviour is not None:
                try:
                    Webhook(behaviour.secret).verify(raw, headers, json_parse=False)
                    verified, error = True, None
                except WebhookVerificationError as exc:
                    error = f"signature: {exc}"
            if behaviour is not None:
                pause = behaviour.delay + (behaviour.first_delay if attempt == 1 else 0.0)
                if pause > 0:
                    await asyncio.sleep(pause)
            response_headers: dict[str, str] = {}
            if behaviour is None:
                status = 404
            elif not verified:
                status = 401
            elif behaviour.status is not None:
                status = behaviour.status
                if 300 <= status < 400:
                    response_headers["Location"] = f"/redirected/{name}"
            elif behaviour.refuse_first and attempt == 1:
                status = behaviour.refuse_status
                if behaviour.refuse_retry_after is not None:
                    response_headers["Retry-After"] = behaviour.refuse_retry_after
            else:
                status = 200
        finally:
            with self._lock:
                self._in_flight -= 1
                self._in_flight_by_key[key] -= 1
        with self._lock:
            hit = Hit(
                seq=seq,
                answered_seq=self._next_seq(),
                endpoint=name,
                webhook_id=webhook_id,
                webhook_timestamp=headers.get("webhook-timestamp", ""),
                attempt=attempt,
                arrived=arrived,
                answered=time.monotonic(),
                status=status,
                verified=verified,
                error=error,
                headers=headers,
                raw=raw,
                body=body,
            )
            self._hits.append(hit)
        return JSONResponse({"received": webhook_id}, status_code=status, headers=response_headers)

    async def _redirected(self, request: Request) -> Response:
        with self._lock:
            self.followed.append(request.path_params["name"])
        return JSONResponse({"followed": True})

    async def _stray(self, request: Request) -> Response:
        with self._lock:
            self.strays.append(f"{request.method} {request.url.path}")
        return JSONResponse({"error": "no such path"}, status_code=404)
