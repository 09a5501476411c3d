"""The store's roles: one protocol per kind of caller, the methods it may call.

A :class:`~.core.StoreCore` has one attribute per role (``store.ingest``, ``store.outbox``...),
typed by the protocol here and implemented by a collaborator of its own (named after each
protocol). The async door (:class:`~.aio.AsyncStore`) has the same attributes, with the same
methods made awaitable (:mod:`.views`). Who uses which:

=============  ==============================================================================
``meta``       the poller (baseline, learned verdicts), the readiness probe
``endpoints``  the daemon (config sync), the dispatcher (disable), the operator
``ingest``     the poller: sessions, their activities and events, deliveries enqueued
``refusals``   the poller (what it refused), ``status``
``outbox``     the dispatcher; the retention task
``leases``     the daemon (registry, heartbeat), poller and dispatcher (claims), ``status``
``economy``    the poller and its budget: history walk, request window, upstream counters
``operator``   the CLI and :mod:`sessionhook.relay.ops`: status, delivery log, replay, events
``console``    the web console (the pages, the live feed)
``copy``       ``sessionhook store copy`` (:class:`~.copying.CopyStore`)
``actions``    the pages behind signed links, Slack, the management API: actions people took
=============  ==============================================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from sessionhook.api.models import Activity, Session

from ..domain.events import Event
from ..domain.retry import Decision
from .actions import ActionClaim, ActionRow
from .console_queries import ConsoleEvent, ConsoleSession, LiveEvent, MinuteCounts
from .economy_queries import BUDGET_WINDOW, HistoryProgress, KnownSession
from .leases import LeaseRow, ReplicaRow
from .outbox import PRUNE_BATCH, AttemptRecord
from .rows import (
    ActiveEndpoints,
    AttemptLike,
    AttemptRow,
    DeliveryRow,
    DueDelivery,
    EndpointChanges,
    EndpointLike,
    EndpointSpec,
    EndpointState,
    EventRow,
    Ingested,
    Recovered,
    RefusedRow,
    RefusedSummary,
    Retried,
    SessionRow,
    StatusSummary,
    StoredEndpoint,
)

__all__ = [
    "ActionRole",
    "ConsoleRole",
    "EconomyRole",
    "EndpointRole",
    "IngestRole",
    "LeaseRole",
    "MetaRole",
    "OperatorRole",
    "OutboxRole",
    "RefusalRole",
]

# Signatures are written compactly here; the implementations carry the full docstrings.


class MetaRole(Protocol):
    """The ``meta`` table (:class:`~.meta.MetaQueries`)."""

    def get_meta(self, key: str) -> str | None:
        """A value, or ``None``."""
        ...

    def set_meta(self, key: str, value: str) -> None:
        """Set a value."""
        ...

    def is_baseline_complete(self) -> bool:
        """Whether the first discovery pass finished."""
        ...

    def mark_baseline_complete(self) -> None:
        """Record that the first discovery pass finished."""
        ...


class EndpointRole(Protocol):
    """The endpoints' state (:class:`~.endpoints.EndpointQueries`)."""

    def sync_endpoints(self, endpoints: Iterable[EndpointLike]) -> None:
        """Make the table match the config (run-time state kept)."""
        ...

    def set_endpoint_enabled(self, name: str, enabled: bool, reason: str | None = None) -> None:
        """Enable or disable one (:class:`~.rows.StoreError` for an unknown name)."""
        ...

    def endpoint_states(self) -> list[EndpointState]:
        """Every endpoint known, by name."""
        ...

    def endpoint_state(self, name: str) -> EndpointState | None:
        """One endpoint, or ``None``."""
        ...

    def create_endpoint(self, spec: EndpointSpec, secret: str, limit: int | None = None) -> None:
        """Create an endpoint through the API (a name taken: EndpointConflictError; ``limit``
        held already: EndpointLimitError)."""
        ...

    def update_endpoint(self, spec: EndpointSpec) -> None:
        """Replace the definition of one created through the API."""
        ...

    def rotate_endpoint_secret(self, name: str, secret: str, previous_until: float) -> None:
        """A new secret; the old one signs too until ``previous_until``."""
        ...

    def delete_endpoint(self, name: str, reason: str) -> int:
        """Delete one created through the API; how many open deliveries became dead."""
        ...

    def stored_endpoints(self) -> list[StoredEndpoint]:
        """Every live one created through the API, with its secrets."""
        ...

    def stored_endpoint(self, name: str) -> StoredEndpoint | None:
        """One created through the API, with its secrets, or ``None``."""
        ...

    def endpoint_changes(self, since: int) -> EndpointChanges:
        """Those created through the API changed after revision ``since``."""
        ...


class IngestRole(Protocol):
    """The poller's archive (:class:`~.ingest.Ingest`)."""

    def get_session(self, name: str) -> SessionRow | None:
        """The archived session, or ``None``."""
        ...

    def all_sessions(self) -> list[SessionRow]:
        """Every archived session, first seen first."""
        ...

    def upsert_session(self, session: Session, *, baseline: bool) -> SessionRow:
        """Archive a session (merged into what is known)."""
        ...

    def set_session_account(self, name: str, account: str) -> None:
        """Record which account lists the session."""
        ...

    def session_account(self, name: str) -> str | None:
        """The account that lists the session, or ``None`` for an unknown session."""
        ...

    def schedule_poll(
        self,
        name: str,
        next_poll_at: float | None,
        *,
        polled_update_time: str | None = None,
        polled_at: float | None = None,
        poll_errors: int | None = None,
    ) -> None:
        """When the session is polled next; a completed poll with ``polled_update_time``."""
        ...

    def finish_poll(
        self,
        name: str,
        fresh: Session | None,
        *,
        baseline: bool,
        next_poll_at: float | None,
        polled_update_time: str,
    ) -> None:
        """A poll's end: the session read again, the next poll scheduled."""
        ...

    def ingest_session_events(
        self, session_name: str, events: Sequence[Event], deliver: bool
    ) -> Ingested:
        """Archive session-level events, their deliveries enqueued when ``deliver``."""
        ...

    def archive_discovered(
        self, session: Session, event: Event, *, baseline: bool, account: str | None = None
    ) -> Ingested:
        """A session seen for the first time and its ``session.discovered``."""
        ...

    def ingest_activities(
        self,
        session_name: str,
        activities: Sequence[Activity],
        events: Sequence[Event],
        deliver: bool,
        *,
        cursor_limit: str | None = None,
        raws: Sequence[bytes] | None = None,
    ) -> Ingested:
        """A page of activities with their events, in ONE transaction."""
        ...

    def activity_raw(self, name: str) -> bytes | None:
        """An activity's raw JSON, byte for byte."""
        ...

    def latest_activity(self, session_name: str, member: str) -> Activity | None:
        """The newest archived activity of that kind."""
        ...


class RefusalRole(Protocol):
    """What was refused from upstream (:class:`~.refusals.Refusals`)."""

    def refuse_activity(
        self,
        session_name: str,
        name: str,
        reason: str,
        *,
        create_time: str = "",
        detail: str = "",
        size: int | None = None,
        cursor_limit: str | None = None,
        advance_cursor: bool = False,
    ) -> bool:
        """Record a refusal; whether it is the first time."""
        ...

    def refused_summary(self, since: float) -> RefusedSummary:
        """Refusals in total, by reason, recent, and the latest."""
        ...

    def refused_activities(self, limit: int = 100) -> list[RefusedRow]:
        """The most recently refused, newest first."""
        ...


class OutboxRole(Protocol):
    """The dispatcher's (:class:`~.outbox.Outbox`)."""

    def active_endpoints(self) -> list[str]:
        """The endpoints deliveries go to now, sorted."""
        ...

    def active_revisions(self) -> ActiveEndpoints:
        """The endpoints deliveries go to now, and the newest revision of a definition."""
        ...

    def due_deliveries(
        self,
        now: float,
        limit: int,
        busy: Iterable[tuple[str, str]] = (),
        caps: Mapping[str, int] | None = None,
        *,
        active: Sequence[str] | None = None,
    ) -> list[DueDelivery]:
        """The queue heads to attempt now (claimed by a replica that has rivals)."""
        ...

    def next_due_at(
        self, after: float | None = None, *, active: Sequence[str] | None = None
    ) -> float | None:
        """When the earliest queue head is due."""
        ...

    def record_attempt(
        self, delivery_id: int, attempt: AttemptLike, decision: Decision
    ) -> float | None:
        """Log one attempt and apply its decision."""
        ...

    def record_attempts(self, records: Sequence[AttemptRecord]) -> list[float | None]:
        """Log attempts and apply their decisions, all in one transaction."""
        ...

    def pending_count(self, endpoint: str | None = None) -> int:
        """Open deliveries, of one endpoint or all."""
        ...

    def outbox_stats(self) -> dict[str, tuple[int, float | None]]:
        """Per endpoint: open deliveries and the oldest's creation."""
        ...

    def prune_delivery_log(
        self, before: float, *, batch: int = PRUNE_BATCH, rounds: int | None = None
    ) -> tuple[int, int]:
        """Delete the delivery log older than ``before``."""
        ...

    def save_rendered(self, delivery_id: int, body: bytes, content_type: str) -> None:
        """Keep the bytes a delivery's first attempt sends."""
        ...

    def rendered_body(self, delivery_id: int) -> tuple[bytes, str] | None:
        """The bytes kept by :meth:`save_rendered`."""
        ...


class LeaseRole(Protocol):
    """Replicas, claims and named leases (:class:`~.leases.Leases`)."""

    @property
    def replica_id(self) -> str | None:
        """This handle's replica id once registered."""
        ...

    @property
    def lease_seconds(self) -> float:
        """How long this replica's claims last after a heartbeat."""
        ...

    @property
    def exclusive(self) -> bool:
        """Registered as the only replica there can be."""
        ...

    @property
    def claims(self) -> bool:
        """Whether this handle claims what it works on."""
        ...

    def register_replica(
        self,
        replica_id: str,
        *,
        host: str,
        pid: int,
        now: float,
        lease: float,
        exclusive: bool = False,
    ) -> None:
        """Record this process as a replica."""
        ...

    def heartbeat_replica(self, now: float) -> bool:
        """Extend every claim this replica holds."""
        ...

    def retire_replica(self, now: float) -> None:
        """A clean stop: every claim released at once."""
        ...

    def reap_replicas(self, ids: Iterable[str], now: float) -> int:
        """Release the claims of replicas known dead."""
        ...

    def replicas(self) -> list[ReplicaRow]:
        """Every replica known, with what it holds."""
        ...

    def delivery_claims(
        self, now: float, ids: Iterable[int] | None = None
    ) -> dict[int, tuple[str, float]]:
        """Deliveries in flight on a live replica."""
        ...

    def endpoint_claims(self, now: float) -> dict[str, dict[str, int]]:
        """Per endpoint, deliveries in flight per live replica."""
        ...

    def release_delivery_claims(self, keys: Iterable[tuple[str, str]]) -> None:
        """Give back heads handed out and not started."""
        ...

    def claim_session_poll(self, name: str, now: float) -> bool:
        """Claim a session's activity poll."""
        ...

    def release_session_poll(self, name: str) -> None:
        """Release a session's poll."""
        ...

    def acquire_lease(self, name: str, now: float) -> bool:
        """Take or keep a named lease."""
        ...

    def release_lease(self, name: str) -> None:
        """Give a named lease up."""
        ...

    def lease_expires_at(self, name: str) -> float | None:
        """When a named lease's holder stops being alive."""
        ...

    def leases(self) -> list[LeaseRow]:
        """Every named lease."""
        ...


class EconomyRole(Protocol):
    """The poller's upstream economy (:class:`~.economy_queries.Economy`)."""

    def known_sessions(self) -> list[KnownSession]:
        """Every archived session's scheduling facts."""
        ...

    def record_history(self, sessions: Sequence[Session], *, account: str = "default") -> int:
        """Sessions for the history walk; how many were new."""
        ...

    def accounts_summary(self) -> dict[str, int]:
        """Archived sessions per account."""
        ...

    def history_pending(self, *, account: str | None = None) -> list[str]:
        """Sessions the history walk has still to archive."""
        ...

    def finish_history(self, name: str, at: float) -> None:
        """Mark a session's history archived."""
        ...

    def history_progress(self, now: float) -> HistoryProgress:
        """The history walk's progress."""
        ...

    def take_budget(
        self, key: str, now: float, limit: int, window: float = BUDGET_WINDOW, count: int = 1
    ) -> tuple[int, float]:
        """Take request grants of a budget: (granted, seconds to wait)."""
        ...

    def record_upstream(self, label: str, status: int | str | None, at: float) -> bool:
        """Count one upstream request."""
        ...

    def record_upstream_counts(
        self, counts: Mapping[tuple[str, int | str | None, int], int]
    ) -> bool:
        """Count many upstream requests, one transaction."""
        ...

    def mark_poll(self, ok: bool, at: float) -> bool:
        """Record a discovery pass."""
        ...


class OperatorRole(Protocol):
    """The operator's (:class:`~.ops_queries.OperatorQueries`)."""

    def status_summary(self, now: float) -> StatusSummary:
        """The figures of ``sessionhook status``."""
        ...

    def list_deliveries(
        self,
        endpoint: str | None = None,
        status: str | None = None,
        session: str | None = None,
        limit: int = 100,
        *,
        event_id: str | None = None,
        before_id: int | None = None,
    ) -> list[DeliveryRow]:
        """Deliveries, newest first, filtered; ``before_id`` pages back."""
        ...

    def get_delivery(self, delivery_id: int) -> DeliveryRow | None:
        """One delivery, or ``None``."""
        ...

    def list_attempts(self, delivery_id: int) -> list[AttemptRow]:
        """A delivery's attempts, first to last."""
        ...

    def replay(
        self,
        endpoint: str,
        *,
        since: float | None = None,
        until: float | None = None,
        event_ids: Sequence[str] | None = None,
        type_glob: str | None = None,
        session: str | None = None,
    ) -> int:
        """Queue archived events again for an endpoint; how many."""
        ...

    def replay_census(
        self,
        endpoint: str,
        *,
        since: float | None = None,
        until: float | None = None,
        event_ids: Sequence[str] | None = None,
        session: str | None = None,
    ) -> tuple[int, int]:
        """Events a replay selects, and of them those on their way to the endpoint."""
        ...

    def retry_delivery(self, delivery_id: int) -> Retried | None:
        """Make one delivery due now (failed or dead: re-opened); ``None``: no such one."""
        ...

    def recover_deliveries(self, endpoint: str, since: float) -> Recovered:
        """Re-open an endpoint's failed and dead deliveries of events since a time."""
        ...

    def make_due(self, endpoint: str) -> None:
        """Make an endpoint's open deliveries due now."""
        ...

    def list_sessions(self, after: str | None = None, limit: int = 50) -> list[SessionRow]:
        """Archived sessions by name, after a name (a page)."""
        ...

    def get_event(self, event_id: str) -> EventRow | None:
        """One archived event, or ``None``."""
        ...

    def iter_events(
        self,
        session: str | None = None,
        type_glob: str | None = None,
        since: float | None = None,
        *,
        until: float | None = None,
    ) -> Iterator[EventRow]:
        """Archived events in ingest order, streamed."""
        ...

    def event_seq(self, event_id: str) -> int | None:
        """An event's position in ingest order."""
        ...

    def last_event_seq(self) -> int:
        """The newest event's position (0: none)."""
        ...

    def events_after(
        self,
        seq: int,
        *,
        limit: int = 200,
        max_bytes: int | None = None,
        session: str | None = None,
    ) -> list[EventRow]:
        """Events after a position (the event stream's read), of one session or all."""
        ...

    def event_ids_after(
        self,
        seq: int,
        *,
        session: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 1000,
    ) -> list[tuple[int, str, str]]:
        """``(seq, id, type)`` of events after a position (a replay's pages)."""
        ...


class ConsoleRole(Protocol):
    """The web console's (:class:`~.console_queries.ConsoleQueries`)."""

    def get_session(self, name: str) -> SessionRow | None:
        """The archived session, or ``None``."""
        ...

    def endpoint_states(self) -> list[EndpointState]:
        """Every endpoint known, by name."""
        ...

    def status_summary(self, now: float) -> StatusSummary:
        """The overview's figures."""
        ...

    def get_delivery(self, delivery_id: int) -> DeliveryRow | None:
        """One delivery, or ``None``."""
        ...

    def list_attempts(self, delivery_id: int) -> list[AttemptRow]:
        """A delivery's attempts, first to last."""
        ...

    def get_event(self, event_id: str) -> EventRow | None:
        """One archived event, or ``None``."""
        ...

    def last_event_seq(self) -> int:
        """The newest event's position (0: none)."""
        ...

    def console_sessions(
        self,
        *,
        state: str | None = None,
        account: str | None = None,
        text: str | None = None,
        limit: int = 200,
    ) -> list[ConsoleSession]:
        """Sessions, most recently active first, filtered."""
        ...

    def console_session_facets(self) -> tuple[list[str], list[str]]:
        """The distinct session states and accounts."""
        ...

    def console_timeline(
        self, session: str, *, after_seq: int = 0, limit: int = 200
    ) -> list[EventRow]:
        """A session's events after a position."""
        ...

    def deliveries_of_events(self, event_ids: Sequence[str]) -> list[DeliveryRow]:
        """Every delivery of these events."""
        ...

    def attempts_of_deliveries(self, delivery_ids: Sequence[int]) -> list[AttemptRow]:
        """Every attempt of these deliveries."""
        ...

    def console_deliveries(
        self,
        *,
        endpoint: str | None = None,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        before_id: int | None = None,
        limit: int = 100,
        session: str | None = None,
        event_id: str | None = None,
        event_type: str | None = None,
    ) -> list[DeliveryRow]:
        """Deliveries, newest first, filtered, paged back by id."""
        ...

    def console_events(
        self,
        *,
        session: str | None = None,
        event_id: str | None = None,
        event_type: str | None = None,
        status: str | None = None,
        before_seq: int | None = None,
        limit: int = 100,
    ) -> list[ConsoleEvent]:
        """Events, newest first, filtered, paged back by position."""
        ...

    def find_session(self, text: str) -> str | None:
        """The archived session a search names, or ``None``."""
        ...

    def get_attempt(self, attempt_id: int) -> AttemptRow | None:
        """One attempt, or ``None``."""
        ...

    def attempts_per_minute(self, since: int, minutes: int) -> list[MinuteCounts]:
        """Attempts per minute, 2xx and the rest."""
        ...

    def budget_used(self, since: float) -> dict[str, int]:
        """Request grants taken per budget."""
        ...

    def console_events_after(
        self, seq: int, *, session: str | None = None, limit: int = 100
    ) -> list[LiveEvent]:
        """Events after a position, without bodies (the live feed)."""
        ...


class ActionRole(Protocol):
    """Actions people took through the relay (:class:`~.actions.ActionQueries`)."""

    def claim_action(self, claim: ActionClaim) -> int | None:
        """Record an action as pending; ``None`` when its token or its wait is taken."""
        ...

    def finish_action(self, action_id: int, ok: bool, status: int | None, detail: str) -> None:
        """Record the service's answer."""
        ...

    def record_action(self, claim: ActionClaim, ok: bool, status: int | None, detail: str) -> int:
        """Record an action made without a link, done already."""
        ...

    def action_taken(self, token_hash: str, session: str, wait: str) -> ActionRow | None:
        """The pending or done action of this token or wait."""
        ...

    def list_actions(
        self, *, session: str | None = None, before: int | None = None, limit: int = 100
    ) -> list[ActionRow]:
        """Actions, newest first."""
        ...
