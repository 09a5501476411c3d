"""What the relay says about each committed attempt: log lines and metrics.

:class:`AttemptReporter` is the dispatcher's collaborator for it. A success is one
``delivery.succeeded`` line, at most :data:`SUCCESS_LINES_PER_SECOND` a second (the rest are
counted per endpoint in one ``delivery.succeeded_summary`` line, see :class:`LineBudget`); a
failure is ``delivery.failed`` (a retry follows) or ``delivery.dead``; a disabled endpoint is
``endpoint.disabled`` with the command that enables it again.
"""

from __future__ import annotations

import logging as stdlib_logging
from typing import NamedTuple

import structlog
from structlog.typing import FilteringBoundLogger

from ..config import EndpointConfig
from ..domain import retry
from ..domain.retry import AttemptResult
from ..domain.rows import DueDelivery
from ..telemetry.logs import LineBudget, get_logger
from ..telemetry.metrics import Metrics

#: ``delivery.succeeded`` lines a second at most; the successes beyond are counted, per
#: endpoint, in one ``delivery.succeeded_summary`` line (see :class:`LineBudget`).
SUCCESS_LINES_PER_SECOND = 50

_log = get_logger()


class Finished(NamedTuple):
    """An attempt made, waiting for its group commit (a NamedTuple: built per delivery, a
    frozen dataclass's ``__init__`` cost four times as much)."""

    delivery: DueDelivery
    endpoint: EndpointConfig
    attempt_no: int
    result: AttemptResult
    decision: retry.Decision
    at: float


class AttemptReporter:
    """Logs and counts committed attempts (``metrics`` optional) and disabled endpoints."""

    def __init__(self, metrics: Metrics | None) -> None:
        self._metrics = metrics
        #: (structlog's configuration, the logger bound under it, quiet): see batch_logger.
        self._logger: tuple[tuple[object, ...], FilteringBoundLogger, bool] | None = None
        self._success_lines = LineBudget(SUCCESS_LINES_PER_SECOND)

    def batch_logger(self) -> tuple[FilteringBoundLogger, bool]:
        """The module's logger, bound (the lazy proxy binds anew at every call: ~4 us), and
        whether info lines are filtered out; kept until structlog is configured again."""
        config = tuple(structlog.get_config().values())
        cached = self._logger
        if cached is not None and all(a is b for a, b in zip(cached[0], config, strict=True)):
            return cached[1], cached[2]
        log = _log.bind()
        is_enabled_for = getattr(log, "is_enabled_for", None)
        quiet = is_enabled_for is not None and not is_enabled_for(stdlib_logging.INFO)
        self._logger = (config, log, quiet)
        return log, quiet

    def report(self, item: Finished, log: FilteringBoundLogger, quiet: bool) -> None:
        """Log and count one committed attempt (``quiet``: info lines are filtered out)."""
        endpoint, result, decision = item.endpoint, item.result, item.decision
        if isinstance(decision, retry.Delivered):
            if not quiet and self._success_lines.admit(endpoint.name):
                log.info("delivery.succeeded", **self._fields(item))
            if self._metrics is not None:
                self._metrics.delivery_attempted(
                    endpoint.name, "delivered", result.duration_ms / 1000
                )
            return
        now = item.at
        fields = self._fields(item)
        outcome: str
        if isinstance(decision, retry.Retry):
            outcome = "retry"
            log.warning(
                "delivery.failed",
                error=result.error,
                retry_in=round(decision.at - now, 2),
                **fields,
            )
        elif isinstance(decision, retry.Dead):
            outcome = "dead"
            log.error("delivery.dead", error=result.error, reason=decision.reason, **fields)
        else:
            # The store disabled the endpoint in the same transaction as the attempt; the
            # delivery stays pending and goes out first once the endpoint is enabled again.
            outcome = "disabled"
            log.warning("delivery.failed", error="410 Gone", **fields)
            self.disabled(endpoint.name, decision.reason, "gone")
        if self._metrics is not None:
            self._metrics.delivery_attempted(endpoint.name, outcome, result.duration_ms / 1000)

    def summarize_successes(self, *, now: bool = False) -> None:
        """One line per endpoint for the successes counted instead of listed, once their second
        is over (``now``: the loop ends)."""
        unlisted = self._success_lines.unlisted(now=now)
        if unlisted:
            log, _quiet = self.batch_logger()
            for endpoint, count in sorted(unlisted.items()):
                log.info(
                    "delivery.succeeded_summary",
                    endpoint=endpoint,
                    count=count,
                    note=f"beyond {SUCCESS_LINES_PER_SECOND} lines a second successes are "
                    "counted, not listed; every attempt is in the delivery log",
                )

    @staticmethod
    def _fields(item: Finished) -> dict[str, object]:
        """What every line about an attempt says."""
        return {
            "endpoint": item.endpoint.name,
            "event_id": item.delivery.event_id,
            "status": item.result.status_code,
            "attempt": item.attempt_no,
            "session": item.delivery.session_name,
            "duration_ms": round(item.result.duration_ms, 1),
        }

    def disabled(self, name: str, reason: str, category: str) -> None:
        _log.error(
            "endpoint.disabled",
            endpoint=name,
            reason=reason,
            hint=f"sessionhook endpoints enable {name} (pending deliveries then go out)",
        )
        if self._metrics is not None:
            self._metrics.endpoint_was_disabled(name, category)
