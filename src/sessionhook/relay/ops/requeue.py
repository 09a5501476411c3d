"""Retry now and recover: the operator's way out after an endpoint was fixed.

:func:`retry` makes one delivery due now, the same row (same ``webhook-id``, same bytes),
after the earlier open one of its session, made due too; :func:`recover` every failed or
dead delivery of an endpoint whose event happened since a time, each session's in order,
and says why when there is none. Both are writes run in the store's thread; the web routes
then wake the dispatcher, the CLI relies on the daemon's next round or PostgreSQL's
notification.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...wording import counted
from ..domain.api_models import ApiRecovered, ApiRetried, json_stamp
from ..domain.rows import DeliveryRow, EndpointState, Recovered
from ..store import StoreCore
from ..store.policy import write
from .endpoint_switches import find_endpoint
from .errors import OperatorError
from .wire import delivery_answer


@dataclass(frozen=True, slots=True)
class RetryResult:
    """A delivery after :func:`retry`."""

    #: The delivery as it is now (``pending``, due now).
    delivery: DeliveryRow
    #: Its status before.
    previous: str
    #: The earlier open delivery of its queue, made due now and sent first (or ``None``).
    head: int | None
    #: Its endpoint (a disabled one sends it once enabled).
    endpoint: EndpointState

    @property
    def message(self) -> str:
        """One line for the operator."""
        d = self.delivery
        line = f"delivery {d.id} ({d.event_id}) to {d.endpoint}: {self.previous} -> due now"
        if self.head is not None:
            line += f", after delivery {self.head} of the same session (due now too)"
        return line + _inactive(self.endpoint)

    def answer(self) -> ApiRetried:
        """What ``deliveries retry --json`` prints and ``:retry`` answers."""
        return ApiRetried(
            delivery=delivery_answer(self.delivery),
            previous_status=self.previous,
            after=self.head,
            message=self.message,
        )


@dataclass(frozen=True, slots=True)
class RecoverResult:
    """What :func:`recover` queued, and why nothing when nothing."""

    queued: int
    #: Open deliveries of the same sessions queued behind them (they follow, in order).
    behind: int
    endpoint: EndpointState
    #: Why nothing was queued (``None`` when something was).
    reason: str | None
    ids: tuple[int, ...] = ()

    @property
    def message(self) -> str:
        """One line for the operator."""
        name = self.endpoint.name
        if self.queued == 0:
            return f"recovered 0 deliveries of {name}: {self.reason}"
        line = f"recovered {counted(self.queued, 'delivery')} of {name}, due now"
        if self.behind:
            follow = "follows" if self.behind == 1 else "follow"
            line += f"; {self.behind} more of the same sessions {follow} in order"
        return line + _inactive(self.endpoint)

    def answer(self) -> ApiRecovered:
        """What ``deliveries recover --json`` prints and ``:recover`` answers."""
        return ApiRecovered(
            recovered=self.queued,
            ids=list(self.ids),
            following=self.behind,
            reason=self.reason,
            message=self.message,
        )


def _inactive(endpoint: EndpointState) -> str:
    if endpoint.active:
        return ""
    why = endpoint.disabled_reason or "it is not enabled in the config"
    return (
        f" (note: {endpoint.name} is disabled: {why}; they go out once it is enabled: "
        f"sessionhook endpoints enable {endpoint.name})"
    )


@write
def retry(store: StoreCore, delivery_id: int) -> RetryResult:
    """Make delivery ``delivery_id`` due now (see the module docstring);
    :class:`OperatorError` for an unknown or a delivered one."""
    done = store.requeue.retry(delivery_id)
    if done is None:
        raise OperatorError(f"no delivery {delivery_id}", hint="see `sessionhook deliveries`")
    row = store.operator.get_delivery(delivery_id)
    if row is None:  # pruned between the two statements: as good as unknown
        raise OperatorError(f"no delivery {delivery_id}", hint="see `sessionhook deliveries`")
    if done.previous == "delivered":
        raise OperatorError(
            f"delivery {delivery_id} was delivered already: nothing to retry",
            hint=f"to send its event again: sessionhook replay --endpoint {row.endpoint} "
            f"--event {row.event_id}",
        )
    return RetryResult(row, done.previous, done.head, find_endpoint(store, row.endpoint))


@write
def recover(store: StoreCore, endpoint: str, since: float) -> RecoverResult:
    """Re-queue now every failed or dead delivery of ``endpoint`` whose event happened at
    or after ``since`` (Unix seconds), same webhook-ids, each session's in order."""
    state = find_endpoint(store, endpoint)
    done = store.requeue.recover(endpoint, since)
    reason = None if done.ids else _why_none(done, endpoint, since)
    return RecoverResult(len(done.ids), done.behind, state, reason, done.ids)


def _why_none(done: Recovered, endpoint: str, since: float) -> str:
    if done.older:
        newest = "" if done.newest_older_at is None else json_stamp(done.newest_older_at)
        return (
            f"its {counted(done.older, 'failed or dead delivery', 'failed or dead deliveries')} "
            f"{'is of an event' if done.older == 1 else 'are of events'} before "
            f"{json_stamp(since)} (the newest {newest}): give an earlier start"
        )
    if done.open:
        return (
            f"it has no failed or dead delivery; {done.open} "
            + (
                "is pending and goes out on its"
                if done.open == 1
                else "are pending and go out on their"
            )
            + f" own (see `sessionhook deliveries --endpoint {endpoint}`)"
        )
    return "it has no failed, dead or pending delivery: nothing is waiting"
