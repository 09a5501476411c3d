"""The web layer's error bodies: the Sessions API's shape, ``{"error": {"code": 404,
"message": "...", "status": "NOT_FOUND"}}``, for every JSON error it answers (the
management API, the event stream, a refused credential, a store that cannot be read)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["error_body"]

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


def error_body(status: int, message: str) -> dict[str, Any]:
    """``{"error": {"code", "message", "status"}}`` for HTTP ``status``."""
    name = _STATUS_NAMES.get(status, "UNKNOWN")
    return {"error": {"code": status, "message": message, "status": name}}
