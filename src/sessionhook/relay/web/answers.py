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

from .. import ops as operator
from ..domain.api_models import ApiError, ApiErrorDetail, ApiModel
from ..domain.api_paths import OPERATIONS
from ..ops.endpoint_edits import EndpointConflictError
from ..store import StoreError

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


def refusal_status(exc: Exception) -> int:
    """The HTTP status of an operator's refusal: 409 an endpoint of the config file or a
    name taken, 404 no such endpoint, 503 a failing store, 400 anything else."""
    if isinstance(exc, EndpointConflictError):
        return 409
    if isinstance(exc, operator.UnknownEndpointError):
        return 404
    return 503 if isinstance(exc, StoreError) else 400


def api_route(
    operation_id: str, endpoint: Callable[[Request], Coroutine[Any, Any, Response]]
) -> Route:
    """The route of the operation ``operation_id``: ``endpoint`` at its method and path."""
    operation = OPERATIONS[operation_id]
    return Route(operation.path, endpoint, methods=[operation.method])
