"""The delivery loop: due deliveries become signed POSTs, each result is decided on and stored.

At most one attempt is in flight per (endpoint, session), so each consumer sees a session's
events in order while sessions and endpoints proceed in parallel, under a global and a
per-endpoint bound. :func:`sessionhook.relay.domain.retry.decide` turns each result into a
decision; a 410 or an endpoint failing for longer than its ``disable_after`` disables it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace

import anyio
import anyio.lowlevel
import httpx

from ..config import Config, EndpointConfig
from ..domain import render, retry
from ..domain.addresses import literal_refusal
from ..domain.retry import AttemptResult
from ..domain.rows import DueDelivery
from ..store import (
    QUEUED_ONLY_ABOVE,
    AsyncStore,
    AttemptRecord,
    Caps,
    EndpointQueries,
    Outbox,
    Round,
    StoreUnwritableError,
    store_failures,
)
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics
from .catalog import EndpointCatalog, Loaded
from .fence import SendFence
from .post import UrlGuard, literal_guard, post_event, refused
from .render_process import InlineRenderer, Renderer
from .reports import AttemptReporter, Finished
from .sender import HttpxPoster, Poster

_log = get_logger()


@dataclass(frozen=True)
class DeliverySettings:
    """The dispatcher's view of the config: delivery knobs and the endpoints by name."""

    retry_delays: tuple[float, ...]
    max_retry_after: float
    timeout: float
    body_limit: int
    concurrency: int
    per_endpoint: int
    allow_private_networks: bool
    endpoints: dict[str, EndpointConfig]
    #: Each endpoint's signing secrets, resolved once (not per delivery).
    secrets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Seconds a template render may take (enforced by a RenderProcess renderer).
    render_timeout: float = 5.0
    #: The relay's public base URL: action links under it render as buttons in the chat
    #: formats (``None``: no buttons).
    public_url: str | None = None

    @classmethod
    def from_config(cls, config: Config) -> DeliverySettings:
        """Settings from a loaded config."""
        d = config.delivery
        per_endpoint = _per_endpoint(d.concurrency, len(config.endpoints))
        return cls(
            retry_delays=tuple(d.retry_delays),
            max_retry_after=d.max_retry_after,
            timeout=d.timeout,
            body_limit=d.response_body_limit,
            concurrency=d.concurrency,
            per_endpoint=per_endpoint,
            allow_private_networks=d.allow_private_networks,
            render_timeout=d.render_timeout,
            public_url=config.actions.public_url if config.actions.enabled else None,
            endpoints={e.name: e for e in config.endpoints},
            secrets={
                e.name: tuple(secret.get_secret_value() for secret in e.secrets)
                for e in config.endpoints
            },
        )

    def with_endpoints(self, loaded: Loaded) -> DeliverySettings:
        """These settings with the endpoints created at run time ``loaded`` as well."""
        return self.changed(self, loaded, ()) if loaded else self

    def changed(self, base: DeliverySettings, put: Loaded, gone: Iterable[str]) -> DeliverySettings:
        """These settings (``base``'s, the config's) with the run-time endpoints ``put``
        added or replaced and those ``gone`` removed (a name of the config's stays the
        config's). The tables are updated in place unless they are still ``base``'s."""
        endpoints, secrets = self.endpoints, self.secrets
        if endpoints is base.endpoints:
            endpoints, secrets = dict(endpoints), dict(secrets)
        for name in gone:
            if name not in base.endpoints:
                endpoints.pop(name, None)
                secrets.pop(name, None)
        for name, (endpoint, signing) in put.items():
            if name not in base.endpoints:
                endpoints[name] = endpoint
                secrets[name] = signing
        return replace(
            self,
            endpoints=endpoints,
            secrets=secrets,
            per_endpoint=_per_endpoint(self.concurrency, len(endpoints)),
        )


def _per_endpoint(concurrency: int, endpoints: int) -> int:
    """One slow endpoint may take at most half the slots (at least one), so the others
    keep flowing; a lone endpoint still gets deliveries of many sessions in parallel."""
    return max(1, math.ceil(concurrency / 2)) if endpoints > 1 else concurrency


#: A delivery handed to an attempt worker, with its endpoint's config.
Handover = tuple[DueDelivery, EndpointConfig]


class Dispatcher:
    """The delivery loop; see the module docstring.

    ``http`` carries the webhooks (never the rate-limited upstream client). ``guard``
    checks each URL before every POST without DNS (default: :func:`literal_guard`);
    ``renderer`` makes formatted and templated bodies (default: inline).

    One round is ONE call into the store's thread: the attempts finished since the last
    round are recorded in one transaction, then the next due deliveries are read. An
    attempt is reported and its (endpoint, session) released only after that commit, so
    ``kill -9`` re-sends at most what was in flight. While the store cannot be written,
    nothing new starts.
    """

    def __init__(
        self,
        store: AsyncStore,
        http: Poster | httpx.AsyncClient,
        settings: DeliverySettings,
        *,
        metrics: Metrics | None = None,
        guard: UrlGuard | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        max_wait: float = 1.0,
        renderer: Renderer | None = None,
    ) -> None:
        self._store = store
        self._http: Poster = HttpxPoster(http) if isinstance(http, httpx.AsyncClient) else http
        #: The config's settings; :attr:`settings` adds the endpoints created at run time.
        self._base = settings
        self.settings = settings
        self._catalog = EndpointCatalog(store)
        self._reload_after = -math.inf
        self._reports = AttemptReporter(metrics)
        self._guard: UrlGuard = guard if guard is not None else literal_guard
        self._clock = clock
        self._renderer: Renderer = renderer if renderer is not None else InlineRenderer()
        #: Posts only while this replica's claims are sure to hold (see :mod:`.fence`).
        self.fence = SendFence(store.replica, clock)
        self._rng = rng if rng is not None else random.Random()
        self._max_wait = max_wait
        self._wake = anyio.Event()
        self._in_flight: set[tuple[str, str]] = set()
        #: Deliveries in flight per endpoint (those with none are not kept).
        self._per_endpoint: dict[str, int] = {}
        #: What _caps keeps of the settings it last saw.
        self._caps_of: DeliverySettings | None = None
        self._known: frozenset[str] = frozenset()
        self._rate_capped: tuple[str, ...] = ()  # the endpoints with a rate_limit
        self._finished: list[Finished] = []
        #: Handed out (and claimed) by the last round but not started: released next round.
        self._unstarted: list[tuple[str, str]] = []
        self._accepting = True
        self._settled = anyio.Event()  # set whenever attempts were committed
        self._next_due: float | None = None
        # rate_limit: when each endpoint may start next, on the loop's monotonic clock.
        self._rate_slots: dict[str, float] = {}
        #: Each endpoint config's Shape, by id (the config is kept: the id stays its own).
        self._shapes: dict[int, tuple[EndpointConfig, render.Shape]] = {}
        #: literal_guard's verdict per URL (see _literal_refusal).
        self._literals: dict[str, str | None] = {}
        #: Rounds made (store calls of the loop: benchmarks divide deliveries by it).
        self.rounds = 0
        #: Monotonic time the loop last went round (for the systemd watchdog).
        self.heartbeat = time.monotonic()

    def wake(self) -> None:
        """New deliveries were enqueued: look now rather than at the next due time."""
        self._wake.set()

    def update(self, settings: DeliverySettings) -> None:
        """Swap in new settings (a reload); deliveries in flight finish with the old ones."""
        self._base = settings
        self.settings = settings.with_endpoints(self._catalog.loaded)
        self.wake()

    async def _reload_endpoints(self, now: float) -> None:
        """Read the run-time endpoints again; a failing store keeps the ones held."""
        try:
            put, gone = await self._catalog.load(now)
        except store_failures() as exc:
            _log.warning("endpoint.reload_failed", error=str(exc).splitlines()[0], retry_in=1.0)
            self._reload_after = now + 1.0  # not every round while the store fails
            return
        self.settings = self.settings.changed(self._base, put, gone)
        self._wake.set()  # caps for the new ones: another round at once

    @property
    def in_flight(self) -> int:
        """Deliveries being attempted (or waiting for their commit) right now."""
        return len(self._in_flight)

    async def run(self) -> None:
        """Deliver until cancelled or :meth:`drain` is called."""
        try:
            async with anyio.create_task_group() as tg, self._workers(tg) as start:
                while self._accepting or self._in_flight:
                    # The round's store call is shielded: a cancel lands here. A full
                    # checkpoint lets answers ready meanwhile join this round (12 % fewer
                    # rounds on bench/throughput.py).
                    await anyio.lowlevel.checkpoint()
                    self._wake = anyio.Event()
                    progressed = await self._round(start)
                    self.heartbeat = time.monotonic()
                    if progressed:
                        continue  # there may be more due than slots were free
                    with anyio.move_on_after(self._wait_time()):
                        await self._wake.wait()
        finally:
            # Cancelled (stop after the drain bound): what finished is still recorded.
            with anyio.CancelScope(shield=True):
                await self._commit_finished()
            self._reports.summarize_successes(now=True)

    async def drain(self) -> None:
        """Stop starting deliveries and wait for the ones in flight (bound it yourself)."""
        self._accepting = False
        self.wake()
        while self._in_flight:
            self._settled = anyio.Event()
            await self._settled.wait()

    async def run_until_idle(self) -> int:
        """Deliver everything due now (retries that fall due meanwhile included); return
        the number of attempts made. For ``--once``."""
        attempts = 0
        try:
            async with anyio.create_task_group() as tg, self._workers(tg) as start:
                while True:
                    await anyio.lowlevel.checkpoint()  # see run(): cancellation lands here
                    self._wake = anyio.Event()
                    committed = len(self._finished)
                    progressed = await self._round(start)
                    attempts += committed
                    if progressed:
                        continue
                    # An endpoint held back by its rate_limit: its slot is waited for, so
                    # the pass sends its queue too (at most 1/rate longer than needed).
                    held = self._rate_hold()
                    if not self._in_flight and held == math.inf:
                        break
                    with anyio.move_on_after(min(self._max_wait, held)):
                        await self._wake.wait()
        finally:
            with anyio.CancelScope(shield=True):
                attempts += await self._commit_finished()
            self._reports.summarize_successes(now=True)
        return attempts

    def _wait_time(self) -> float:
        """Sleep after an idle round: until the next retry or rate slot, at most ``max_wait``."""
        wait = min(self._max_wait, self._rate_hold())
        if self._next_due is None:
            return wait
        return min(wait, max(0.0, self._next_due - self._clock()))

    def _rate_hold(self) -> float:
        """Seconds until the first endpoint held back by its ``rate_limit`` may start, or inf."""
        now = anyio.current_time()
        return min((at - now for at in self._rate_slots.values() if at > now), default=math.inf)

    @contextlib.asynccontextmanager
    async def _workers(
        self, tg: anyio.abc.TaskGroup
    ) -> AsyncIterator[Callable[[DueDelivery, EndpointConfig], None]]:
        """Reused attempt tasks (a new task per delivery cost ~30 us of CPU). Yields
        ``start(delivery, endpoint)``, which hands the delivery to an idle worker or starts
        one. Leaving ends idle workers; a delivery not yet picked up is released, unsent.

        The hand-over is a bare asyncio future per idle worker: anyio's memory stream cost
        about 10 us of the loop's CPU per delivery."""
        loop = asyncio.get_running_loop()
        idle: list[asyncio.Future[Handover | None]] = []  # one per waiting worker
        # Handed to a worker not running yet. A task cancelled before its first step never
        # runs a line, so its delivery stays here and is released when leaving.
        fresh: collections.deque[Handover] = collections.deque()

        async def worker() -> None:
            if not fresh:
                return
            job = fresh.popleft()
            while True:
                await self._deliver_one(*job)
                waiter: asyncio.Future[Handover | None] = loop.create_future()
                idle.append(waiter)
                try:
                    handed = await waiter
                except BaseException:
                    # Cancelled: a delivery handed over meanwhile was never sent.
                    if waiter in idle:
                        idle.remove(waiter)
                    elif waiter.done() and not waiter.cancelled():
                        taken = waiter.result()
                        if taken is not None:
                            self._release(taken[0])
                            self._settled.set()
                    raise
                if handed is None:
                    return
                job = handed

        def start(delivery: DueDelivery, endpoint: EndpointConfig) -> None:
            while idle:
                waiter = idle.pop()
                if not waiter.done():
                    waiter.set_result((delivery, endpoint))
                    return
            fresh.append((delivery, endpoint))
            tg.start_soon(worker)

        try:
            yield start
        finally:
            for waiter in idle:
                if not waiter.done():
                    waiter.set_result(None)  # nothing more: the worker ends
            idle.clear()
            while fresh:  # cancelled before a worker took them: never sent
                self._release(fresh.popleft()[0])
                self._settled.set()

    async def _round(self, start: Callable[[DueDelivery, EndpointConfig], None]) -> bool:
        """Commit what finished and start what is due; whether anything happened."""
        s = self.settings
        finished, self._finished = self._finished, []
        # Recorded in (endpoint, session) order: the store's lock order (no deadlock
        # between replicas writing the same queue heads).
        finished.sort(key=lambda f: f.delivery.key)
        done_keys = {f.delivery.key for f in finished}
        busy = self._in_flight - done_keys
        writable = self._store.unwritable is None
        # A full store could not record the attempts: send nothing new until it can.
        # Nor while this replica's heartbeat is late: its claims may pass to a rival.
        sending = self._accepting and writable and (not self.fence.active or self.fence.open())
        free = s.concurrency - len(busy) if sending else 0
        now = self._clock()
        records = [AttemptRecord(f.delivery.id, f.result, f.decision) for f in finished]
        self.rounds += 1
        # Shielded: the POSTs happened; their results are committed even during a stop.
        with anyio.CancelScope(shield=True):
            try:
                unstarted, self._unstarted = self._unstarted, []
                failing, due, self._next_due, active = await self._store.run(
                    Outbox.dispatch_round,
                    Round(
                        records,
                        now,
                        max(0, free),
                        busy,
                        unstarted,
                        self._caps(finished),
                        queued_only=len(s.endpoints) > QUEUED_ONLY_ABOVE,
                    ),
                )
            except StoreUnwritableError as exc:
                self._not_recorded(finished, exc)
                return bool(finished)
            await self._settle(finished, failing)
        if now >= self._reload_after and self._catalog.stale(active.revision, now):
            await self._reload_endpoints(now)
            s = self.settings
        started = 0
        full = {name for name, n in self._per_endpoint.items() if n >= s.per_endpoint}
        for delivery in due:
            key = delivery.key
            if key in self._in_flight:
                continue  # ours and in flight: its claim stays
            if started >= free or delivery.endpoint in full:
                self._unstarted.append(key)  # its claim goes back next round
                continue
            endpoint = s.endpoints.get(delivery.endpoint)
            if endpoint is None:
                self._unstarted.append(key)
                continue  # removed from the config by a reload; its rows wait for it
            # The one place a per-endpoint admission check belongs: the rate limit.
            if endpoint.rate_limit is not None and self._rate_limited(
                delivery.endpoint, anyio.current_time()
            ):
                self._unstarted.append(key)
                continue
            self._in_flight.add(key)
            count = self._per_endpoint.get(delivery.endpoint, 0) + 1
            self._per_endpoint[delivery.endpoint] = count
            if count >= s.per_endpoint:
                full.add(delivery.endpoint)
            start(delivery, endpoint)
            started += 1
        return bool(finished) or started > 0

    def _caps(self, finished: list[Finished]) -> Caps:
        """Per endpoint, how many deliveries could start now (at most one under a
        ``rate_limit``): the store claims no more, leaving the rest to other replicas.
        Worked out only for the endpoints with deliveries in flight or a rate limit; the
        others may start ``per_endpoint`` each."""
        s = self.settings
        if self._caps_of is not s:  # a new DeliverySettings with every change
            self._caps_of = s
            self._known = frozenset(s.endpoints)
            self._rate_capped = tuple(n for n, e in s.endpoints.items() if e.rate_limit is not None)
        done: dict[str, int] = {}
        for f in finished:
            done[f.delivery.endpoint] = done.get(f.delivery.endpoint, 0) + 1
        given: dict[str, int] = {}
        for name, flying in self._per_endpoint.items():
            if name in self._known:
                given[name] = max(0, s.per_endpoint - flying + done.get(name, 0))
        mono = anyio.current_time()  # the rate slots' clock
        for name in self._rate_capped:
            free = 1 if self._rate_slots.get(name, -math.inf) <= mono else 0
            given[name] = min(given.get(name, s.per_endpoint), free)
        return Caps(given, self._known, s.per_endpoint)

    async def _commit_finished(self) -> int:
        """Record the attempts that finished and were not committed yet; how many."""
        finished, self._finished = self._finished, []
        if not finished:
            return 0
        finished.sort(key=lambda f: f.delivery.key)  # the store's lock order (see _round)
        records = [AttemptRecord(f.delivery.id, f.result, f.decision) for f in finished]
        try:
            failing, _due, _next, _active = await self._store.run(
                Outbox.dispatch_round, Round(records, self._clock(), 0)
            )
        except StoreUnwritableError as exc:
            self._not_recorded(finished, exc)
            return 0
        await self._settle(finished, failing)
        return len(finished)

    def _not_recorded(self, finished: list[Finished], exc: StoreUnwritableError) -> None:
        """The store gave up (full disk): the deliveries stay open, sent again later."""
        for item in finished:
            _log.error(
                "delivery.not_recorded",
                endpoint=item.endpoint.name,
                event_id=item.delivery.event_id,
                status=item.result.status_code,
                error=str(exc),
                note="the store is not writable; the delivery stays open, sent again later",
            )
            self._release(item.delivery)
        if finished:
            self._settled.set()

    def _release(self, delivery: DueDelivery) -> None:
        self._in_flight.discard(delivery.key)
        left = self._per_endpoint.get(delivery.endpoint, 0) - 1
        if left > 0:
            self._per_endpoint[delivery.endpoint] = left
        else:  # only endpoints with deliveries in flight are kept (see _caps)
            self._per_endpoint.pop(delivery.endpoint, None)

    async def _settle(self, finished: list[Finished], failing: list[float | None]) -> None:
        """After the commit: report, disable endpoints failing too long, release the keys."""
        log, quiet = self._reports.batch_logger()
        self._reports.summarize_successes()  # the last second's, before this batch's lines
        for item, failing_since in zip(finished, failing, strict=True):
            self._reports.report(item, log, quiet)
            endpoint, now = item.endpoint, item.at
            # failing_since is None after a success; a 410 already disabled the endpoint.
            if (
                failing_since is not None
                and not isinstance(item.decision, retry.DisableEndpoint)
                and retry.should_disable(failing_since, now, endpoint.disable_after)
            ):
                reason = f"failing without a success for {endpoint.disable_after:g} s"
                with contextlib.suppress(StoreUnwritableError):  # at the next failure then
                    await self._store.run(
                        EndpointQueries.set_endpoint_enabled, endpoint.name, False, reason
                    )
                    self._reports.disabled(endpoint.name, reason, "failing")
            self._release(item.delivery)
        if finished:
            self._settled.set()

    async def _deliver_one(self, delivery: DueDelivery, endpoint: EndpointConfig) -> None:
        done = False
        try:
            if not self.fence.active:
                result, decision, now = await self._send(delivery, endpoint)
            elif not self.fence.open():
                return  # not sent: released below, its claim is taken again or lapses
            else:
                with self.fence.posting() as scope:
                    result, decision, now = await self._send(delivery, endpoint)
                if scope.cancelled_caught:
                    _log.warning(
                        "delivery.cut",
                        endpoint=endpoint.name,
                        event_id=delivery.event_id,
                        session=delivery.session_name,
                        note="this replica's heartbeat is late: the POST was cut before its "
                        "claim could pass to another replica; sent again, same webhook-id",
                    )
                    return
            self._finished.append(
                Finished(delivery, endpoint, delivery.attempts + 1, result, decision, now)
            )
            done = True
        finally:
            if not done:
                # Cancelled mid-POST (a stop): nothing to record, the row is retried later.
                self._release(delivery)
                self._settled.set()
            self._wake.set()

    async def attempt(self, delivery: DueDelivery) -> retry.Decision:
        """Make one attempt of ``delivery``, record it (its own commit), return the decision."""
        endpoint = self.settings.endpoints[delivery.endpoint]
        result, decision, now = await self._send(delivery, endpoint)
        item = Finished(delivery, endpoint, delivery.attempts + 1, result, decision, now)
        self._in_flight.add(delivery.key)
        self._per_endpoint[delivery.endpoint] = self._per_endpoint.get(delivery.endpoint, 0) + 1
        with anyio.CancelScope(shield=True):
            try:
                (failing,) = await self._store.run(
                    Outbox.record_attempts, [AttemptRecord(delivery.id, result, decision)]
                )
            except StoreUnwritableError as exc:
                self._not_recorded([item], exc)
                return decision
            await self._settle([item], [failing])
        return decision

    async def _send(
        self, delivery: DueDelivery, endpoint: EndpointConfig
    ) -> tuple[AttemptResult, retry.Decision, float]:
        """Check the URL, POST, decide; nothing is recorded here."""
        s = self.settings
        attempt_no = delivery.attempts + 1
        if self._guard is literal_guard:  # the default: pure, its verdict kept per URL
            refusal = self._literal_refusal(endpoint.url, s.allow_private_networks)
        else:
            refusal = await self._guard(endpoint.url, allow_private=s.allow_private_networks)
        shape = self._shape_of(endpoint)
        try:
            if delivery.attempts == 0 and shape.is_standard:  # most deliveries: as stored
                body, content_type = delivery.body, render.STANDARD_CONTENT_TYPE
            else:
                body, content_type = await self._body_for(delivery, endpoint)
        except render.RenderError as exc:
            body, content_type, refusal = b"", "", f"render failed: {exc}"
        if refusal is not None:
            result = AttemptResult(
                status_code=None,
                error=refusal if refusal.startswith("render failed") else refused(refusal),
                duration_ms=0.0,
                response_body="",
                retry_after=None,
                started_at=self._clock(),
            )
        else:
            result = await post_event(
                self._http,
                url=endpoint.url,
                secrets=s.secrets.get(endpoint.name)
                or [secret.get_secret_value() for secret in endpoint.secrets],
                event_id=delivery.event_id,
                body=body,
                timeout=s.timeout,
                body_limit=s.body_limit,
                now=self._clock,
                content_type=content_type,
            )
        now = self._clock()
        decision = retry.decide(
            attempt_no, result, s.retry_delays, now, self._rng, max_retry_after=s.max_retry_after
        )
        return result, decision, now

    async def _body_for(self, delivery: DueDelivery, endpoint: EndpointConfig) -> tuple[bytes, str]:
        """The bytes this delivery sends; a rendered body is saved with the first attempt,
        so every retry sends the same bytes whatever the config says by then."""
        if delivery.attempts > 0:
            saved = await self._store.run(Outbox.rendered_body, delivery.id)
            if saved is not None:
                return saved
        shape = self._shape_of(endpoint)
        if shape.is_standard:
            return delivery.body, render.STANDARD_CONTENT_TYPE
        body, content_type = await self._renderer.render(
            delivery.event_id, delivery.body, shape, time_budget=self.settings.render_timeout
        )
        await self._store.run(Outbox.save_rendered, delivery.id, body, content_type)
        return body, content_type

    def _literal_refusal(self, url: str, allow_private: bool) -> str | None:
        """What :func:`literal_guard` says of ``url``, remembered per URL."""
        if allow_private:
            return None
        if url not in self._literals:
            if len(self._literals) >= 1024:
                self._literals.clear()
            self._literals[url] = literal_refusal(url)
        return self._literals[url]

    def _shape_of(self, endpoint: EndpointConfig) -> render.Shape:
        """``endpoint.shape``, built once per endpoint config (not per delivery)."""
        cached = self._shapes.get(id(endpoint))
        if cached is not None and cached[0] is endpoint:
            return cached[1]
        if len(self._shapes) >= 256:  # configs replaced by reloads
            self._shapes.clear()
        shape = endpoint.shape
        if self.settings.public_url is not None and not shape.is_standard:
            shape = replace(shape, public_url=self.settings.public_url)
        self._shapes[id(endpoint)] = (endpoint, shape)
        return shape

    def _rate_limited(self, endpoint: str, now: float) -> bool:
        """Whether ``endpoint``'s ``rate_limit`` forbids a start at ``now`` (the loop's
        clock); if not, the slot is taken and the next is ``1/rate`` later (no burst)."""
        config = self.settings.endpoints.get(endpoint)
        if config is None or config.rate_limit is None:
            return False
        free_at = self._rate_slots.get(endpoint, -math.inf)
        if free_at > now:
            return True
        self._rate_slots[endpoint] = max(free_at, now) + 1.0 / config.rate_limit
        return False
