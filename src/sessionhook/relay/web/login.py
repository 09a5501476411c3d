"""``/login`` and ``/logout``: trade the bearer token for a session cookie, and back.

``POST /login`` (``token``, optional ``next``) checks the token in constant time: right, it
sets the cookie (:mod:`.auth`) and redirects to ``next`` (a local path only); wrong, a 401
with the form again and ``web.auth_failed``. ``POST /logout`` deletes the cookie. Without a
token (``allow_unauthenticated``) ``/login`` just redirects.
"""

from __future__ import annotations

from html import escape
from typing import Final

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from ..telemetry.logs import get_logger
from .auth import FormError, WebAuth, client_address, read_form, safe_next, set_session_cookie

_log = get_logger()

#: The form's stylesheet, served at /login.css without a login (the console's assets need
#: one; an inline style is what the Content-Security-Policy forbids). The card is the
#: sign-in form, or the ``main.card`` of an action page (its heading, the plan or the
#: question, and its form, all inside).
_STYLE: Final = b"""body{font:16px system-ui,sans-serif;background:#f4f5f7;color:#1d2330;
display:flex;min-height:100vh;align-items:center;justify-content:center;margin:0}
form,main.card{background:#fff;padding:2rem;border-radius:8px;box-shadow:0 1px 4px #0002;
width:22rem}
main.card{width:36rem;max-width:calc(100vw - 2rem);box-sizing:border-box;margin:1rem 0;
overflow-wrap:anywhere}
main.card form{padding:0;border-radius:0;box-shadow:none;width:auto;background:none}
h1{font-size:1.2rem;margin:0 0 1rem} label{display:block;margin-bottom:.4rem}
input[type=password],textarea{width:100%;box-sizing:border-box;padding:.5rem;font:inherit}
button{margin-top:1rem;padding:.5rem 1rem;font:inherit} .error{color:#b00020}
"""

_PAGE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sessionhook: sign in</title>
<link rel="stylesheet" href="/login.css">
</head><body>
<form method="post" action="/login">
<h1>sessionhook</h1>
{error}
<label for="token">Access token</label>
<input type="password" id="token" name="token" autocomplete="current-password" autofocus>
<input type="hidden" name="next" value="{next}">
<button type="submit">Sign in</button>
</form></body></html>
"""


def login_page(next_path: str, error: str | None = None, status_code: int = 200) -> HTMLResponse:
    """The sign-in form (``error`` shown above the field)."""
    note = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    body = _PAGE.format(error=note, next=escape(safe_next(next_path)))
    # The console's security headers come with every HTML page (headers.SecurityHeaders).
    return HTMLResponse(body, status_code=status_code)


def login_routes(auth: WebAuth) -> list[BaseRoute]:
    """``/login`` and ``/login.css`` (public) and ``/logout`` (POST; protected)."""

    async def login_form(request: Request) -> Response:
        next_path = request.query_params.get("next", "/")
        if not auth.required:
            return RedirectResponse(safe_next(next_path), status_code=303)
        return login_page(next_path)

    async def login_submit(request: Request) -> Response:
        try:
            form = await read_form(request)
        except FormError as exc:
            return login_page("/", f"Cannot read the form: {exc}.", 400)
        token = form.get("token")
        next_path = safe_next(form.get("next") or "/")
        if not auth.required:
            return RedirectResponse(next_path, status_code=303)
        if not isinstance(token, str) or not auth.check_token(token.strip()):
            _log.warning(
                "web.auth_failed", client=client_address(request.scope), path="/login", via="login"
            )
            auth.on_failure("login")
            return login_page(next_path, "Wrong token.", 401)
        _session, value = auth.new_session()
        response = RedirectResponse(next_path, status_code=303)
        set_session_cookie(response, request, value, int(auth.lifetime))
        _log.info("web.login", client=client_address(request.scope))
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse("/login", status_code=303)
        set_session_cookie(response, request, "", 0)
        return response

    async def stylesheet(_request: Request) -> Response:
        return Response(_STYLE, media_type="text/css")

    return [
        Route("/login.css", stylesheet, methods=["GET", "HEAD"]),
        Route("/login", login_form, methods=["GET", "HEAD"]),
        Route("/login", login_submit, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
    ]
