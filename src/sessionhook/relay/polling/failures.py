"""Upstream failures: how each is counted, how long it backs off, how it is logged.

Every loop of the poller (a session's poll, discovery, the head read, a new session's
GET) meets upstream failures; :class:`Failures` is their one bookkeeping: the
``sessionhook_upstream_failures_total{loop, kind}`` counter, the backoff (exponential,
capped, jittered, never sooner than ``Retry-After``, slow after a rejected key) and the
log line (``upstream.unauthenticated`` at error level, the others as warnings).
"""

from __future__ import annotations

import random

from sessionhook.api.errors import (
    ApiError,
    ApiStatusError,
    MalformedResponseError,
    UnauthenticatedError,
)

from ..telemetry.logs import get_logger
from .settings import backoff_delay
from .state import PollState

_log = get_logger()


class Failures:
    """Counts, delays and logs one account's upstream failures (see the module docstring);
    ``rng`` spreads the backoff."""

    def __init__(self, state: PollState, *, rng: random.Random) -> None:
        self._state, self._metrics, self._account = state, state.metrics, state.account
        self._rng = rng

    def count(self, loop: str, exc: ApiError) -> None:
        """Count one failure of ``loop`` (``session``, ``discovery``, ``announce``)."""
        if self._metrics is not None:
            self._metrics.upstream_failures.labels(loop=loop, kind=exc.kind).inc()

    def delay(
        self, exc: ApiError, errors: int, backoff: tuple[float, float] | None = None
    ) -> float:
        """Seconds to wait after the ``errors``-th failure in a row, ``exc`` the last one;
        ``backoff`` is (base, cap), the settings' by default."""
        s = self._state.settings
        base, cap = backoff if backoff is not None else (s.backoff_base, s.backoff_cap)
        retry_after = exc.retry_after if isinstance(exc, ApiStatusError) else None
        delay = backoff_delay(errors, retry_after, base=base, cap=cap, rng=self._rng)
        if isinstance(exc, UnauthenticatedError):
            # Retrying a rejected key fast helps nobody; slowly, so a fixed key is noticed.
            delay = max(delay, s.unauthenticated_delay)
        return delay

    def log(self, event: str, exc: ApiError, delay: float, **fields: object) -> None:
        """Log a failure as ``event`` (a 401 as ``upstream.unauthenticated``) with the wait."""
        fields["account"] = self._account
        if isinstance(exc, UnauthenticatedError):
            _log.error(
                "upstream.unauthenticated",
                message="API key rejected by the Sessions API; check api.api_key_env/_file",
                error=str(exc),
                retry_in=round(delay, 2),
                **fields,
            )
            return
        if isinstance(exc, MalformedResponseError):
            _log.warning(
                event,
                reason="malformed response",
                kind=exc.kind,
                error=str(exc),
                body=exc.body[:200],
                retry_in=round(delay, 2),
                **fields,
            )
            return
        _log.warning(event, kind=exc.kind, error=str(exc), retry_in=round(delay, 2), **fields)
