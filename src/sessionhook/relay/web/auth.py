"""Access control of the web layer: bearer token, login cookie, CSRF (docs/security.md).

Everything on ``[server] listen`` but the public routes (health, ``/openapi.json``,
``/login``, Slack's signed interactivity) goes through :class:`AuthMiddleware`, deny by
default: a route added to the table is protected without saying so.

* ``Authorization: Bearer <token>``, compared in constant time; needs no CSRF token.
* The stateless session cookie :data:`COOKIE` that ``POST /login`` sets:
  ``v1.<issued>.<nonce>.<mac>`` under a key derived from the token, valid for
  :data:`SESSION_LIFETIME` seconds (changing the token logs everybody out).
* ``server.allow_unauthenticated`` (loopback only): an anonymous session cookie, so forms
  still carry a CSRF token, and the ``Host`` header must name a loopback host.

A missing or expired credential is 401 (or a redirect to ``/login`` for a browser); a wrong
token is also one ``web.auth_failed`` line, never the token. A cookie session's request
other than GET/HEAD/OPTIONS must carry its CSRF token (:func:`csrf_token`, an HMAC of the
session's nonce) in :data:`CSRF_FIELD` or :data:`CSRF_HEADER`, else 403. Forms are read
here (at most :data:`MAX_FORM_BYTES`) and replayed to the route unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from html import escape
from typing import Final, Literal
from urllib.parse import parse_qs, quote

from markupsafe import Markup
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import is_loopback
from ..domain.api_paths import OPERATIONS
from ..telemetry.logs import get_logger
from .answers import error_response
from .headers import adding_headers

COOKIE: Final = "sessionhook_session"
CSRF_FIELD: Final = "csrf_token"
CSRF_HEADER: Final = "x-csrf-token"
#: Seconds a login lasts.
SESSION_LIFETIME: Final = 12 * 3600
#: Largest request body a protected POST may have (forms are small).
MAX_FORM_BYTES: Final = 64 * 1024
#: Served without authentication (Slack's interactivity: Slack's signature instead).
PUBLIC_PATHS: Final = frozenset(
    {"/healthz", "/readyz", "/metrics", "/openapi.json", "/login", "/login.css"}
    | {OPERATIONS["slackInteractions"].path}
)
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})

_log = get_logger()


@dataclass(frozen=True, slots=True)
class WebSession:
    """Who a request is: ``kind`` says how it got in; ``nonce`` identifies a cookie session
    (empty for bearer requests, which need no CSRF token)."""

    kind: Literal["bearer", "cookie", "anonymous"]
    nonce: str
    csrf: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class WebAuth:
    """The credentials of one web app: the token (``None``: not required), the cookie key."""

    def __init__(
        self,
        token: str | None,
        *,
        clock: Callable[[], float] = time.time,
        lifetime: float = SESSION_LIFETIME,
        on_failure: Callable[[str], None] = lambda via: None,
    ) -> None:
        self.required = token is not None
        #: Told ``"bearer"`` or ``"login"`` for each wrong token (the daemon counts them).
        self.on_failure = on_failure
        self._token = token.encode() if token is not None else b""
        # Derived from the token: every replica sharing it accepts the cookie, a new token
        # ends every login. Without a token, a per-process key (anonymous sessions only).
        seed = self._token if token is not None else secrets.token_bytes(32)
        self._key = hmac.new(seed, b"sessionhook.web.session.v1", hashlib.sha256).digest()
        self._clock = clock
        self.lifetime = lifetime

    def check_token(self, presented: str) -> bool:
        """Whether ``presented`` is the token; constant time whatever it is."""
        return self.required and hmac.compare_digest(presented.encode(), self._token)

    def _mac(self, text: str) -> str:
        return _b64(hmac.new(self._key, text.encode(), hashlib.sha256).digest())

    def new_session(
        self, kind: Literal["cookie", "anonymous"] = "cookie"
    ) -> tuple[WebSession, str]:
        """A fresh session and its cookie value."""
        issued = int(self._clock())
        nonce = _b64(secrets.token_bytes(16))
        body = f"v1.{issued}.{nonce}"
        return self._session(kind, nonce), f"{body}.{self._mac(body)}"

    def _session(self, kind: Literal["cookie", "anonymous"], nonce: str) -> WebSession:
        return WebSession(kind, nonce, self._mac(f"csrf.{nonce}"))

    def session_from_cookie(self, value: str) -> WebSession | None:
        """The session a cookie value stands for, or ``None`` (forged, expired, malformed)."""
        body, _, mac = value.rpartition(".")
        parts = body.split(".")
        if len(parts) != 3 or parts[0] != "v1" or not parts[1].isdigit():
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(body).encode()):
            return None
        age = self._clock() - int(parts[1])
        if not -60 <= age <= self.lifetime:
            return None
        return self._session("cookie" if self.required else "anonymous", parts[2])

    def bearer(self) -> WebSession:
        """The session of a request that showed the token in its Authorization header."""
        return WebSession("bearer", "", "")


def logged_path(path: str) -> str:
    """``path`` as log lines show it: an action link's token (a capability) left out."""
    return "/actions/<token>" if path.startswith("/actions/") else path


def client_address(scope: Scope) -> str:
    """The client's address for log lines and the actions' record: the TCP peer, or what a
    trusted proxy forwarded (only when it is an IP address)."""
    client = scope.get("client")
    if not client:
        return "unknown"
    address = str(client[0])
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return "not an address (X-Forwarded-For)"
    return address


def safe_next(target: str | None) -> str:
    """Where to go after login: a local path, never another host (``//evil``, ``\\``)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def web_session(request: Request) -> WebSession:
    """The session :class:`AuthMiddleware` attached to ``request``."""
    session: WebSession = request.scope["state"]["web_session"]
    return session


def csrf_token(request: Request) -> str:
    """The CSRF token to send back with a POST from this request's session (templates:
    a hidden field named :data:`CSRF_FIELD`, or the header :data:`CSRF_HEADER` from JS)."""
    return web_session(request).csrf


def csrf_field(request: Request) -> Markup:
    """``<input type="hidden" name="csrf_token" value="...">`` for a form."""
    return Markup(
        f'<input type="hidden" name="{CSRF_FIELD}" value="{escape(csrf_token(request))}">'
    )


class FormError(Exception):
    """A form that cannot be read: too large, not url-encoded, not UTF-8."""


async def read_form(request: Request, limit: int = MAX_FORM_BYTES) -> dict[str, str]:
    """The url-encoded form of a POST as ``{name: first value}``, at most ``limit`` bytes
    (no multipart: the console's forms carry no files). Raises :class:`FormError`."""
    kind = request.headers.get("content-type", "")
    if not kind.startswith("application/x-www-form-urlencoded"):
        raise FormError("expected an application/x-www-form-urlencoded form")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise FormError("form too large")
        chunks.append(chunk)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise FormError("the form is not UTF-8") from None
    return {k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}


def _wants_html(headers: Headers) -> bool:
    return "text/html" in headers.get("accept", "")


def _cookie_header(request_scheme: str, value: str, max_age: int) -> str:
    parts = [f"{COOKIE}={value}", "Path=/", f"Max-Age={max_age}", "HttpOnly", "SameSite=Strict"]
    if request_scheme == "https":
        parts.append("Secure")
    return "; ".join(parts)


def set_session_cookie(response: Response, request: Request, value: str, max_age: int) -> None:
    """Attach the session cookie (``max_age`` 0 deletes it)."""
    response.raw_headers.append(
        (b"set-cookie", _cookie_header(request.url.scheme, value, max_age).encode("latin-1"))
    )


class AuthMiddleware:
    """ASGI middleware guarding every path but ``public``; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        auth: WebAuth,
        public: Collection[str] = PUBLIC_PATHS,
        is_public: Callable[[str], bool] | None = None,
    ):
        self.app = app
        self.auth = auth
        self.public = frozenset(public)
        #: Paths public by a rule rather than by name (the action links' pages).
        self.is_public = is_public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] in self.public or (self.is_public and self.is_public(scope["path"])):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if not self.auth.required and not _loopback_host(request.headers.get("host", "")):
            # No token: a page whose name was rebound to 127.0.0.1 must not get in.
            await _plain(403, "without a token, the console answers loopback names only")(
                scope, receive, send
            )
            return
        session, new_cookie = self._authenticate(request)
        if session is None:
            await self._refuse(request)(scope, receive, send)
            return
        scope.setdefault("state", {})["web_session"] = session
        if scope["method"] not in _SAFE_METHODS and session.kind != "bearer":
            body = await read_body(receive, MAX_FORM_BYTES)
            if body is None:
                await _plain(413, "request body too large")(scope, receive, send)
                return
            if not _csrf_ok(request.headers, body, session.csrf):
                _log.warning(
                    "web.csrf_failed", client=client_address(scope), path=logged_path(scope["path"])
                )
                await _plain(403, "missing or wrong CSRF token")(scope, receive, send)
                return
            receive = replay_body(body, receive)
        if new_cookie is not None:
            cookie = _cookie_header(request.url.scheme, new_cookie, int(self.auth.lifetime))
            send = adding_headers(send, [(b"set-cookie", cookie.encode("latin-1"))])
        await self.app(scope, receive, send)

    def _authenticate(self, request: Request) -> tuple[WebSession | None, str | None]:
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, presented = header.partition(" ")
            if scheme.lower() == "bearer" and self.auth.check_token(presented.strip()):
                return self.auth.bearer(), None
            if self.auth.required:
                _log.warning(
                    "web.auth_failed",
                    client=client_address(request.scope),
                    path=logged_path(request.scope["path"]),
                    via="bearer",
                )
                self.auth.on_failure("bearer")
                request.scope["sessionhook.wrong_token"] = True
                return None, None
        cookie = request.cookies.get(COOKIE)
        if cookie:
            session = self.auth.session_from_cookie(cookie)
            if session is not None:
                return session, None
        if not self.auth.required:
            session, value = self.auth.new_session("anonymous")
            return session, value
        return None, None

    def _refuse(self, request: Request) -> Response:
        wrong = request.scope.get("sessionhook.wrong_token", False)
        if not wrong and request.method == "GET" and _wants_html(request.headers):
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
        return error_response(
            401,
            "wrong token" if wrong else "authentication required",
            {"www-authenticate": 'Bearer realm="sessionhook"'},
        )


def _loopback_host(host_header: str) -> bool:
    host = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
    host = host.removeprefix("[").split("]")[0]
    return is_loopback(host)


def _plain(status: int, message: str) -> Response:
    return error_response(status, message)


def _csrf_ok(headers: Headers, body: bytes, expected: str) -> bool:
    presented = headers.get(CSRF_HEADER)
    if presented is None and headers.get("content-type", "").startswith(
        "application/x-www-form-urlencoded"
    ):
        try:
            values = parse_qs(body.decode("utf-8"), keep_blank_values=True).get(CSRF_FIELD)
        except UnicodeDecodeError:
            values = None
        presented = values[0] if values else None
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """A request's whole body, read from ``receive``; ``None`` once it grows past
    ``limit`` bytes (the rest is left unread)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay_body(body: bytes, original: Receive) -> Receive:
    """A ``receive`` that gives ``body`` (read by :func:`read_body`) once, then what
    ``original`` gives (the disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await original()  # the body is consumed: what remains is the disconnect

    return receive
