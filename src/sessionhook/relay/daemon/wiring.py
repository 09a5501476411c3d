"""The daemon's wiring: on an open store, the HTTP clients, one poller per account and the
dispatcher (:class:`Wiring`), closed again when the daemon stops.

It registers this process as a replica (docs/replicas.md), gives each account its own
rate-limited, counted upstream client, and sends webhooks through aiohttp. The
:class:`~.daemon.Daemon` arguments that replace the network arrive as :class:`Seams`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import anyio
import httpx

from sessionhook.api import RetryPolicy
from sessionhook.api.client import SessionsClient

from .. import ops as operator
from .. import web
from ..config import EndpointConfig
from ..delivery.dispatcher import DeliverySettings, Dispatcher
from ..delivery.post import UrlGuard
from ..delivery.render_process import RenderProcess
from ..delivery.resolve import Resolver
from ..delivery.sender import AiohttpPoster, HttpxPoster, Poster
from ..domain.addresses import AddressPolicy
from ..domain.replica import Replica, dead_replicas, pid_alive
from ..domain.retry import AttemptResult
from ..ops import endpoint_edits as edits
from ..ops import trigger
from ..polling import Poller
from ..polling.budget import LimitedTransport, RateLimiter
from ..store import AsyncStore, Leases, store_failures
from ..telemetry.logs import get_logger
from .state import DaemonState
from .upstream import UpstreamCounter

_log = get_logger()


@dataclass(frozen=True)
class Seams:
    """What tests, the demo and the bench put in place of the network (``None``: the real one)."""

    upstream_transport: httpx.AsyncBaseTransport | None = None
    delivery_transport: httpx.AsyncBaseTransport | None = None
    guard: UrlGuard | None = None
    resolve: Resolver | None = None
    address_policy: AddressPolicy | None = None


class Wiring:
    """Builds the daemon's working parts on an open store and closes them (see the module
    docstring); :meth:`open` publishes them in the shared :class:`~.state.DaemonState`."""

    def __init__(
        self,
        state: DaemonState,
        seams: Seams,
        upstream: UpstreamCounter,
        *,
        replica: Replica,
        bell: web.Bell,
    ) -> None:
        self._state = state
        self._seams = seams
        self._upstream = upstream
        self._replica = replica
        self._bell = bell
        #: The webhook sender while the store is open: deliveries and test pings share it.
        self._delivery: Poster | None = None
        #: Templates render in child processes, killed at delivery.render_timeout: the
        #: deliveries' and the test pings' (children start when a template renders).
        self._renderer = RenderProcess()

    @asynccontextmanager
    async def open(self, store: AsyncStore) -> AsyncIterator[tuple[list[Poller], Dispatcher]]:
        """Build the HTTP clients, pollers and dispatcher on an open store; close all after."""
        state, seams = self._state, self._seams
        config = state.config
        state.store = store
        # SQLite: the daemon lock says this replica is alone (see AsyncStore.exclusive).
        alone = store.exclusive
        await store.run(
            Leases.register_replica,
            self._replica.id,
            host=self._replica.host,
            pid=self._replica.pid,
            now=state.clock(),
            lease=config.store.lease,
            exclusive=alone,
        )
        _log.info("replica.registered", replica=self._replica.label, lease=config.store.lease)
        # A replica that is certainly dead (alone: every other one; any backend: a pid of
        # this host that is gone) gives its claims back now, not when its lease runs out:
        # a restart after kill -9 resumes at once.
        rows = await store.run(Leases.replicas)
        dead = dead_replicas(rows, self._replica, alone=alone, pid_alive=pid_alive)
        if dead:
            await store.run(Leases.reap_replicas, dead, state.clock())
            _log.info("replica.reaped", replicas=dead, reason="alone" if alone else "pid gone")
        accounts = config.upstream_accounts()
        inner = seams.upstream_transport or httpx.AsyncHTTPTransport()
        # One HTTP client per account, each with its own budget. The client takes the
        # grant before each attempt (waiting for budget is not a slow upstream), so the
        # transport only counts, a 2xx once the client parsed it (settle).
        limiters = [
            RateLimiter(
                account.requests_per_minute,
                shared_window=self._upstream.budget_window(store, account),
            )
            for account in accounts
        ]
        counted = [
            LimitedTransport(inner, None, record=self._upstream.record, settle_success=True)
            for _ in accounts
        ]
        upstreams = [httpx.AsyncClient(transport=transport) for transport in counted]
        # Webhooks go out through aiohttp (sender.py says why); a test's or the demo's
        # transport (ASGI, mock) through httpx.
        delivery: Poster = (
            HttpxPoster(
                httpx.AsyncClient(transport=seams.delivery_transport, follow_redirects=False)
            )
            if seams.delivery_transport is not None
            else AiohttpPoster(
                allow_private=config.delivery.allow_private_networks,
                resolve=seams.resolve,
                policy=seams.address_policy,
            )
        )
        self._delivery = delivery
        renderer = self._renderer
        try:
            dispatcher = state.dispatcher = Dispatcher(
                store,
                delivery,
                DeliverySettings.from_config(config),
                metrics=state.metrics,
                guard=seams.guard,
                clock=state.clock,
                renderer=renderer,
            )
            state.pollers = [
                Poller(
                    SessionsClient(
                        upstream,
                        base_url=account.base_url,
                        api_key=account.api_key.get_secret_value(),
                        api_key_header=account.api_key_header,
                        timeout=config.api.timeout,
                        max_response_bytes=config.api.max_response_bytes,
                        gate=limiter.acquire,
                        retry=RetryPolicy(max_attempts=1),
                        on_answer=transport.settle,
                    ),
                    store,
                    replace(state.poll_settings, requests_per_minute=account.requests_per_minute),
                    on_enqueued=dispatcher.wake,
                    on_ingested=self._bell.ring,
                    metrics=state.metrics,
                    clock=state.clock,
                    account=account.name,
                )
                for account, upstream, transport, limiter in zip(
                    accounts, upstreams, counted, limiters, strict=True
                )
            ]
            yield state.pollers, dispatcher
        finally:
            with anyio.CancelScope(shield=True):
                # A clean stop frees every claim at once: nobody waits for a lease.
                try:
                    await store.run(Leases.retire_replica, state.clock())
                except store_failures() as exc:
                    _log.warning("replica.retire_failed", error=str(exc))
                for upstream in upstreams:
                    await upstream.aclose()
                self._delivery = None
                await delivery.aclose()
                await renderer.aclose()
                if isinstance(delivery, HttpxPoster):
                    await delivery.http.aclose()
                # Out of the web routes' sight first: a stream or a page that comes now
                # reads nothing, rather than a store closing under it.
                state.store = None
                await store.close()

    async def send_test_event(self, name: str) -> AttemptResult:
        """Send endpoint ``name`` a signed ``ping`` now through the deliveries' own sender (its
        URL and addresses judged as theirs); never archived, never retried.
        :class:`~.operator.OperatorError` for an unknown name or a refused URL."""
        now = self._state.clock()
        endpoint = await self._endpoint(name, now)
        async with self._poster() as poster:
            _event_id, result = await operator.test_endpoint(
                self._state.config,
                name,
                poster=poster,
                now=now,
                endpoint=endpoint,
                policy=self._seams.address_policy,
                renderer=self._renderer,
            )
        return result

    async def send_sample_event(
        self, name: str, event_type: str, session: str | None
    ) -> tuple[str, AttemptResult]:
        """Send endpoint ``name`` a signed sample of ``event_type`` now (``trigger``), as its
        delivery would be, through the deliveries' own sender; ``session`` makes it from an
        archived session's data. Never archived, retried or counted as a delivery."""
        state, now = self._state, self._state.clock()
        endpoint = await self._endpoint(name, now)
        real = None
        if session is not None:
            if state.store is None:
                raise operator.OperatorError("the store is not open yet: try again in a moment")
            real = await state.store.run(trigger.archived_session, session)
        links_of = state.poll_settings.action_links
        async with self._poster() as poster:
            return await trigger.trigger_endpoint(
                state.config,
                name,
                event_type,
                poster=poster,
                now=now,
                links=links_of() if links_of is not None else None,
                endpoint=endpoint,
                session=real,
                renderer=self._renderer,
                policy=self._seams.address_policy,
            )

    async def _endpoint(self, name: str, now: float) -> EndpointConfig | None:
        """The endpoint ``name`` of the config, else one created at run time (or ``None``)."""
        state = self._state
        endpoint = state.config.endpoint_by_name(name)
        if endpoint is None and state.store is not None:  # one created at run time
            endpoint = await state.store.run(edits.endpoint_config, state.config, name, now)
        return endpoint

    @asynccontextmanager
    async def _poster(self) -> AsyncIterator[Poster]:
        """The deliveries' sender; before the store opens (the listener serves meanwhile),
        a sender of its own."""
        if self._delivery is not None:
            yield self._delivery
            return
        seams = self._seams
        async with operator.ping_poster(
            self._state.config,
            transport=seams.delivery_transport,
            resolve=seams.resolve,
            policy=seams.address_policy,
        ) as poster:
            yield poster
