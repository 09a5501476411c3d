"""The operator layer: the queries and actions behind the CLI and the web console, once.

Every function takes the synchronous store (:class:`~sessionhook.relay.store.StoreCore`, the
operator's port: SQL stays in ``relay/store/``) and returns plain rows or figures; the CLI
renders them as tables or JSON, the console as pages. The daemon's web routes call them in
the store's worker thread: ``await astore.run(operator.deliveries, ...)``.

Failures the operator can fix (no such endpoint, delivery or event; a filter that selects
nothing) raise :class:`OperatorError`, one line meant to be shown as is.

Reads: :func:`status`, :func:`endpoints`, :func:`deliveries`, :func:`attempts`,
:func:`events`, :class:`Follower` (the stream's and ``events --follow``'s cursor read).
Actions: :func:`replay`, :func:`enable_endpoint`, :func:`disable_endpoint`,
:func:`test_endpoint` (a signed ``ping``, never archived; :func:`ping_poster`).
The store itself: :func:`operator_store` (the one the configuration names),
:func:`open_copy_side`, :func:`live_replicas`, :func:`copy_stores` (``store copy``). The
command line reaches the store only through this module (``.importlinter``).
"""

from __future__ import annotations

import fnmatch
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import httpx

from sessionhook.api.models import Session

from ...wording import counted
from ..config import Config, EndpointConfig
from ..delivery.post import post_event, refused
from ..delivery.render_process import Renderer, RenderProcess
from ..delivery.resolve import Resolver
from ..delivery.sender import AiohttpPoster, HttpxPoster, Poster
from ..domain import render
from ..domain.addresses import AddressPolicy, UnusableUrlError, destination, literal_refusal
from ..domain.delivery_states import DELIVERY_STATUSES
from ..domain.events import session_summary
from ..domain.retry import AttemptResult
from ..domain.rows import (
    AttemptRow,
    DeliveryRow,
    EndpointState,
    EventRow,
    StatusSummary,
)
from ..store import (
    HistoryProgress,
    ReplicaRow,
    Store,
    StoreCore,
    StoreError,
    StoreLockedError,
    StoreSettings,
    acquire_daemon_lock,
    copying,
    database_errors,
    open_store,
)
from ..store.copying import CopyError, CopyReport
from ..store.policy import write

__all__ = [
    "DELIVERY_STATUSES",
    "EVENT_DELIVERIES",
    "GAP_SETTLE",
    "PING_TYPE",
    "REPLAY_CHUNK",
    "CopyError",
    "CopyReport",
    "EventFilter",
    "EventPage",
    "Follower",
    "HistoryProgress",
    "OperatorError",
    "Overview",
    "ReplayResult",
    "ReplicaRow",
    "Resolver",
    "StoreCore",
    "StoreError",
    "StoreLockedError",
    "UnknownEndpointError",
    "acquire_daemon_lock",
    "attempts",
    "copy_stores",
    "database_errors",
    "deliveries",
    "disable_endpoint",
    "enable_endpoint",
    "enabled_line",
    "endpoints",
    "events",
    "find_endpoint",
    "live_replicas",
    "open_copy_side",
    "operator_store",
    "ping_event",
    "ping_poster",
    "replay",
    "resume_position",
    "status",
    "test_endpoint",
]

#: Events queued per replay transaction: short write locks next to a running daemon.
REPLAY_CHUNK: Final = 1000
#: Type of the event ``endpoints test`` sends (never archived, never retried).
PING_TYPE: Final = "ping"
#: At most this many deliveries of one event are shown by :func:`attempts`.
EVENT_DELIVERIES: Final = 1000


class OperatorError(Exception):
    """Something the operator asked for does not exist or cannot be done; ``str()`` is one
    line for the user, ``hint`` an optional next step."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UnknownEndpointError(OperatorError):
    """No endpoint of that name in the database: a mistyped name, the user's to fix (the
    command line exits 2 for it, as for any bad argument)."""


# --------------------------------------------------------------------------- reads


@dataclass(frozen=True, slots=True)
class Overview:
    """What ``sessionhook status`` and the console's overview show."""

    summary: StatusSummary
    history: HistoryProgress
    accounts: dict[str, int]
    #: The replicas sharing the store (running, or stopped within a day) and what each
    #: holds.
    replicas: tuple[ReplicaRow, ...] = ()


def status(store: StoreCore, now: float) -> Overview:
    """Endpoints, upstream, archive figures, the history walk, the accounts and the
    replicas at ``now``."""
    return Overview(
        store.operator.status_summary(now),
        store.economy.history_progress(now),
        store.economy.accounts_summary(),
        tuple(store.leases.replicas()),
    )


def in_flight(store: StoreCore, now: float, ids: Iterable[int]) -> dict[int, tuple[str, float]]:
    """Of the deliveries ``ids``, those a live replica is attempting: id -> (replica, since)."""
    return store.leases.delivery_claims(now, ids)


def endpoints_in_flight(store: StoreCore, now: float) -> dict[str, dict[str, int]]:
    """Per endpoint, the deliveries in flight on each live replica."""
    return store.leases.endpoint_claims(now)


def endpoints(store: StoreCore) -> list[tuple[EndpointState, int]]:
    """Every endpoint the store knows, with its number of open deliveries."""
    backlog = store.outbox.outbox_stats()
    return [(s, backlog.get(s.name, (0, None))[0]) for s in store.endpoints.endpoint_states()]


def find_endpoint(store: StoreCore, name: str) -> EndpointState:
    """The endpoint ``name`` (one row read, however many there are);
    :class:`UnknownEndpointError` naming the known ones otherwise."""
    state = store.endpoints.endpoint_state(name)
    if state is not None:
        return state
    known = _names_shown([state.name for state in store.endpoints.endpoint_states()])
    raise UnknownEndpointError(
        f"no endpoint named {_name_shown(name)} in the database (known: {known or 'none yet'})"
    )


#: A name a refusal quotes is cut here (no endpoint's name is longer: a 10 KB one names none).
_NAME_SHOWN = 80
#: A refusal lists this many known names at most.
_NAMES_SHOWN = 10


def _name_shown(name: str) -> str:
    return repr(name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "…")


def _names_shown(names: list[str]) -> str:
    more = len(names) - _NAMES_SHOWN
    return ", ".join(names[:_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


def deliveries(
    store: StoreCore,
    *,
    endpoint: str | None = None,
    status: str | None = None,
    session: str | None = None,
    limit: int = 100,
) -> list[DeliveryRow]:
    """The delivery log, newest first, filtered."""
    if status is not None and status not in DELIVERY_STATUSES:
        raise OperatorError(f"status must be one of {', '.join(DELIVERY_STATUSES)}")
    return store.operator.list_deliveries(endpoint, status, session, limit)


def attempts(
    store: StoreCore, target: str
) -> tuple[EventRow | None, list[tuple[DeliveryRow, list[AttemptRow]]]]:
    """Every attempt of one delivery (``12``, ``#12``) or of every delivery of one event
    (``evt_...``, the webhook-id): ``(event or None, [(delivery, attempts)])``."""
    key = target.strip().removeprefix("#")
    if key.isdigit():
        delivery = store.operator.get_delivery(int(key))
        if delivery is None:
            raise OperatorError(f"no delivery {key}", hint="see `sessionhook deliveries`")
        return None, [(delivery, store.operator.list_attempts(delivery.id))]
    event = store.operator.get_event(key)
    if event is None:
        raise OperatorError(
            f"no delivery or event {target!r}",
            hint="give a delivery id (see `sessionhook deliveries`) or an event id "
            "(evt_…, see `sessionhook events`)",
        )
    rows = store.operator.list_deliveries(event_id=key, limit=EVENT_DELIVERIES)
    return event, [
        (d, store.operator.list_attempts(d.id)) for d in sorted(rows, key=lambda d: d.id)
    ]


def events(
    store: StoreCore,
    *,
    session: str | None = None,
    type_glob: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int | None = None,
) -> Iterator[EventRow]:
    """Archived events in ingest order, streamed (never all in memory)."""
    rows = store.operator.iter_events(session, type_glob, since, until=until)
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            return
        yield row


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events a follower wants: any of ``types`` (fnmatch globs; none: all) and
    ``session``."""

    types: tuple[str, ...] = ()
    session: str | None = None

    def matches(self, event_type: str) -> bool:
        """Whether an event of ``event_type`` passes the type globs (pure)."""
        return not self.types or any(fnmatch.fnmatchcase(event_type, g) for g in self.types)


@dataclass(frozen=True, slots=True)
class EventPage:
    """One cursor read: the events that passed the filter, the new position (past every
    row accepted, matching or not, so a rare type never rescans), and whether more rows are
    waiting (read again at once)."""

    events: list[EventRow]
    cursor: int
    more: bool


#: Seconds a hole in the events' order may stay open before a follower moves past it.
GAP_SETTLE: Final = 5.0


class Follower:
    """Reads the events after a position, in the events table's order, for the event stream
    and ``events --follow``: :meth:`read` again and again.

    Nothing missed: on PostgreSQL ``seq`` values are taken when a row is inserted but become
    visible when its transaction commits, so a reader can see 12 while 11 is still being
    written (several ingests at once, or several relays). A follower therefore stops at a
    hole in ``seq`` and reads again, until the hole fills or has stayed open for ``settle``
    seconds (a value a rolled-back or conflicting insert consumed never appears; SQLite
    leaves no holes). Filters are applied here, never in SQL, so holes stay visible.
    """

    def __init__(
        self,
        start: int,
        wanted: EventFilter,
        *,
        settle: float = GAP_SETTLE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: The position: the last event accepted (sent, or skipped by the filter).
        self.cursor = start
        self.wanted = wanted
        self._settle = settle
        self._clock = clock
        #: First seen, for each hole still ahead: where it starts -> when.
        self._holes: dict[int, float] = {}
        #: The largest body of the last read (bytes).
        self._largest = 0

    def read(
        self, store: StoreCore, *, limit: int = 100, max_bytes: int | None = None
    ) -> EventPage:
        """The next events (runs in the store's thread; one caller at a time): at most
        ``limit``, and with ``max_bytes`` no more once their bodies add up to it (one at
        least). ``more`` says whether a next read may find more at once."""
        if max_bytes is not None and self._largest:
            # PostgreSQL's driver fetches a whole result at once: ask for about as many
            # rows as the last read's largest body says fit.
            limit = max(1, min(limit, max_bytes // self._largest))
        rows = store.operator.events_after(self.cursor, limit=limit, max_bytes=max_bytes)
        full = len(rows) == limit
        if rows and max_bytes is not None:
            self._largest = max(len(r.body) for r in rows)
            full = full or sum(len(r.body) for r in rows) >= max_bytes
        accepted: list[EventRow] = []
        now = self._clock()
        for row in rows:
            if row.seq != self.cursor + 1:
                seen = self._holes.setdefault(self.cursor + 1, now)
                if now - seen < self._settle:
                    # Every hole of this read starts its clock now: they settle together.
                    self._note_holes(rows, now)
                    return EventPage(accepted, self.cursor, False)
            self.cursor = row.seq
            if self.wanted.matches(row.type) and self.wanted.session in (None, row.session_name):
                accepted.append(row)
        self._holes = {k: v for k, v in self._holes.items() if k > self.cursor}
        return EventPage(accepted, self.cursor, full)

    def _note_holes(self, rows: list[EventRow], now: float) -> None:
        previous = self.cursor
        for row in rows:
            if row.seq > previous + 1:
                self._holes.setdefault(previous + 1, now)
            previous = max(previous, row.seq)
        self._holes = {k: v for k, v in self._holes.items() if k > self.cursor}


def resume_position(store: StoreCore, event_id: str | None) -> int:
    """Where a follower starts: right after the event ``event_id`` (a webhook-id), or after
    the newest event when ``None``. An unknown id is an :class:`OperatorError`, never a
    silent restart from somewhere else."""
    if event_id is None:
        return store.operator.last_event_seq()
    seq = store.operator.event_seq(event_id)
    if seq is None:
        raise OperatorError(f"unknown event id {event_id!r}: no such event in the archive")
    return seq


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """How many deliveries a replay queued, and the endpoint's state (a disabled one
    sends them once enabled)."""

    queued: int
    endpoint: EndpointState
    #: Why nothing was queued (``None`` when something was).
    reason: str | None = None


@write
def replay(
    store: StoreCore,
    endpoint: str,
    *,
    event_ids: tuple[str, ...] | list[str] = (),
    since: float | None = None,
    until: float | None = None,
    type_glob: str | None = None,
    session: str | None = None,
    on_progress: Callable[[int], None] = lambda n: None,
    chunk: int = REPLAY_CHUNK,
) -> ReplayResult:
    """Deliver archived events again to ``endpoint``: same webhook-id and body, new attempts.

    Either ``event_ids`` or a time range (``since``, optional ``until``); ``type_glob`` and
    ``session`` narrow either. A range is read and queued ``chunk`` events at a time, each
    chunk in its own short transaction, so a replay of a million events neither sits in
    memory nor holds the write lock long enough to stall the daemon. Events the endpoint
    does not subscribe to, or already on their way, are not queued.
    """
    if bool(event_ids) == (since is not None):
        raise OperatorError("give either a start time (and an optional end) or event ids")
    if until is not None and since is None:
        raise OperatorError("an end time needs a start time")
    state = find_endpoint(store, endpoint)
    if event_ids:
        missing = [i for i in event_ids if store.operator.get_event(i) is None]
        if missing:
            raise OperatorError(f"no archived event {', '.join(missing)}")
        queued = store.operator.replay(
            endpoint, event_ids=list(event_ids), type_glob=type_glob, session=session
        )
        on_progress(queued)
        why = None if queued else _replay_none(store, endpoint, event_ids, None, None, session)
        return ReplayResult(queued, state, why)
    total, cursor = 0, 0
    while True:
        page = store.operator.event_ids_after(
            cursor, session=session, since=since, until=until, limit=chunk
        )
        if not page:
            why = None if total else _replay_none(store, endpoint, (), since, until, session)
            return ReplayResult(total, state, why)
        cursor = page[-1][0]
        ids = [
            i for _seq, i, kind in page if type_glob is None or fnmatch.fnmatchcase(kind, type_glob)
        ]
        if ids:
            queued = store.operator.replay(endpoint, event_ids=ids)
            total += queued
            on_progress(queued)


def _replay_none(
    store: StoreCore,
    endpoint: str,
    event_ids: tuple[str, ...] | list[str],
    since: float | None,
    until: float | None,
    session: str | None,
) -> str:
    """Why a replay queued nothing, in one line."""
    selected, on_way = store.operator.replay_census(
        endpoint,
        since=since,
        until=until,
        event_ids=list(event_ids) if event_ids else None,
        session=session,
    )
    if selected == 0:
        where = f" of {session}" if session else ""
        return f"no archived event{where} in that range" if not event_ids else "no such event"
    if on_way == selected:
        if selected == 1:
            return (
                f"the event selected is on its way to {endpoint} already (an open delivery): "
                "if it failed, send it now with `sessionhook deliveries recover --endpoint "
                f"{endpoint} --since TIME` or `deliveries retry ID`"
            )
        return (
            f"the {selected} events selected are on their way to {endpoint} already (an open "
            "delivery each): send the failed ones now with `sessionhook deliveries recover "
            f"--endpoint {endpoint} --since TIME` or `deliveries retry ID`"
        )
    if on_way == 0:
        return (
            f"the {'event' if selected == 1 else f'{selected} events'} selected "
            f"{'is' if selected == 1 else 'are'} of types {endpoint} does not subscribe to "
            "(or fail its filter or --type)"
        )
    return (
        f"of the {selected} events selected, {on_way} {'is' if on_way == 1 else 'are'} on "
        f"{'its' if on_way == 1 else 'their'} way already and the others are of types "
        f"{endpoint} does not subscribe to (or fail its filter or --type)"
    )


@write
def enable_endpoint(store: StoreCore, name: str) -> int:
    """Enable ``name`` again and make what waits for it due now (a retry scheduled while
    it failed goes at once); returns how many deliveries wait for it."""
    find_endpoint(store, name)
    store.endpoints.set_endpoint_enabled(name, True)
    store.operator.make_due(name)
    return store.outbox.pending_count(name)


def enabled_line(name: str, waiting: int) -> str:
    """What the CLI and the console say after :func:`enable_endpoint`."""
    return f"endpoint {name} enabled; {counted(waiting, 'delivery')} waiting"


@write
def disable_endpoint(store: StoreCore, name: str, reason: str = "disabled by an operator") -> None:
    """Stop delivering to ``name``; its events keep being archived (replay them later)."""
    find_endpoint(store, name)
    store.endpoints.set_endpoint_enabled(name, False, reason)


def ping_event(endpoint: str, now: float) -> tuple[str, bytes]:
    """A fresh ``(event id, body)`` for an endpoint test: never archived, unique id.

    The body has the envelope of every event (``type``, ``timestamp``, ``data.session``),
    with an empty session, so that a consumer written against the documented shape does
    not fail on the ping itself and the answer reflects its reachability and signature
    check; ``type`` is ``ping``, which a consumer can acknowledge and ignore.
    """
    event_id = "evt_" + secrets.token_hex(16)
    body: dict[str, Any] = {
        "type": PING_TYPE,
        "timestamp": datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z"),
        "data": {
            "session": session_summary(Session(name="")),
            "endpoint": endpoint,
            "message": "sessionhook endpoints test",
        },
    }
    return event_id, json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


async def test_endpoint(
    config: Config,
    name: str,
    *,
    poster: Poster,
    now: float,
    endpoint: EndpointConfig | None = None,
    policy: AddressPolicy | None = None,
    renderer: Renderer | None = None,
) -> tuple[str, AttemptResult]:
    """POST a signed ``ping`` to the configured endpoint ``name`` (its secrets, its
    payload/format/template) through ``poster`` (the daemon's: :func:`ping_poster`);
    returns the ping's webhook-id and the answer. Never archived, never retried.
    ``endpoint``: one created at run time (:func:`.endpoint_edits.endpoint_config`).
    ``renderer``: the daemon's; by default a template renders in a child process of its
    own, as a delivery's does (``delivery.render_timeout``).

    A URL the address rules refuse without DNS (its host, once normalized, private or not
    plain: :func:`~sessionhook.relay.domain.addresses.literal_refusal` with ``policy``) is
    an :class:`OperatorError` and nothing is sent; a name resolving to a refused address
    is a failed attempt, as for a delivery."""
    if endpoint is None:
        endpoint = config.endpoint_by_name(name)
    if endpoint is None:
        known = _names_shown([e.name for e in config.endpoints]) or "none"
        raise OperatorError(f"no endpoint named {_name_shown(name)} in the config (known: {known})")
    try:
        destination(endpoint.url)
    except UnusableUrlError as exc:
        raise OperatorError(f"{name}: refused: {exc.reason}") from None
    if not config.delivery.allow_private_networks:
        reason = literal_refusal(endpoint.url, policy=policy)
        if reason is not None:
            raise OperatorError(f"{name}: {refused(reason)}")
    event_id, body = ping_event(name, now)
    own = RenderProcess()  # starts a child only if it renders
    try:
        # Shaped like the endpoint's deliveries: a chat webhook gets a chat message.
        body, content_type = await (renderer or own).render(
            event_id, body, endpoint.shape, time_budget=config.delivery.render_timeout
        )
    except render.RenderError as exc:
        raise OperatorError(f"{name}: the ping does not render: {exc}") from None
    finally:
        await own.aclose()
    # The one place that signs and POSTs, shared with the dispatcher.
    result = await post_event(
        poster,
        url=endpoint.url,
        secrets=[s.get_secret_value() for s in endpoint.secrets],
        event_id=event_id,
        body=body,
        timeout=config.delivery.timeout,
        body_limit=config.delivery.response_body_limit,
        content_type=content_type,
    )
    return event_id, result


@asynccontextmanager
async def ping_poster(
    config: Config,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    resolve: Resolver | None = None,
    policy: AddressPolicy | None = None,
) -> AsyncIterator[Poster]:
    """The poster :func:`test_endpoint` sends through outside the daemon: the daemon's
    (aiohttp, each name resolved once and every address vetted, the connection made to a
    vetted one; ``resolve`` and ``policy`` replace DNS and the address judgement), or an
    httpx client on ``transport`` (a stand-in for the network), closed at the end."""
    if transport is not None:
        async with httpx.AsyncClient(transport=transport, follow_redirects=False) as http:
            yield HttpxPoster(http)
        return
    poster = AiohttpPoster(
        allow_private=config.delivery.allow_private_networks, resolve=resolve, policy=policy
    )
    try:
        yield poster
    finally:
        await poster.aclose()


# --------------------------------------------------------------------------- the store


def operator_store(settings: StoreSettings, *, readonly: bool = False) -> StoreCore:
    """The store ``settings`` name, for an operator's command: read-only for a read (safe
    while the daemon runs), writable for an action (short transactions that the daemon's
    busy timeout waits out). Raises :class:`StoreError` as :func:`~.store.open_store`."""
    return open_store(settings, readonly=readonly)


def open_copy_side(spec: str, *, writable: bool) -> StoreCore:
    """The store at ``spec`` (a SQLite path or a ``postgresql://`` URL) for ``store copy``:
    read-only for the source, opened (created and migrated) for the target."""
    if spec.startswith(("postgresql://", "postgres://")):
        from ..store.postgres import PostgresStore  # psycopg: loaded for PostgreSQL only

        return PostgresStore.open(spec) if writable else PostgresStore.open_readonly(spec)
    path = Path(spec).expanduser()
    return Store.open(path) if writable else Store.open_readonly(path)


def live_replicas(store: StoreCore, now: float) -> list[ReplicaRow]:
    """The replicas running on ``store`` at ``now`` (heartbeat within their lease): a store
    that has one is live, and ``store copy`` refuses it."""
    return [r for r in store.leases.replicas() if r.alive(now)]


def copy_stores(
    source: StoreCore,
    target: StoreCore,
    *,
    replace: bool = False,
    progress: Callable[[str, int, int], None] = lambda table, done, total: None,
) -> CopyReport:
    """Every row of ``source`` into ``target``, ids kept (:func:`~.store.copying.copy_store`,
    which raises :class:`CopyError` for a target that is not empty, or an incomplete copy)."""
    return copying.copy_store(source.copy, target.copy, replace=replace, progress=progress)
