"""The upstream request budget: one limiter for every request the relay makes to the API.

A request waits for both a **token bucket** (``burst``, refilled at ``requests_per_minute /
60`` per second) and a **sliding window** of the last 60 s, so "never more than
``requests_per_minute`` in any minute" is an invariant. :class:`RateLimiter` is pure
(:meth:`RateLimiter.reserve` takes ``now``); :class:`LimitedTransport` wraps the upstream
client's transport, takes a grant per request and reports each answer by endpoint and
status. With ``settle_success=True`` a 2xx is counted only once the client parsed its body
(:meth:`LimitedTransport.settle`); an unread one is :data:`MALFORMED` or no answer.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

import anyio
import httpx

WINDOW_SECONDS = 60.0

#: The status recorded for a 2xx answer whose body was not what the API promises.
MALFORMED: Final = "malformed"
#: What an upstream request came to: its HTTP status, :data:`MALFORMED`, or ``None`` (no
#: answer: timeout, connection refused...).
UpstreamStatus = int | str | None
#: Called after each upstream request with (endpoint label, :data:`UpstreamStatus`).
UpstreamRecorder = Callable[[str, UpstreamStatus], Awaitable[None]]

# Marks a 2xx request whose outcome waits for settle(): the label to record it under.
_UNSETTLED: Final = "sessionhook.unsettled"
#: Takes one grant from a window kept outside the process (the store): 0.0 when granted,
#: else the seconds to wait (nothing taken).
SharedWindow = Callable[[], Awaitable[float]]


class RateLimiter:
    """At most ``requests_per_minute`` grants in any 60 s, spread by a small token bucket.

    Waiters are served first come, first served (one holds the lock while it sleeps).
    ``shared_window``, when given, is asked after the in-process rules allow a request: the
    window kept in the store, so the grants of a process restarted just before still count.
    """

    def __init__(
        self,
        requests_per_minute: int,
        *,
        burst: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        shared_window: SharedWindow | None = None,
    ) -> None:
        if requests_per_minute < 1:
            raise ValueError("requests_per_minute must be at least 1")
        self.requests_per_minute = requests_per_minute
        # A small burst: a few requests (one discovery page and a poll or two) may go at
        # once; never more than a tenth of the minute's budget.
        self.burst = burst if burst is not None else max(1, min(5, requests_per_minute // 10))
        self._rate = requests_per_minute / WINDOW_SECONDS
        self._tokens = float(self.burst)
        self._updated: float | None = None
        self._grants: deque[float] = deque()
        self._clock = clock
        self._sleep = sleep
        self._shared = shared_window
        self._lock = anyio.Lock()

    def reserve(self, now: float) -> float:
        """Take a grant at ``now`` and return 0.0 if both rules allow it; else take nothing
        and return the wait."""
        if self._updated is not None:
            elapsed = max(0.0, now - self._updated)
            self._tokens = min(float(self.burst), self._tokens + elapsed * self._rate)
        self._updated = now
        while self._grants and self._grants[0] <= now - WINDOW_SECONDS:
            self._grants.popleft()
        wait = 0.0
        if self._tokens < 1.0:
            wait = (1.0 - self._tokens) / self._rate
        if len(self._grants) >= self.requests_per_minute:
            wait = max(wait, self._grants[0] + WINDOW_SECONDS - now)
        if wait > 0.0:
            return wait
        self._tokens -= 1.0
        self._grants.append(now)
        return 0.0

    def release(self) -> None:
        """Give back the last grant (the shared window refused it)."""
        if self._grants:
            self._grants.pop()
            self._tokens = min(float(self.burst), self._tokens + 1.0)

    async def acquire(self) -> None:
        """Wait until a request may be sent, then take the grant."""
        async with self._lock:
            while True:
                wait = self.reserve(self._clock())
                if wait <= 0.0 and self._shared is not None:
                    wait = await self._shared()
                    if wait > 0.0:
                        self.release()
                if wait <= 0.0:
                    return
                await self._sleep(wait)


_LABELS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"/sessions/[^/]+/activities/[^/]+$"), "get_activity"),
    (re.compile(r"/sessions/[^/]+/activities$"), "list_activities"),
    (re.compile(r"/sessions/[^/:]+:sendMessage$"), "send_message"),
    (re.compile(r"/sessions/[^/:]+:approvePlan$"), "approve_plan"),
    (re.compile(r"/sessions/[^/]+$"), "get_session"),
    (re.compile(r"/sessions$"), "list_sessions"),
    (re.compile(r"/sources/.+$"), "get_source"),
    (re.compile(r"/sources$"), "list_sources"),
)


def endpoint_label(method: str, path: str) -> str:
    """A low-cardinality name for an API request (``list_activities``...), for counters."""
    for pattern, label in _LABELS:
        if pattern.search(path):
            if label == "get_session" and method == "DELETE":
                return "delete_session"
            if label == "list_sessions" and method == "POST":
                return "create_session"
            return label
    return "other"


class LimitedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that takes a :class:`RateLimiter` grant before every request
    (retries included) and gives ``record`` each ``(label, status or None)``; with
    ``settle_success`` a 2xx is recorded by :meth:`settle`. ``limiter=None``: the caller
    takes the grant itself, outside the exchange's deadline (the relay's API client does).
    """

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        limiter: RateLimiter | None,
        *,
        record: UpstreamRecorder | None = None,
        settle_success: bool = False,
    ) -> None:
        self._inner = inner
        self._limiter = limiter
        self._record = record
        self._settle_success = settle_success

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Wait for a grant, send, and report the outcome."""
        if self._limiter is not None:
            await self._limiter.acquire()
        label = endpoint_label(request.method, request.url.path)
        try:
            response = await self._inner.handle_async_request(request)
        except httpx.TransportError:
            if self._record is not None:
                await self._record(label, None)
            raise
        if self._record is not None:
            if self._settle_success and response.is_success:
                request.extensions[_UNSETTLED] = label
                # Closed before its end: counted then, as nobody will settle it.
                if isinstance(response.stream, httpx.AsyncByteStream):
                    response.stream = _Watched(
                        response.stream, lambda outcome: self._finish(request, outcome)
                    )
            else:
                await self._record(label, response.status_code)
        return response

    async def _finish(self, request: httpx.Request, outcome: UpstreamStatus) -> None:
        label = request.extensions.pop(_UNSETTLED, None)
        if label is not None and self._record is not None:
            await self._record(label, outcome)

    async def settle(self, response: httpx.Response, malformed: bool) -> None:
        """Record a 2xx answer once its body was read (:data:`MALFORMED` or its status): the
        API client's ``on_answer`` hook; each answer is recorded once."""
        await self._finish(response.request, MALFORMED if malformed else response.status_code)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self._inner.aclose()


class _Watched(httpx.AsyncByteStream):
    """A 2xx answer's body stream that reports, when it is closed before its end, why."""

    def __init__(
        self,
        inner: httpx.AsyncByteStream,
        finish: Callable[[UpstreamStatus], Awaitable[None]],
    ) -> None:
        self._inner = inner
        self._finish = finish
        self._complete = False
        self._failed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except GeneratorExit:  # the reader stopped early: not a failure of the stream
            raise
        except BaseException:  # a read error, or the deadline cancelled the read
            self._failed = True
            raise
        self._complete = True

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if not self._complete:
                # Shielded: a deadline that cut the read must not also cut its counting.
                with anyio.CancelScope(shield=True):
                    await self._finish(None if self._failed else MALFORMED)
