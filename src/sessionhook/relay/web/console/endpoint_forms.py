"""The console's endpoint editor: create an endpoint, edit or delete one created at run
time, rotate its secret (:mod:`sessionhook.relay.ops.endpoint_edits`).

``/console/endpoints/new`` and ``/console/endpoints/{name}`` (with ``.../edit``,
``.../rotate``, ``.../delete``); an endpoint of the config file is read-only. A refusal
comes back as the form again (400 or 409), what was typed kept. A new secret is shown once,
in the POST's own answer (no redirect, ``Cache-Control: no-store``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ....redact import redact_userinfo
from ... import ops as operator
from ...config import Config, parse_duration
from ...config.endpoint_spec import MAX_DESCRIPTION_CHARS, MAX_NAME_CHARS, MAX_URL_CHARS
from ...domain.rows import StoredEndpoint
from ...ops import endpoint_edits as edits
from ...store import AsyncStore, StoreError
from ...telemetry.logs import get_logger
from ..answers import refusal_status
from ..headers import SECRET_HEADERS
from .actions import checked_form, flash_redirect
from .common import ConsoleDeps, error_page, not_found, render_page, unavailable

T = TypeVar("T")
_log = get_logger()

#: The fields of the form, as typed.
FIELDS: Final = ("name", "url", "events", "format", "payload", "description")
FORMATS: Final = ("standard", "cloudevents", "slack", "discord", "google_chat", "teams")
PAYLOADS: Final = ("full", "thin")
#: Longest a field may be before the operator layer is asked (it says why more exactly).
_FIELD_MAX: Final = {
    "name": MAX_NAME_CHARS,
    "url": MAX_URL_CHARS,
    "events": 2000,
    "description": MAX_DESCRIPTION_CHARS,
    "overlap": 40,
}
#: Shown of a refusal: one line, at most this long (a refused value may be 10 KB).
_REASON_MAX: Final = 300
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class _Refused(Exception):
    """A form the operator layer (or the form itself) refused: one line, an HTTP status."""

    def __init__(self, reason: str, status: int = 400) -> None:
        first = (reason.splitlines() or [""])[0]
        super().__init__(first[:_REASON_MAX] + ("…" if len(first) > _REASON_MAX else ""))
        self.status = status


def _typed(form: dict[str, str]) -> dict[str, str]:
    """What was typed, to fill the form in again (control characters shown as U+FFFD: they
    are refused, and an HTML page cannot carry a NUL)."""
    return {k: _CONTROL.sub("\ufffd", form.get(k, "")) for k in (*FIELDS, "overlap")}


def _checked(form: dict[str, str]) -> None:
    """Each field within its length (the first one too long is named)."""
    for key, limit in _FIELD_MAX.items():
        if len(form.get(key, "")) > limit:
            raise _Refused(f"{key}: at most {limit} characters, not {len(form[key])}")


def _events(text: str) -> list[str] | None:
    """Event-type globs separated by commas or spaces; ``None`` when none (every type)."""
    globs = [g for g in re.split(r"[,\s]+", text) if g]
    return globs or None


def _spec(form: dict[str, str]) -> dict[str, Any]:
    """The keys of ``[[endpoints]]`` the form sets (a default left out)."""
    spec: dict[str, Any] = {"url": form.get("url", "").strip()}
    events = _events(form.get("events", ""))
    if events is not None:
        spec["events"] = events
    if form.get("format", "standard") != "standard":
        spec["format"] = form["format"]
    if form.get("payload", "full") != "full":
        spec["payload"] = form["payload"]
    return spec


def _changes(form: dict[str, str], current: StoredEndpoint) -> dict[str, Any]:
    """What the form changes of ``current`` (a key back to its default: ``None``). A key
    the form does not show (a template, a filter set through the API) is kept."""
    wanted = _spec(form)
    if wanted["url"] == redact_userinfo(str(current.spec.get("url", ""))):
        wanted["url"] = current.spec.get("url")  # shown redacted, left as it was
    changes: dict[str, Any] = {}
    for key in ("url", "events", "format", "payload"):
        if wanted.get(key) != current.spec.get(key):
            changes[key] = wanted.get(key)
    return changes


def _shown(current: StoredEndpoint) -> dict[str, str]:
    """The form of a stored endpoint, filled in."""
    spec = current.spec
    return {
        "name": current.name,
        # A URL's user-info is a credential of the consumer's: never shown (as the API).
        "url": redact_userinfo(str(spec.get("url", ""))),
        "events": ", ".join(spec.get("events") or ()),
        "format": str(spec.get("format", "standard")),
        "payload": str(spec.get("payload", "full")),
        "description": current.description,
        "overlap": "24h",
    }


@dataclass(frozen=True, slots=True)
class _Posted:
    """A POST's CSRF-checked form, the open store, the config, the endpoint in the path."""

    form: dict[str, str]
    store: AsyncStore
    config: Config
    name: str


class EndpointForms:
    """The endpoint editor's pages and POSTs (see the module docstring)."""

    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps

    def routes(self) -> list[Route]:
        """Its routes."""
        one = "/console/endpoints/{name}"
        return [
            Route("/console/endpoints/new", self.new_page, methods=["GET", "HEAD"]),
            Route("/console/endpoints/new", self._post(self.create), methods=["POST"]),
            Route(one, self.edit_page, methods=["GET", "HEAD"]),
            Route(one + "/edit", self._post(self.update), methods=["POST"]),
            Route(one + "/rotate", self._post(self.rotate), methods=["POST"]),
            Route(one + "/delete", self._post(self.delete), methods=["POST"]),
        ]

    # ------------------------------------------------------------------ pages

    def _page(
        self,
        request: Request,
        typed: dict[str, str],
        *,
        creating: bool,
        refused: _Refused | None = None,
        source: str = "api",
    ) -> Response:
        return render_page(
            request,
            "endpoint.html",
            {
                "title": "New endpoint" if creating else f"Endpoint {typed['name']}",
                "creating": creating,
                "source": source,
                "form": typed,
                "formats": FORMATS,
                "payloads": PAYLOADS,
                **({"flash": {"kind": "error", "text": str(refused)}} if refused else {}),
            },
            status_code=refused.status if refused else 200,
        )

    async def new_page(self, request: Request) -> Response:
        """The form of a new endpoint."""
        blank = {k: "" for k in (*FIELDS, "overlap")}
        return self._page(request, blank | {"format": "standard", "payload": "full"}, creating=True)

    async def edit_page(self, request: Request) -> Response:
        """The form of an endpoint created at run time; one of the config file, read-only."""
        store, config = self.deps.store(), self._config()
        if store is None or config is None:
            return unavailable(request)
        name = str(request.path_params["name"])
        try:
            current = await store.run(edits.stored_or_refused, config, name)
        except edits.EndpointConflictError:
            blank = {k: "" for k in (*FIELDS, "overlap")}
            return self._page(request, blank | {"name": name}, creating=False, source="config")
        except operator.UnknownEndpointError:
            return not_found(request, f"no endpoint {name!r}")
        return self._page(request, _shown(current), creating=False)

    # ------------------------------------------------------------------ POSTs

    async def create(self, request: Request, posted: _Posted) -> Response:
        """Create the endpoint; its secret shown once (see the module docstring)."""
        form, store, config = posted.form, posted.store, posted.config
        try:
            _checked(form)
            name = form.get("name", "").strip()
            definition, secret = await _off_loop(
                lambda: edits.define_endpoint(
                    config, name, _spec(form), description=form.get("description", "")
                )
            )
            await _in_store(store, edits.create_endpoint, config, definition, secret)
        except _Refused as exc:
            return self._page(request, _typed(form), creating=True, refused=exc)
        self.deps.wake()
        _log.info("console.endpoint_created", endpoint=name)
        return self._secret_page(request, name, secret, created=True, until=None)

    async def update(self, request: Request, posted: _Posted) -> Response:
        """Change the endpoint's definition (the fields that differ)."""
        form, store, config, name = posted.form, posted.store, posted.config, posted.name
        typed = _typed(form) | {"name": name}
        try:
            _checked(form)
            current = await _in_store(store, edits.stored_or_refused, config, name)
            changes = _changes(form, current)
            description = form.get("description", "")
            definition = await _off_loop(
                lambda: edits.redefine_endpoint(config, current, changes, description=description)
            )
            await _in_store(store, edits.update_endpoint, definition)
        except _Refused as exc:
            return self._page(request, typed, creating=False, refused=exc)
        self.deps.wake()
        _log.info("console.endpoint_updated", endpoint=name, keys=sorted(changes))
        return flash_redirect(f"/console/endpoints/{name}", "ok", f"endpoint {name} saved")

    async def rotate(self, request: Request, posted: _Posted) -> Response:
        """Give the endpoint a new secret, the old one signing beside it for the overlap."""
        form, store, config, name = posted.form, posted.store, posted.config, posted.name
        try:
            _checked(form)
            try:
                overlap = parse_duration(form.get("overlap", "").strip() or "24h")
            except ValueError as exc:
                raise _Refused(f"overlap: {exc}") from None
            done = await _in_store(
                store, edits.rotate_secret, config, name, now=self.deps.clock(), overlap=overlap
            )
        except _Refused as exc:
            return flash_redirect(f"/console/endpoints/{name}", "error", str(exc))
        self.deps.wake()
        _log.info("console.endpoint_rotated", endpoint=name, overlap=overlap)
        return self._secret_page(
            request, name, done.secret, created=False, until=done.previous_until
        )

    async def delete(self, request: Request, posted: _Posted) -> Response:
        """Delete the endpoint once its name was typed again."""
        form, store, config, name = posted.form, posted.store, posted.config, posted.name
        if form.get("confirm", "").strip() != name:
            return flash_redirect(
                f"/console/endpoints/{name}", "error", f"delete: type {name} to confirm"
            )
        try:
            closed = await _in_store(store, edits.delete_endpoint, config, name)
        except _Refused as exc:
            return flash_redirect(f"/console/endpoints/{name}", "error", f"delete: {exc}")
        self.deps.wake()
        _log.info("console.endpoint_deleted", endpoint=name, closed=closed)
        return flash_redirect(
            "/console", "ok", f"endpoint {name} deleted; {closed} open deliveries closed"
        )

    # ------------------------------------------------------------------ helpers

    def _config(self) -> Config | None:
        return None if self.deps.config is None else self.deps.config()

    def _post(
        self, handle: Callable[[Request, _Posted], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """``handle`` once the form's CSRF token is checked and the store is open."""

        async def post(request: Request) -> Response:
            form = await checked_form(request)
            if isinstance(form, Response):
                return form
            store, config = self.deps.store(), self._config()
            if store is None or config is None:
                return error_page(request, 503, "Store not open", "the store is not open yet")
            name = str(request.path_params.get("name", ""))
            return await handle(request, _Posted(form, store, config, name))

        return post

    def _secret_page(
        self, request: Request, name: str, secret: str, *, created: bool, until: float | None
    ) -> Response:
        """The one page that shows ``secret`` (never cached, never redirected to)."""
        response = render_page(
            request,
            "endpoint_secret.html",
            {
                "title": f"Endpoint {name} created" if created else f"New secret of {name}",
                "name": name,
                "secret": secret,
                "created": created,
                "until": until,
            },
            status_code=201 if created else 200,
        )
        response.headers.update(SECRET_HEADERS)
        return response


async def _off_loop(fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread (a definition renders its template against samples); an
    operator's refusal as :class:`_Refused`."""
    try:
        return await anyio.to_thread.run_sync(fn)
    except operator.OperatorError as exc:
        raise _refusal(exc) from None


async def _in_store(store: AsyncStore, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(store, *args)`` in the store's thread; a refusal as :class:`_Refused`."""
    try:
        return await store.run(fn, *args, **kwargs)
    except (operator.OperatorError, StoreError) as exc:
        raise _refusal(exc) from None


def _refusal(exc: Exception) -> _Refused:
    return _Refused(str(exc) or type(exc).__name__, refusal_status(exc))
