"""One call of the API on the wire, retried, bounded and redacted: :class:`Exchange`.

Which failures are retried (with :class:`~sessionhook.api.retry.RetryPolicy`, honouring
``Retry-After``):

=======================================  ===================================================
call                                     retried after
=======================================  ===================================================
GET (every read)                         429, 5xx, any transport error (timeouts included)
DELETE                                   same as GET: deleting twice deletes once. A 404
                                         answering a retry that followed an ambiguous failure
                                         (5xx, or a transport error after the request may
                                         have left) counts as success: the earlier attempt
                                         most likely deleted the session.
POST (create, sendMessage, approvePlan)  only a connect error, connect timeout or pool
                                         timeout: no connection carried the request, so it
                                         provably never reached the server. Never after a
                                         status (not even 429) or a read error: a second
                                         create could make a second session.
=======================================  ===================================================

A ``Retry-After`` longer than :attr:`RetryPolicy.max_retry_after` is raised at once, with
``retry_after`` set, for the caller to schedule.

Nothing the service sends can exhaust memory or hang a call: ``timeout`` bounds each
attempt's WHOLE exchange (httpx's per-read timeouts let a server that drips a byte every few
seconds hold a call forever), and at most ``max_response_bytes`` of an answer are kept (64
KiB of an error). The API key travels only in its header, only to the API root (redirects
are never followed), and never in a log line or an error (:meth:`Exchange.redact`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import httpx

from .. import __version__
from ._bounds import JsonFieldScanner, JsonPath
from .errors import (
    ApiError,
    DeadlineExceededError,
    MalformedResponseError,
    ResponseTooLargeError,
    TransportError,
    error_for_response,
)
from .retry import RetryPolicy

#: ``await on_answer(response, malformed)``: told about every 2xx answer once its body was
#: checked (the relay counts upstream answers with it).
OnAnswer = Callable[[httpx.Response, bool], Awaitable[None]]

_REDACTED: Final = "[redacted]"
# Error bodies are only shown (a message, a snippet); more than this is never needed.
_ERROR_BODY_BYTES: Final = 64 * 1024
# A one-item answer over the bound is scanned (not kept) for at most this many times the
# bound: far beyond any artifact, and the deadline bounds the time it takes.
_SCAN_FACTOR: Final = 64
# After these the request provably never reached the server: no connection was established
# (or none was free in the pool), so not one byte of it was written.
_NEVER_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)

_log = logging.getLogger(__name__)


@dataclass(kw_only=True, repr=False, eq=False)
class Exchange:
    """Sends requests to the API root ``root`` over ``http`` and returns bounded answers;
    the other fields are :class:`~sessionhook.api.client.SessionsClient`'s parameters."""

    http: httpx.AsyncClient
    root: str
    api_key: str
    key_header: str
    timeout: float
    retry: RetryPolicy
    max_response_bytes: int
    max_depth: int
    gate: Callable[[], Awaitable[None]] | None
    sleep: Callable[[float], Awaitable[None]]
    rng: random.Random
    on_answer: OnAnswer | None
    _headers: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self._headers = {
            self.key_header: self.api_key,
            "accept": "application/json",
            "user-agent": f"sessionhook/{__version__}",
        }

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | None] | None = None,
        body: Mapping[str, Any] | None = None,
        idempotent: bool,
        missing_ok_after_retry: bool = False,
        page_size: int | None = None,
        scan: Sequence[JsonPath] = (),
    ) -> httpx.Response:
        """Send with retries (see the module docstring); a 2xx answer, its body read within
        the bounds. ``page_size`` is only told in a :class:`ResponseTooLargeError`; ``scan``
        names the fields to look for in an answer too large to keep."""
        url = self.root + path
        query = {key: value for key, value in (params or {}).items() if value is not None}
        policy = self.retry
        # True once an attempt failed in a way that may have changed state on the server.
        ambiguous = False
        attempt = 0
        while True:
            attempt += 1
            request = self.http.build_request(
                method,
                url,
                params=query,
                json=body,
                headers=self._headers,
                timeout=httpx.Timeout(self.timeout),
            )
            retry_after: float | None = None
            error: ApiError
            if self.gate is not None:
                await self.gate()
            try:
                response = await self._attempt(request, page_size, scan)
            except httpx.RequestError as exc:
                never_sent = isinstance(exc, _NEVER_SENT)
                ambiguous = ambiguous or not never_sent
                retryable = idempotent or never_sent
                error = TransportError(_describe(exc, self.timeout), request=self.redact(request))
                cause: BaseException | None = exc
                reason = type(exc).__name__
            except DeadlineExceededError as exc:
                ambiguous = True
                retryable = idempotent
                error, cause, reason = exc, None, "deadline"
            except MalformedResponseError as exc:
                exc.attempts = attempt  # a body over the bounds: asking again gives the same
                raise
            else:
                status = response.status_code
                if response.is_success:
                    return response
                if status == 404 and ambiguous and missing_ok_after_retry:
                    return response
                status_error = error_for_response(response, request=self.redact(request))
                error, cause, reason = status_error, None, str(status)
                retryable = idempotent and (status == 429 or status >= 500)
                retry_after = status_error.retry_after
                ambiguous = ambiguous or status >= 500
            if not retryable or attempt >= policy.max_attempts or policy.gives_up_on(retry_after):
                error.attempts = attempt
                raise error from cause
            wait = policy.delay(attempt, retry_after, self.rng)
            _log.info(
                "api.retry method=%s url=%s attempt=%d reason=%s wait=%.2f",
                method,
                request.url,
                attempt,
                reason,
                wait,
            )
            await self.sleep(wait)

    async def answered(self, response: httpx.Response, malformed: bool) -> None:
        """Tell ``on_answer`` about ``response`` when it is a 2xx answer."""
        if self.on_answer is not None and response.is_success:
            await self.on_answer(response, malformed)

    def redact(self, request: httpx.Request) -> httpx.Request:
        """A copy of ``request`` with the key header's value replaced (for errors)."""
        headers = [
            (key, _REDACTED if key.lower() == self.key_header else value)
            for key, value in request.headers.multi_items()
        ]
        return httpx.Request(request.method, request.url, headers=headers, content=request.content)

    async def _attempt(
        self, request: httpx.Request, page_size: int | None, scan: Sequence[JsonPath]
    ) -> httpx.Response:
        """One attempt: send and read the answer, all within the deadline; the returned
        response holds its (bounded) body."""
        deadline = self.timeout
        try:
            with anyio.fail_after(deadline):
                # Never follow a redirect, whatever the injected client says: httpx drops
                # only Authorization across origins, so the key header would travel along.
                response = await self.http.send(request, stream=True, follow_redirects=False)
                try:
                    content = await self._read_bounded(response, request, page_size, scan)
                except MalformedResponseError:
                    await self.answered(response, True)  # counted as what it is
                    raise
                finally:
                    with anyio.CancelScope(shield=True):
                        await response.aclose()
        except TimeoutError:
            raise DeadlineExceededError(
                f"no complete answer within {deadline:g} s (the deadline of the whole exchange)",
                request=self.redact(request),
                deadline=deadline,
            ) from None
        # The body is decoded already: the encoding header must not make httpx decode again.
        headers = [
            (key, value)
            for key, value in response.headers.multi_items()
            if key.lower() != "content-encoding"
        ]
        return httpx.Response(
            response.status_code, headers=headers, content=content, request=request
        )

    async def _read_bounded(
        self,
        response: httpx.Response,
        request: httpx.Request,
        page_size: int | None,
        scan: Sequence[JsonPath],
    ) -> bytes:
        """The body, decoded, at most ``max_response_bytes`` of it (64 KiB of an error); with
        ``scan``, the rest of a success too large streams through a scanner, never kept."""
        limit = (
            self.max_response_bytes
            if response.is_success
            else min(self.max_response_bytes, _ERROR_BODY_BYTES)
        )
        declared = _content_length(response)
        if response.is_success and not scan and declared is not None and declared > limit:
            raise self._too_large(request, limit, declared, page_size, {})
        received = bytearray()
        chunks = response.aiter_bytes()
        async for chunk in chunks:
            if len(received) + len(chunk) <= limit:
                received += chunk
                continue
            if not response.is_success:  # only shown: the start is enough
                received += chunk[: limit - len(received)]
                break
            size = len(received) + len(chunk)
            found: dict[str, str] = {}
            if scan:
                scanner = JsonFieldScanner(scan, max_depth=self.max_depth)
                scanner.feed(bytes(received))
                del received[:]  # nothing of the answer is kept past this point
                scanner.feed(chunk)
                async for rest in chunks:
                    scanner.feed(rest)
                    if scanner.size > limit * _SCAN_FACTOR:
                        break
                size = scanner.size
                found = {".".join(map(str, path)): text for path, text in scanner.found.items()}
            raise self._too_large(request, limit, size, page_size, found)
        return bytes(received)

    def _too_large(
        self,
        request: httpx.Request,
        limit: int,
        size: int,
        page_size: int | None,
        scanned: dict[str, str],
    ) -> ResponseTooLargeError:
        return ResponseTooLargeError(
            f"answer of {size} bytes or more exceeds the bound of {limit} bytes"
            + (f" (pageSize={page_size})" if page_size is not None else ""),
            request=self.redact(request),
            limit=limit,
            size=size,
            page_size=page_size,
            scanned=scanned,
        )


def _describe(exc: httpx.RequestError, timeout: float) -> str:
    text = str(exc).strip()
    kind = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return f"{kind}: no answer within {timeout:g} s" + (f" ({text})" if text else "")
    return f"{kind}: {text}" if text else kind


def _content_length(response: httpx.Response) -> int | None:
    try:
        return int(response.headers.get("content-length", ""))
    except ValueError:
        return None
