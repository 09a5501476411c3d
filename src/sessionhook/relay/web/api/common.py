"""What every route of the management API shares: its errors, its JSON bodies, its pages.

Errors have the Sessions API's shape with a one-line message (:class:`ApiProblem`). Bodies
are JSON objects of at most :data:`MAX_BODY_BYTES`, validated by a model of
:mod:`...domain.api_models`. Pages take ``pageSize`` and an opaque ``pageToken``. Every
query parameter is read through :func:`query_text`, the one bounded reader.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from ...domain.api_models import ApiPage
from ...store import AsyncStore
from ..answers import error_response
from ..context import WebContext

MAX_BODY_BYTES: Final = 64 * 1024
DEFAULT_PAGE_SIZE: Final = 50
MAX_PAGE_SIZE: Final = 200
#: The longest filter value taken (a session name, an event id, a glob, a page size).
MAX_FILTER: Final = 300
#: The longest page token taken: one names the last item of a page (a session's name, in
#: base64), which the store does not bound as it bounds a filter.
MAX_PAGE_TOKEN: Final = 1024

M = TypeVar("M", bound=BaseModel)
P = TypeVar("P", bound=ApiPage)


class ApiProblem(Exception):
    """A request the API refuses: answered as an error body with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def bad_request(message: str) -> ApiProblem:
    """400 with a one-line reason."""
    return ApiProblem(400, message)


def not_found(message: str) -> ApiProblem:
    """404: no such thing."""
    return ApiProblem(404, message)


def unavailable(message: str) -> ApiProblem:
    """503: the relay cannot do it now (its store is not open yet)."""
    return ApiProblem(503, message)


async def api_problem_response(request: Request, exc: Exception) -> Response:
    """The app's handler for :class:`ApiProblem`."""
    assert isinstance(exc, ApiProblem)
    headers = {"retry-after": "5"} if exc.status == 503 else None
    return error_response(exc.status, exc.message, headers)


def require_store(ctx: WebContext) -> AsyncStore:
    """The open store, or a 503 saying the relay is starting."""
    store = ctx.store()
    if store is None:
        raise unavailable("the relay's store is not open yet: try again in a moment")
    return store


async def read_json(request: Request, model: type[M]) -> M:
    """The request's body as ``model``: a JSON object of at most :data:`MAX_BODY_BYTES`.
    Anything else is a 400 (413 when too large) with a one-line reason."""
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if kind and kind != "application/json":
        raise ApiProblem(415, f"send a JSON body (content-type application/json, not {kind})")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ApiProblem(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
    try:
        value = json.loads(bytes(body) or b"{}")
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"the body is not JSON: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(value, dict):
        raise bad_request("the body must be a JSON object")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise bad_request(f"{where}: {first['msg']}") from None


@dataclass(frozen=True, slots=True)
class PageRequest:
    """``pageSize`` and the decoded ``pageToken`` (``None``: the first page)."""

    size: int
    after: str | None


def query_text(request: Request, name: str, limit: int = MAX_FILTER) -> str | None:
    """The query parameter ``name`` (``None`` when absent or empty), at most ``limit``
    characters: the one reader of every query parameter of the API."""
    value = request.query_params.get(name) or None
    if value is not None and len(value) > limit:
        raise bad_request(f"{name} is longer than {limit} characters")
    return value


def page_request(request: Request, *, default: int = DEFAULT_PAGE_SIZE) -> PageRequest:
    """The page a list request asks for; a bad ``pageSize`` or ``pageToken`` is a 400."""
    raw_size = query_text(request, "pageSize") or ""
    try:
        size = int(raw_size) if raw_size else default
    except ValueError:
        raise bad_request(f"pageSize must be a whole number, not {raw_size[:40]!r}") from None
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise bad_request(f"pageSize must be between 1 and {MAX_PAGE_SIZE}")
    token = query_text(request, "pageToken", MAX_PAGE_TOKEN)
    if token is None:
        return PageRequest(size, None)
    try:
        after = base64.urlsafe_b64decode(token.encode("ascii") + b"==").decode("utf-8")
    except (ValueError, binascii.Error, UnicodeError):
        raise bad_request("pageToken is not one this API gave") from None
    if not after.startswith("p:"):
        raise bad_request("pageToken is not one this API gave")
    return PageRequest(size, after[2:])


def page_answer(page: type[P], items: Sequence[Any], after: str | None) -> P:
    """A ``page`` of ``items`` (its first field), with ``nextPageToken`` when ``after`` is given."""
    answer: dict[str, Any] = {next(iter(page.model_fields)): list(items)}
    if after is not None:
        token = base64.urlsafe_b64encode(f"p:{after}".encode()).decode("ascii").rstrip("=")
        answer["nextPageToken"] = token
    return page.model_validate(answer)
