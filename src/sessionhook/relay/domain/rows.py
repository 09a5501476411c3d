"""What the store takes and returns: the row dataclasses and the protocols of its inputs.
No SQL here (the queries are the store's); the CLI and the operator layer import them from
here. The store's errors are :mod:`sessionhook.relay.store.errors`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar

from sessionhook.api.models import Session

from ..domain.delivery_states import error_is_current

#: Delivery statuses that still wait for an attempt (``pending``: never tried or parked by a
#: 410; ``failed``: tried, retry scheduled). ``delivered`` and ``dead`` are final.
OPEN_STATUSES = ("pending", "failed")


# --------------------------------------------------------------------------- inputs


class EndpointLike(Protocol):
    """What the store's ``sync_endpoints`` reads of an endpoint (``EndpointConfig`` fits)."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def events(self) -> Sequence[str]: ...

    @property
    def enabled(self) -> bool: ...


# --------------------------------------------------------------------------- rows

_Row = TypeVar("_Row")


def from_row(cls: type[_Row], row: Any, **given: Any) -> _Row:
    """``cls`` (a row dataclass) from a result row of the store, read by column name: each
    field takes the column of its name, but those in ``given`` (values the caller decoded
    or converted); a field with a default may have no column."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    for name in names:
        if name not in given:
            try:
                given[name] = row[name]
            except (IndexError, KeyError):  # no such column (sqlite3.Row says IndexError)
                continue
    return cls(**given)


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A session as archived, with the poller's bookkeeping."""

    name: str
    id: str
    title: str
    state: str
    url: str
    source: str
    create_time: str
    update_time: str
    raw: dict[str, Any]
    first_seen_at: float
    baseline: bool
    polled_update_time: str | None
    activity_cursor: str | None
    last_polled_at: float | None
    next_poll_at: float | None
    poll_errors: int

    def to_session(self) -> Session:
        """The archived upstream JSON as a :class:`Session`."""
        return Session.model_validate(self.raw)


@dataclass(frozen=True, slots=True)
class EndpointState:
    """An endpoint as the store knows it.

    ``configured``: present in the current config with ``enabled = true`` (an endpoint
    created through the API: not deleted). ``enabled``: not disabled at run time (410,
    failing too long, operator). Only an endpoint that is both is :attr:`active`: gets new
    deliveries and is sent to. ``source``: where it is defined, ``config`` (the file) or
    ``api`` (the store: :class:`StoredEndpoint`).
    """

    name: str
    url: str
    events: tuple[str, ...]
    configured: bool
    enabled: bool
    disabled_reason: str | None
    disabled_at: float | None
    last_success_at: float | None
    failing_since: float | None
    last_error: str | None
    last_error_at: float | None
    created_at: float
    source: str = "config"
    description: str = ""
    #: When its definition last changed through the API (``None``: never).
    updated_at: float | None = None

    @property
    def active(self) -> bool:
        """Configured and enabled."""
        return self.configured and self.enabled


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """The definition of an endpoint created through the API, as the store keeps it:
    ``spec`` holds the keys of ``[[endpoints]]`` it sets (JSON, validated before it gets
    here); ``url``, ``events``, ``filter`` and ``accounts`` are its columns the ingest
    reads (the same values, normalized)."""

    name: str
    url: str
    events: tuple[str, ...]
    filter: Mapping[str, Sequence[str]]
    accounts: tuple[str, ...] | None
    spec: Mapping[str, Any]
    description: str = ""


@dataclass(frozen=True, slots=True)
class StoredEndpoint:
    """An endpoint created through the API with its signing secrets: what a dispatcher
    signs with. ``previous_secret`` still signs until ``previous_until`` (a rotation's
    overlap); ``revision`` changes with every change of the definition."""

    name: str
    spec: dict[str, Any]
    description: str
    secret: str
    previous_secret: str | None
    previous_until: float | None
    revision: int
    enabled: bool

    def secrets_at(self, now: float) -> tuple[str, ...]:
        """The secrets that sign at ``now``: the current one, and the previous one while
        its overlap lasts."""
        if self.previous_secret and self.previous_until is not None and now < self.previous_until:
            return (self.secret, self.previous_secret)
        return (self.secret,)


@dataclass(frozen=True, slots=True)
class EndpointChanges:
    """The endpoints created through the API whose definition changed after a revision:
    ``live`` ones with their secrets, the names of those deleted (``gone``), and the
    newest revision among them (the one asked after when none changed)."""

    live: list[StoredEndpoint]
    gone: list[str]
    revision: int


@dataclass(frozen=True, slots=True)
class ActiveEndpoints:
    """What a dispatcher's round reads of the endpoints: the ``names`` deliveries go to
    now (enabled and configured; a round over many endpoints: those of them with a queue
    head), sorted, and the newest ``revision`` of any endpoint's definition (0: none was
    ever created through the API)."""

    names: list[str]
    revision: int


@dataclass(frozen=True, slots=True)
class EventRow:
    """An archived event; ``body`` is the exact payload every delivery sends."""

    seq: int
    id: str
    session_name: str
    type: str
    activity_name: str | None
    occurred_at: str
    occurred_ts: float
    created_at: float
    body: bytes

    def payload(self) -> dict[str, Any]:
        """The body parsed."""
        result: dict[str, Any] = json.loads(self.body)
        return result


@dataclass(frozen=True, slots=True)
class Ingested:
    """What one ingest call archived: new activities, and the type of each new event.

    ``conflicts`` names activities of the batch that were not archived because their name
    is archived under another session already; ``deliveries`` counts the deliveries it
    enqueued (none: no endpoint takes these events, or ``deliver`` was off).
    """

    activities: int
    event_types: tuple[str, ...]
    conflicts: tuple[str, ...] = ()
    deliveries: int = 0


@dataclass(frozen=True, slots=True)
class DueDelivery:
    """A delivery the dispatcher should attempt now.

    ``attempts`` counts the attempts already made (this one is number ``attempts + 1``);
    ``body`` is the event's stored payload, byte for byte.
    """

    id: int
    event_id: str
    event_type: str
    endpoint: str
    url: str
    session_name: str
    attempts: int
    body: bytes
    created_at: float

    @property
    def key(self) -> tuple[str, str]:
        """``(endpoint, session_name)``: at most one in flight per key keeps the order."""
        return (self.endpoint, self.session_name)


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """One row of the outbox / delivery history."""

    id: int
    event_id: str
    event_type: str
    endpoint: str
    session_name: str
    status: str
    attempts: int
    next_attempt_at: float | None
    created_at: float
    updated_at: float
    delivered_at: float | None
    last_status_code: int | None
    last_error: str | None
    replayed: bool
    #: For an open row that is not the oldest open one of its (endpoint, session): the id
    #: of that oldest one, which it waits behind (a session's events go out in order).
    waiting_on: int | None = None


@dataclass(frozen=True, slots=True)
class Retried:
    """What the store's ``requeue.retry`` did to one delivery."""

    #: Its status before (``delivered``: nothing was done, a delivered row is final).
    previous: str
    #: The earlier open delivery of its (endpoint, session) queue, made due now too: it
    #: goes first (a session's events go out in order); ``None`` when it is the head.
    head: int | None = None


@dataclass(frozen=True, slots=True)
class Recovered:
    """What the store's ``requeue.recover`` re-opened, and what the endpoint holds
    otherwise (to say why nothing was when nothing was)."""

    #: The failed and dead deliveries made due now, oldest first.
    ids: tuple[int, ...]
    #: Open deliveries queued behind them in the same sessions: they follow, in order.
    behind: int
    #: Failed or dead deliveries of the endpoint left alone: their events are older.
    older: int
    #: When the newest of those events happened (Unix seconds), if any.
    newest_older_at: float | None
    #: The endpoint's open (pending or failed) deliveries after the recovery.
    open: int


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One POST of a delivery, as logged."""

    id: int
    delivery_id: int
    attempt: int
    started_at: float
    duration_ms: float
    status_code: int | None
    error: str | None
    response_body: str


@dataclass(frozen=True, slots=True)
class EndpointSummary:
    """Per endpoint figures of the store's ``status_summary``; ``*_last_hour`` count rows."""

    name: str
    url: str
    configured: bool
    enabled: bool
    disabled_reason: str | None
    pending: int
    oldest_pending_age: float | None
    delivered_last_hour: int
    failed_last_hour: int
    dead_last_hour: int
    dead_total: int
    last_error: str | None
    last_error_at: float | None
    last_success_at: float | None
    failing_since: float | None

    @property
    def error_is_current(self) -> bool:
        """Whether :attr:`last_error` is news (see
        :func:`~sessionhook.relay.domain.delivery_states.error_is_current`)."""
        return error_is_current(self.last_error, self.last_error_at, self.last_success_at)


@dataclass(frozen=True, slots=True)
class AccountPoll:
    """One account's discovery passes (table ``account_polls``)."""

    account: str
    last_poll_at: float
    #: ``None``: no pass of this account has succeeded yet.
    last_ok_poll_at: float | None
    #: The sessions its last good pass followed when its session list went on past
    #: ``poll.max_pages`` (older ones are not followed); ``None``: the whole list.
    list_cut: int | None


@dataclass(frozen=True, slots=True)
class UpstreamSummary:
    """Sessions API figures of the store's ``status_summary``. With several accounts, the
    passes' figures are of them all: the newest pass of any, the OLDEST last good pass (an
    account whose passes fail shows here; ``None`` while one has none), the sessions
    followed by the lists cut; each account's in ``accounts``."""

    last_poll_at: float | None
    last_ok_poll_at: float | None
    requests_last_hour: int
    throttled_last_hour: int
    #: Every failed request: no answer, malformed answers, 4xx (but 429) and 5xx.
    errors_last_hour: int
    #: Of those: the key was refused (401, 403)...
    rejected_last_hour: int = 0
    #: ...and 2xx answers whose body was not what the API promises.
    malformed_last_hour: int = 0
    #: The sessions the last good pass followed when the session list went on past
    #: ``poll.max_pages`` (older ones are not followed); ``None``: the whole list.
    list_cut: int | None = None
    #: Each account that has polled, by name.
    accounts: tuple[AccountPoll, ...] = ()

    @classmethod
    def of_accounts(cls, polls: Sequence[AccountPoll], **counts: int) -> UpstreamSummary:
        """The summary of ``polls`` (each account's) and the last hour's ``counts``."""
        good = [p.last_ok_poll_at for p in polls]
        cuts = [p.list_cut for p in polls if p.list_cut is not None]
        return cls(
            last_poll_at=max((p.last_poll_at for p in polls), default=None),
            last_ok_poll_at=None
            if not good or None in good
            else min(g for g in good if g is not None),
            list_cut=sum(cuts) if cuts else None,
            accounts=tuple(polls),
            **counts,
        )


@dataclass(frozen=True, slots=True)
class RefusedRow:
    """One activity the relay refused to archive (table ``refused_activities``)."""

    session_name: str
    name: str
    create_time: str
    reason: str
    detail: str
    size: int | None
    first_refused_at: float
    last_refused_at: float
    count: int


@dataclass(frozen=True, slots=True)
class RefusedSummary:
    """Refused activities: in total, by reason, refused (again) recently, the latest."""

    total: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    recent: int = 0
    latest: RefusedRow | None = None


@dataclass(frozen=True, slots=True)
class StatusSummary:
    """What ``sessionhook status`` shows."""

    now: float
    endpoints: tuple[EndpointSummary, ...]
    upstream: UpstreamSummary
    sessions: int
    activities: int
    events: int
    baseline_complete: bool
    refused: RefusedSummary = field(default_factory=RefusedSummary)


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    """One replica as the store knows it, with what it holds (for ``status``/metrics)."""

    id: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    lease: float
    stopped_at: float | None
    #: Outbox heads it has claimed (deliveries in flight), sessions it is polling, and
    #: the named leases it holds.
    deliveries: int
    polls: int
    leases: tuple[str, ...]

    def alive(self, now: float) -> bool:
        """Whether its claims still hold at ``now`` (not stopped, lease not expired)."""
        return self.stopped_at is None and now <= self.heartbeat_at + self.lease


@dataclass(frozen=True, slots=True)
class HistoryProgress:
    """The history walk for ``sessionhook status``: sessions archived of those found at the
    first start, and an estimate of the time left from the recent pace."""

    total: int
    done: int
    #: Sessions per second over the last ten minutes (0.0: none walked lately).
    rate: float

    @property
    def remaining(self) -> int:
        """Sessions still to archive."""
        return self.total - self.done

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the recent pace; ``None`` when unknown (no recent progress)."""
        if self.remaining <= 0:
            return 0.0
        return self.remaining / self.rate if self.rate > 0 else None
