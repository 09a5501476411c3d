"""Errors raised by :class:`sessionhook.api.SessionsClient`.

Hierarchy::

    ApiError                     base: every failure of a call to the service
    +-- TransportError           no HTTP answer (connect error, timeout, broken response)
    |   +-- DeadlineExceededError  no complete answer within the whole exchange's deadline
    +-- MalformedResponseError   an answer whose body is not the JSON the spec promises
    |   +-- ResponseTooDeepError   JSON nested deeper than the client's bound
    |   +-- ResponseTooLargeError  a body longer than ``max_response_bytes``
    +-- PageLimitError           a list walk still offered a page after ``max_pages``
    +-- PageLoopError            a list walk met pages that brought nothing new
    +-- ApiStatusError           an HTTP error status; carries the parsed error body
        +-- InvalidArgumentError   400 INVALID_ARGUMENT
        +-- UnauthenticatedError   401
        +-- PermissionDeniedError  403
        +-- NotFoundError          404
        +-- RateLimitedError       429 (``retry_after`` seconds when the server said)
        +-- ServerError            5xx

Every error has a short ``kind`` for logs and metric labels, and carries the ``request`` it
answers: a copy whose key header is redacted, shown in messages by method and URL only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
from pydantic import ValidationError

from ._bounds import nesting_depth_exceeds
from .models import ErrorBody, ErrorDetail


class ApiError(Exception):
    """Base of every error of the Sessions API client."""

    #: One line telling a user what to check; subclasses refine it.
    hint: str = "check the service address and your network"
    #: What kind of failure this is, as a short label (logs, metrics).
    kind: str = "error"

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
    kind = "transport"


class DeadlineExceededError(TransportError):
    """The whole exchange (connect, send, every byte of the answer) outlasted ``deadline``
    seconds: a server that drips one byte every few seconds, which per-read timeouts miss."""

    hint = "the service answers too slowly; check it and the network, or raise the timeout"
    kind = "deadline"

    def __init__(
        self, message: str, *, request: httpx.Request | None = None, deadline: float
    ) -> None:
        super().__init__(message, request=request)
        self.deadline = deadline


class MalformedResponseError(ApiError):
    """The service answered 2xx with a body that is not the JSON the spec describes."""

    hint = "the service answered something that is not the Sessions API; check --base-url"
    kind = "malformed"

    def __init__(
        self, message: str, *, request: httpx.Request | None = None, body: str = ""
    ) -> None:
        super().__init__(message, request=request)
        self.body = body


class ResponseTooDeepError(MalformedResponseError):
    """The answer nests arrays and objects deeper than ``max_depth``; it was not parsed."""

    kind = "too_deep"

    def __init__(
        self, message: str, *, request: httpx.Request | None = None, max_depth: int
    ) -> None:
        super().__init__(message, request=request)
        self.max_depth = max_depth


class ResponseTooLargeError(MalformedResponseError):
    """The answer is longer than ``limit`` bytes; reading it stopped there (it was not kept).

    ``page_size`` is the page size the request asked for (``None``: not a list, or the
    server's default). ``scanned`` holds the string fields a one-item page was scanned for
    while the rest of it streamed past (``{"activities.0.name": ..., "nextPageToken":
    ...}``), so that a caller can record what it refuses and go on after it; empty when no
    scan was asked or nothing was found. ``size`` is how many bytes were seen (at least
    ``limit + 1``; the full length when the answer was scanned to its end).
    """

    hint = "the service answered more than the relay reads at once (api.max_response_bytes)"
    kind = "too_large"

    def __init__(
        self,
        message: str,
        *,
        request: httpx.Request | None = None,
        limit: int,
        size: int,
        page_size: int | None = None,
        scanned: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, request=request)
        self.limit = limit
        self.size = size
        self.page_size = page_size
        self.scanned: dict[str, str] = dict(scanned or {})


class PageLimitError(ApiError):
    """A walk over a list reached ``max_pages`` pages and the service offered yet another;
    what the walk yielded before the bound stays valid."""

    hint = "the service keeps offering more pages; raise poll.max_pages if that is genuine"
    kind = "page_limit"

    def __init__(
        self, message: str, *, request: httpx.Request | None = None, max_pages: int
    ) -> None:
        super().__init__(message, request=request)
        self.max_pages = max_pages


class PageLoopError(ApiError):
    """A walk over a list met ``repeats`` pages in a row that brought nothing new, each with a
    fresh ``nextPageToken``, after reading ``pages`` pages; what it yielded stays valid."""

    hint = "the service serves the same page again under a fresh page token; try again later"
    kind = "page_loop"

    def __init__(
        self, message: str, *, request: httpx.Request | None = None, pages: int, repeats: int
    ) -> None:
        super().__init__(message, request=request)
        self.pages = pages
        self.repeats = repeats


class ApiStatusError(ApiError):
    """The service answered an error status; ``error`` is its parsed error body."""

    status_code: int = 0
    hint = "check the request and --base-url"
    kind = "status"

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


# An error body is {"error": {"details": [{...}]}}: a handful of levels. Deeper is not one.
_ERROR_BODY_MAX_DEPTH = 32

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
    when = http_date(value)
    if when is None:
        return None
    current = now() if now is not None else datetime.now(UTC)
    return max(0.0, (when - current).total_seconds())


def http_date(value: str | None) -> datetime | None:
    """An HTTP date (``Date``, ``Retry-After``) as aware UTC, or ``None`` when unreadable."""
    if not value:
        return None
    try:
        moment = parsedate_to_datetime(value)
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (TypeError, ValueError, IndexError, OverflowError):  # Overflow: past year 9999 in UTC
        return None


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
        if nesting_depth_exceeds(response.content, _ERROR_BODY_MAX_DEPTH):
            raise ValueError("an error body nested too deeply to parse")
        detail = ErrorBody.model_validate(response.json()).error
    except (ValueError, ValidationError):
        # ValueError covers undecodable bytes, invalid JSON and absurd nesting;
        # ValidationError a JSON value that is not {"error": {...}}.
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
