"""The async door's views of the roles (:mod:`.roles`): ``await astore.outbox.pending_count()``.

Each view holds the door (:class:`~.aio.AsyncStore`) and one role of the synchronous store.
Its methods are the role's, awaitable, each declared with the way it meets a store that
cannot be written or reached for now (the door's policies, see :mod:`.aio`):

* :func:`call`: once, in the store's thread; a failure is raised (the console answers 503,
  an operator's action reports it);
* :func:`read`: a read the poller cannot go on without; an unreachable database is waited
  out (a full disk is not: reads work without space);
* :func:`write`: waits out a full disk or an unreachable database, then commits (nothing
  the poller archived or the dispatcher sent is lost);
* :func:`try_write`: a statistic, skipped while the store cannot be written; the result
  says whether it committed.

A method is declared from the role's protocol (``get_meta = call(MetaRole.get_meta)``), so
its arguments and result are the protocol's, checked by the type checker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from .outbox import AttemptRecord
from .roles import (
    ActionRole,
    ConsoleRole,
    EconomyRole,
    EndpointRole,
    IngestRole,
    LeaseRole,
    MetaRole,
    OperatorRole,
    OutboxRole,
    RefusalRole,
)
from .rows import ActiveEndpoints, DueDelivery

__all__ = [
    "AsyncActions",
    "AsyncConsole",
    "AsyncEconomy",
    "AsyncEndpoints",
    "AsyncIngest",
    "AsyncLeases",
    "AsyncMeta",
    "AsyncOperator",
    "AsyncOutbox",
    "AsyncRefusals",
    "Awaits",
    "Door",
    "View",
    "call",
    "read",
    "try_write",
    "write",
]

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")


class Door(Protocol):
    """The policies a view runs its role's methods through (:class:`~.aio.AsyncStore`)."""

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Once, in the store's thread."""
        ...

    async def read(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """An unreachable store waited out."""
        ...

    async def write(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """A full disk or an unreachable store waited out."""
        ...

    async def try_write(
        self, fn: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs
    ) -> bool:
        """Skipped while the store cannot be written; whether it committed."""
        ...


class View(Generic[R]):
    """One role of the store seen through the door."""

    def __init__(self, door: Door, role: R) -> None:
        self._door = door
        self._role = role


class Awaits(Generic[P, T]):
    """A role's method as a view's awaitable method, run by one of the door's policies.

    The door's policy and the role's method are looked up at each call (a test may watch
    the door's ``call``); the bound coroutine function is kept in the view once made."""

    def __init__(self, method: Callable[..., Any], policy: str) -> None:
        #: The role's method, and the door's policy that runs it.
        self._method = method.__name__
        self._policy = policy
        #: The view's attribute (``probe`` runs ``set_meta``): set by ``__set_name__``.
        self._name = method.__name__
        self.__doc__ = f"{policy}: {method.__doc__ or ''}"

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, view: None, owner: type | None = None) -> Awaits[P, T]: ...

    @overload
    def __get__(self, view: View[Any], owner: type | None = None) -> Callable[P, Awaitable[T]]: ...

    def __get__(
        self, view: View[Any] | None, owner: type | None = None
    ) -> Awaits[P, T] | Callable[P, Awaitable[T]]:
        if view is None:
            return self
        door, role = view._door, view._role
        policy, method = self._policy, self._method

        async def bound(*args: Any, **kwargs: Any) -> Any:
            run: Callable[..., Awaitable[Any]] = getattr(door, policy)
            return await run(getattr(role, method), *args, **kwargs)

        bound.__name__ = self._name
        bound.__doc__ = self.__doc__
        view.__dict__[self._name] = bound
        return bound


def call(method: Callable[Concatenate[Any, P], T]) -> Awaits[P, T]:
    """``method`` run once; a failure is raised."""
    return Awaits(method, "call")


def read(method: Callable[Concatenate[Any, P], T]) -> Awaits[P, T]:
    """``method``, a read that waits out an unreachable store."""
    return Awaits(method, "read")


def write(method: Callable[Concatenate[Any, P], T]) -> Awaits[P, T]:
    """``method``, a write that waits out a full disk or an unreachable store."""
    return Awaits(method, "write")


def try_write(method: Callable[Concatenate[Any, P], object]) -> Awaits[P, bool]:
    """``method``, a statistic: skipped while the store cannot be written; whether it
    committed."""
    return Awaits(method, "try_write")


class AsyncMeta(View[MetaRole]):
    """:class:`~.roles.MetaRole` through the door."""

    get_meta = call(MetaRole.get_meta)
    set_meta = write(MetaRole.set_meta)
    #: A tiny write (the readiness probe, a full disk's probe): whether the store takes
    #: writes now; not even tried while it is unwritable and its retry is not due.
    probe = try_write(MetaRole.set_meta)
    is_baseline_complete = read(MetaRole.is_baseline_complete)
    mark_baseline_complete = write(MetaRole.mark_baseline_complete)


class AsyncEndpoints(View[EndpointRole]):
    """:class:`~.roles.EndpointRole` through the door. The daemon syncs the configuration
    once, without waiting: a reload must not wait for disk space (a SIGTERM must still be
    heard), and the start retries the opening itself."""

    sync_endpoints = call(EndpointRole.sync_endpoints)
    set_endpoint_enabled = write(EndpointRole.set_endpoint_enabled)
    endpoint_states = call(EndpointRole.endpoint_states)
    endpoint_state = call(EndpointRole.endpoint_state)
    create_endpoint = call(EndpointRole.create_endpoint)
    update_endpoint = call(EndpointRole.update_endpoint)
    rotate_endpoint_secret = call(EndpointRole.rotate_endpoint_secret)
    delete_endpoint = call(EndpointRole.delete_endpoint)
    stored_endpoints = call(EndpointRole.stored_endpoints)
    stored_endpoint = call(EndpointRole.stored_endpoint)
    endpoint_changes = call(EndpointRole.endpoint_changes)


class AsyncIngest(View[IngestRole]):
    """:class:`~.roles.IngestRole` through the door: the poller's writes wait out a full
    disk, its reads an unreachable database."""

    get_session = read(IngestRole.get_session)
    session_account = read(IngestRole.session_account)
    all_sessions = call(IngestRole.all_sessions)
    upsert_session = write(IngestRole.upsert_session)
    schedule_poll = write(IngestRole.schedule_poll)
    finish_poll = write(IngestRole.finish_poll)
    ingest_session_events = write(IngestRole.ingest_session_events)
    archive_discovered = write(IngestRole.archive_discovered)
    ingest_activities = write(IngestRole.ingest_activities)
    latest_activity = read(IngestRole.latest_activity)


class AsyncRefusals(View[RefusalRole]):
    """:class:`~.roles.RefusalRole` through the door."""

    refuse_activity = write(RefusalRole.refuse_activity)


class AsyncEconomy(View[EconomyRole]):
    """:class:`~.roles.EconomyRole` through the door: the upstream counters are statistics
    (skipped while the store is full); the budget is read once (a store that cannot be
    written leaves the in-process window)."""

    known_sessions = call(EconomyRole.known_sessions)
    history_pending = call(EconomyRole.history_pending)
    record_history = write(EconomyRole.record_history)
    finish_history = write(EconomyRole.finish_history)
    take_budget = call(EconomyRole.take_budget)
    record_upstream = try_write(EconomyRole.record_upstream)
    record_upstream_counts = try_write(EconomyRole.record_upstream_counts)
    mark_poll = try_write(EconomyRole.mark_poll)


class AsyncLeases(View[LeaseRole]):
    """:class:`~.roles.LeaseRole` through the door. Retiring and releasing a poll are tried
    once (a stop must not wait for the disk); a heartbeat is skipped while the store cannot
    be written (its lateness is watched by the daemon)."""

    register_replica = write(LeaseRole.register_replica)
    replicas = call(LeaseRole.replicas)
    reap_replicas = write(LeaseRole.reap_replicas)
    retire_replica = call(LeaseRole.retire_replica)
    heartbeat_replica = try_write(LeaseRole.heartbeat_replica)
    acquire_lease = write(LeaseRole.acquire_lease)
    lease_expires_at = call(LeaseRole.lease_expires_at)
    claim_session_poll = write(LeaseRole.claim_session_poll)
    release_session_poll = call(LeaseRole.release_session_poll)

    @property
    def replica_id(self) -> str | None:
        """This handle's replica id once registered (:attr:`LeaseRole.replica_id`)."""
        return self._role.replica_id

    @property
    def lease_seconds(self) -> float:
        """How long this replica's claims last after a heartbeat."""
        return self._role.lease_seconds

    @property
    def claims(self) -> bool:
        """Whether this handle claims what it works on (:attr:`LeaseRole.claims`)."""
        return self._role.claims


class AsyncOperator(View[OperatorRole]):
    """:class:`~.roles.OperatorRole` through the door (what the daemon reads of it)."""

    status_summary = call(OperatorRole.status_summary)
    list_deliveries = call(OperatorRole.list_deliveries)
    replay = write(OperatorRole.replay)
    retry_delivery = write(OperatorRole.retry_delivery)
    recover_deliveries = write(OperatorRole.recover_deliveries)
    make_due = write(OperatorRole.make_due)


class AsyncConsole(View[ConsoleRole]):
    """:class:`~.roles.ConsoleRole` through the door: every read once (a page answers 503
    when the store cannot be read, the browser reloads)."""

    get_session = call(ConsoleRole.get_session)
    endpoint_states = call(ConsoleRole.endpoint_states)
    status_summary = call(ConsoleRole.status_summary)
    get_delivery = call(ConsoleRole.get_delivery)
    list_attempts = call(ConsoleRole.list_attempts)
    get_event = call(ConsoleRole.get_event)
    last_event_seq = call(ConsoleRole.last_event_seq)
    console_sessions = call(ConsoleRole.console_sessions)
    console_session_facets = call(ConsoleRole.console_session_facets)
    console_timeline = call(ConsoleRole.console_timeline)
    deliveries_of_events = call(ConsoleRole.deliveries_of_events)
    attempts_of_deliveries = call(ConsoleRole.attempts_of_deliveries)
    console_deliveries = call(ConsoleRole.console_deliveries)
    console_events = call(ConsoleRole.console_events)
    find_session = call(ConsoleRole.find_session)
    get_attempt = call(ConsoleRole.get_attempt)
    attempts_per_minute = call(ConsoleRole.attempts_per_minute)
    budget_used = call(ConsoleRole.budget_used)
    console_events_after = call(ConsoleRole.console_events_after)


class AsyncActions(View[ActionRole]):
    """:class:`~.roles.ActionRole` through the door: once each (a page that cannot record
    an action answers 503 and makes no upstream call)."""

    claim_action = call(ActionRole.claim_action)
    finish_action = call(ActionRole.finish_action)
    record_action = call(ActionRole.record_action)
    action_taken = call(ActionRole.action_taken)
    list_actions = call(ActionRole.list_actions)


class AsyncOutbox(View[OutboxRole]):
    """:class:`~.roles.OutboxRole` through the door: the dispatcher's round in one call,
    its records waiting out a full disk."""

    def __init__(self, door: Door, role: OutboxRole, leases: LeaseRole) -> None:
        super().__init__(door, role)
        self._leases = leases

    due_deliveries = call(OutboxRole.due_deliveries)
    next_due_at = call(OutboxRole.next_due_at)
    record_attempts = write(OutboxRole.record_attempts)
    record_attempt = write(OutboxRole.record_attempt)
    pending_count = call(OutboxRole.pending_count)
    outbox_stats = call(OutboxRole.outbox_stats)
    save_rendered = call(OutboxRole.save_rendered)
    rendered_body = call(OutboxRole.rendered_body)

    async def prune_delivery_log(self, before: float, *, batch: int = 2000) -> tuple[int, int]:
        """:meth:`OutboxRole.prune_delivery_log`, one batch per call to the store's thread,
        so that the dispatcher's and poller's writes go in between. Returns (attempts,
        deliveries)."""
        attempts = deliveries = 0
        while True:
            a, d = await self._door.call(
                self._role.prune_delivery_log, before, batch=batch, rounds=1
            )
            attempts, deliveries = attempts + a, deliveries + d
            if a < batch and d < batch:
                return attempts, deliveries

    async def dispatch_round(
        self,
        records: Sequence[AttemptRecord],
        now: float,
        limit: int,
        busy: Iterable[tuple[str, str]],
        release: Iterable[tuple[str, str]] = (),
        caps: Mapping[str, int] | None = None,
    ) -> tuple[list[float | None], list[DueDelivery], float | None, ActiveEndpoints]:
        """One round of the dispatcher in ONE call to the store's thread: record
        ``records`` in one transaction (:meth:`OutboxRole.record_attempts`, committed before
        anything is read), then :meth:`OutboxRole.due_deliveries` (``now``, ``limit``,
        ``busy``) and, when fewer than ``limit`` are due, :meth:`OutboxRole.next_due_at`
        after ``now`` (else ``now``). Returns (failing_since per record, due deliveries,
        next due time, the active endpoints and the newest revision of a definition:
        :meth:`OutboxRole.active_revisions`). ``release``: keys handed out by the previous
        round and not started, whose claims go back first
        (:meth:`LeaseRole.release_delivery_claims`); ``caps``:
        per endpoint, at most that many (its free slots). With records, or for a replica
        (it claims what it reads), it is a write: a full disk is waited out (the batch is
        retried whole, nothing of it was committed)."""
        keys = set(busy)
        records = list(records)
        unclaim = list(release)
        outbox, leases = self._role, self._leases
        committed: list[list[float | None]] = []

        def work() -> tuple[
            list[float | None], list[DueDelivery], float | None, ActiveEndpoints
        ]:
            # Retried by write() after a failure: a batch already committed is not redone.
            if not committed:
                committed.append(outbox.record_attempts(records))
            failing = committed[0]
            if unclaim:
                leases.release_delivery_claims(unclaim)
            # Read once for both queries; the newest revision tells the dispatcher whether
            # endpoints created through the API changed (see Outbox.active_revisions).
            active = outbox.active_revisions()
            names = active.names
            due = outbox.due_deliveries(now, limit, keys, caps, active=names) if limit else []
            if limit > 0 and len(due) >= limit:
                return failing, due, now, active
            return failing, due, outbox.next_due_at(after=now, active=names), active

        # A replica sharing the store claims what it reads: a write.
        claiming = limit > 0 and leases.claims
        if records or (unclaim and not leases.exclusive) or claiming:
            return await self._door.write(work)
        return await self._door.call(work)
