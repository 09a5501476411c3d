"""The security headers of the web layer, set in one place: :class:`SecurityHeaders`.

The outermost middleware adds what an answer did not set itself: to every HTML page
:data:`SECURITY_HEADERS` (the strict :data:`CSP`, no sniffing, same-origin referrer, no
caching); to every other answer :data:`FRAMING` (a framed "disable" button would carry the
cookie and a valid CSRF token: only forbidding framing stops it). An answer that shows a
secret adds :data:`SECRET_HEADERS` (no copy kept anywhere).
"""

from __future__ import annotations

from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
SECRET_HEADERS: Final = {"Cache-Control": "no-store", "Pragma": "no-cache"}
FRAMING: Final = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
}


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


_PAGE: Final = _raw(SECURITY_HEADERS)
_OTHER: Final = _raw(FRAMING)


def adding_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """``send`` adding ``extra`` to the answer's headers; a header the answer has already
    is kept as it is (except ``set-cookie``, which may repeat)."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers: list[Any] = list(message.get("headers", []))
            present = {bytes(k).lower() for k, _ in headers}
            headers += [(k, v) for k, v in extra if k == b"set-cookie" or k not in present]
            message = {**message, "headers": headers}
        await send(message)

    return wrapped


def _by_kind(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers", [])
            kind = next((bytes(v) for k, v in headers if bytes(k).lower() == b"content-type"), b"")
            extra = _PAGE if kind.startswith(b"text/html") else _OTHER
            await adding_headers(send, extra)(message)
            return
        await send(message)

    return wrapped


class SecurityHeaders:
    """ASGI middleware: the headers above on every HTTP answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _by_kind(send))
