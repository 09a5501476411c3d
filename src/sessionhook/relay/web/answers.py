"""The web layer's JSON answers: a model of :mod:`..domain.api_models` as the body, errors in
the Sessions API's shape, ``{"error": {"code": 404, "message": "...", "status":
"NOT_FOUND"}}``, for every JSON error it answers (the management API, the event stream, a
refused credential, a store that cannot be read); and the route of an operation of the
management API, its method and path taken from :data:`~..domain.api_paths.OPERATIONS`."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..domain.api_models import ApiError, ApiErrorDetail, ApiModel
from ..domain.api_paths import OPERATIONS

__all__ = ["api_answer", "api_route", "error_response"]

#: The canonical status names of the Sessions API's error bodies, by HTTP status.
_STATUS_NAMES: Final[Mapping[int, str]] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "FAILED_PRECONDITION",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
}


def api_answer(
    model: ApiModel, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """``model`` as the JSON body of an answer."""
    return Response(model.model_dump_json(), status, headers, media_type="application/json")


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """The error answer of HTTP ``status`` with its one-line ``message``."""
    name = _STATUS_NAMES.get(status, "UNKNOWN")
    return api_answer(
        ApiError(error=ApiErrorDetail(code=status, message=message, status=name)), status, headers
    )


def api_route(
    operation_id: str, endpoint: Callable[[Request], Coroutine[Any, Any, Response]]
) -> Route:
    """The route of the operation ``operation_id``: ``endpoint`` at its method and path."""
    operation = OPERATIONS[operation_id]
    return Route(operation.path, endpoint, methods=[operation.method])
