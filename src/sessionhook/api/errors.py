"""Errors raised by :class:`sessionhook.api.SessionsClient`.

Hierarchy::

    ApiError                     base: every failure of a call to the service
    +-- TransportError           no HTTP answer (connect error, timeout, broken response)
    +-- MalformedResponseError   an answer whose body is not the JSON the spec promises
    +-- ApiStatusError           an HTTP error status; carries the parsed error body
        +-- InvalidArgumentError   400 INVALID_ARGUMENT
        +-- UnauthenticatedError   401
        +-- PermissionDeniedError  403
        +-- NotFoundError          404
        +-- RateLimitedError       429 (``retry_after`` seconds when the server said)
        +-- ServerError            5xx

Every error carries the ``request`` it answers. Messages show only its method and URL, never
headers, so the API key cannot leak through an error message; the client also attaches a copy
of the request whose key header is redacted, so not even ``error.request.headers`` holds it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
from pydantic import ValidationError

from .models import ErrorBody, ErrorDetail

__all__ = [
    "ApiError",
    "ApiStatusError",
    "InvalidArgumentError",
    "MalformedResponseError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitedError",
    "ServerError",
    "TransportError",
    "UnauthenticatedError",
    "error_for_response",
    "parse_retry_after",
]


class ApiError(Exception):
    """Base of every error of the Sessions API client."""

    #: One line telling a user what to check; subclasses refine it.
    hint: str = "check the service address and your network"

    def __init__(self, message: str, *, request: httpx.Request | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.request = request
        #: How many attempts the client made before giving up (set by the client).
        self.attempts = 1

    @property
    def where(self) -> str:
        """``METHOD URL`` of the failed request, or an empty string."""
        if self.request is None:
            return ""
        return f"{self.request.method} {self.request.url}"

    def __str__(self) -> str:
        return f"{self.message} ({self.where})" if self.request is not None else self.message


class TransportError(ApiError):
    """The service gave no HTTP answer: connection refused, timeout, broken stream."""

    hint = "is the service running and reachable at --base-url?"


class MalformedResponseError(ApiError):
    """The service answered 2xx with a body that is not the JSON the spec describes."""

    hint = "the service answered something that is not the Sessions API; check --base-url"

    def __init__(
        self, message: str, *, request: httpx.Request | None = None, body: str = ""
    ) -> None:
        super().__init__(message, request=request)
        self.body = body


class ApiStatusError(ApiError):
    """The service answered an error status; ``error`` is its parsed error body."""

    status_code: int = 0
    hint = "check the request and --base-url"

    def __init__(
        self,
        message: str,
        *,
        request: httpx.Request | None = None,
        status_code: int,
        error: ErrorDetail,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, request=request)
        self.status_code = status_code
        self.error = error
        self.retry_after = retry_after


class InvalidArgumentError(ApiStatusError):
    """400: the request's parameters are invalid."""

    hint = "check the arguments (page size 1-100, names like sessions/<id>)"


class UnauthenticatedError(ApiStatusError):
    """401: the API key is missing, malformed, revoked or wrong."""

    hint = "check the API key (SESSIONHOOK_API_KEY) and that it was not revoked"


class PermissionDeniedError(ApiStatusError):
    """403: the account may not use the service or this resource."""

    hint = "the key's account has no access to this resource"


class NotFoundError(ApiStatusError):
    """404: no such resource (a session created a moment ago may 404 briefly)."""

    hint = "check the name or id; it may belong to another account"


class RateLimitedError(ApiStatusError):
    """429: quota exceeded; ``retry_after`` holds the server's advice in seconds, if any."""

    hint = "the service's quota is exhausted; slow down or wait"


class ServerError(ApiStatusError):
    """5xx: the service failed."""

    hint = "the service failed; try again later"


_BY_STATUS: dict[int, type[ApiStatusError]] = {
    400: InvalidArgumentError,
    401: UnauthenticatedError,
    403: PermissionDeniedError,
    404: NotFoundError,
    429: RateLimitedError,
}


def parse_retry_after(
    value: str | None, *, now: Callable[[], datetime] | None = None
) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date), or ``None``.

    ``now`` (aware UTC) is the clock an HTTP date is measured against; tests pass a fixed one.
    A date in the past, or a negative number, gives ``0.0``; garbage gives ``None``.
    """
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        # float() accepts "nan" and "inf"; neither is advice a client can follow.
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = now() if now is not None else datetime.now(UTC)
    return max(0.0, (when - current).total_seconds())


def error_for_response(
    response: httpx.Response, *, request: httpx.Request | None = None
) -> ApiStatusError:
    """Build the matching :class:`ApiStatusError` subclass for an error response.

    A body that is not the documented error JSON still gives a useful error: the status
    line and the first bytes of the body become the message. ``request`` replaces the
    response's own request on the error (the client passes a copy with the key redacted).
    """
    status = response.status_code
    try:
        detail = ErrorBody.model_validate(response.json()).error
    except (ValueError, ValidationError):
        # ValueError covers undecodable bytes and invalid JSON; ValidationError a JSON
        # value that is not {"error": {...}}.
        snippet = " ".join(response.text[:200].split()) if response.content else ""
        detail = ErrorDetail(
            code=status, message=snippet or response.reason_phrase or f"HTTP {status}"
        )
    if not detail.code:
        detail.code = status
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiStatusError)
    label = f"{status} {detail.status}".strip() if detail.status else str(status)
    return cls(
        f"{label}: {detail.message or response.reason_phrase}",
        request=request if request is not None else response.request,
        status_code=status,
        error=detail,
        retry_after=parse_retry_after(response.headers.get("retry-after")),
    )
