"""The poller against the emulator, in process: one fake clock drives both the emulator's
agent and the poller's schedule, over a real store (:class:`PollerHarness`); a transport
that rewrites the emulator's answers (:class:`Rewrite`); rounds until sessions finished
and were archived (:func:`finish`)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
from pydantic import SecretStr

from sessionhook.api import RetryPolicy
from sessionhook.api.client import SessionsClient
from sessionhook.emulator.app import create_app
from sessionhook.relay.config import EndpointConfig
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.polling import Poller, PollSettings
from sessionhook.relay.polling.budget import LimitedTransport, RateLimiter
from sessionhook.relay.store import AsyncStore, EndpointQueries
from sessionhook.relay.telemetry.metrics import Metrics
from tests.support.clock import Clock

T = TypeVar("T")
#: The endpoint's secret (its deliveries are queued, never sent).
SECRET_TEXT = SecretStr(generate_secret())
#: Seconds of the emulator's clock after which a session is COMPLETED.
SETTLED_AFTER = 600.0


class PollerHarness:
    """Emulator + poller + store on one fake clock; counts upstream requests by label.

    ``wrap`` puts a transport of the test's between the poller's client and the emulator
    (it gets the inner transport; :meth:`transport` gives it back by its type).
    ``monotonic`` drives the poller's schedule instead of the fake clock (a test on
    ``tests/support/virtual_time.py`` passes its loop's time)."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        create_time_filter: str = "exclusive",
        backfill: bool = True,
        wrap: Callable[[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport] | None = None,
        api_key: str = "k",
        monotonic: Callable[[], float] | None = None,
        **settings: Any,
    ) -> None:
        self.clock = Clock(1_750_000_000.0)
        self._monotonic = monotonic or self.clock
        self.emulator = create_app(
            api_keys=("k",),
            step_delay=1.0,
            seed=7,
            create_time_filter=create_time_filter,
            clock=self.clock,
        )
        self.requests: list[tuple[str, int | None]] = []
        transport: httpx.AsyncBaseTransport = httpx.ASGITransport(self.emulator)
        if wrap is not None:
            transport = wrap(transport)
        #: What ``wrap`` made (the emulator's own transport without one).
        self.wrapper = transport
        limited = LimitedTransport(transport, RateLimiter(100_000), record=self._record)
        self._http = httpx.AsyncClient(transport=limited)
        self._api_http = httpx.AsyncClient(transport=httpx.ASGITransport(self.emulator))
        retry = RetryPolicy(max_attempts=1)
        self.client = SessionsClient(
            self._http, base_url="http://emu.test", api_key=api_key, retry=retry
        )
        #: An uncounted client for the test's own calls (create, message...).
        self.api = SessionsClient(self._api_http, base_url="http://emu.test", api_key="k")
        self.enqueued = 0
        #: Set at each enqueue (a delivery queued: the dispatcher woken).
        self.enqueued_event = anyio.Event()
        self.metrics = Metrics()
        self._settings = PollSettings(
            **{"active_interval": 1.0, "idle_interval": 5.0, "discovery_interval": 2.0} | settings,
            backfill=backfill,
        )
        self._tmp = tmp_path

    async def __aenter__(self) -> PollerHarness:
        self.store = await AsyncStore.open(self._tmp / "relay.db", clock=self.clock)
        await self.store.run(
            EndpointQueries.sync_endpoints,
            [EndpointConfig(name="ep", url="https://e.example/h", secret=SECRET_TEXT)],
        )
        self.poller = Poller(
            self.client,
            self.store,
            self._settings,
            on_enqueued=self._enqueued,
            clock=self.clock,
            monotonic=self._monotonic,
            rng=random.Random(0),
            metrics=self.metrics,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.store.close()
        await self._http.aclose()
        await self._api_http.aclose()

    def _enqueued(self) -> None:
        self.enqueued += 1
        self.enqueued_event.set()

    async def _record(self, label: str, status: int | None) -> None:
        self.requests.append((label, status))

    def transport(self, kind: type[T]) -> T:
        """The transport ``wrap`` made, which is a ``kind``."""
        assert isinstance(self.wrapper, kind), self.wrapper
        return self.wrapper

    def count(self, label: str) -> int:
        return sum(1 for got, _ in self.requests if got == label)

    async def round(self, seconds: float = 1.0) -> dict[str, str]:
        """Advance the clock, run discovery and every due poll once."""
        self.clock.now += seconds
        await self.poller.discover()
        return await self.poller.poll_due()

    async def upstream_activities(self, session: str) -> list[str]:
        return [a.name async for a in self.api.iter_activities(session)]

    def archived(self, session: str | None = None) -> list[str]:
        return [
            e.activity_name
            for e in self.store.store.operator.iter_events(session=session)
            if e.activity_name is not None
        ]


async def finish(h: PollerHarness, *names: str, rounds: int = 40) -> None:
    """Rounds until every session is COMPLETED upstream and its activities archived."""
    for _ in range(rounds):
        await h.round()
        done = True
        for name in names:
            session = await h.api.get_session(name)
            upstream = await h.upstream_activities(name)
            if session.state != "COMPLETED" or sorted(h.archived(name)) != sorted(upstream):
                done = False
        if done:
            return
    raise AssertionError("sessions did not finish and archive within the rounds")


class Rewrite(httpx.AsyncBaseTransport):
    """Passes every request on; the JSON answers :meth:`edit` takes are changed by it."""

    def __init__(self) -> None:
        self._inner: httpx.AsyncBaseTransport | None = None  # set by harness()
        self.edited: list[str] = []  # what each edit changed

    def edit(self, request: httpx.Request, body: dict[str, Any]) -> bool:
        raise NotImplementedError

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert self._inner is not None
        response = await self._inner.handle_async_request(request)
        if request.method != "GET" or response.status_code != 200:
            return response
        body = json.loads(await response.aread())
        if not self.edit(request, body):
            return response
        headers = [(k, v) for k, v in response.headers.items() if k != "content-length"]
        return httpx.Response(response.status_code, json=body, headers=headers)

    def harness(self, tmp_path: Path, **settings: Any) -> PollerHarness:
        """A :class:`PollerHarness` whose relay client goes through this rewrite
        (``settings``: the poller's, as :class:`PollerHarness` takes them)."""

        def wrap(inner: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
            self._inner = inner
            return self

        return PollerHarness(tmp_path, wrap=wrap, **settings)


async def settled(h: PollerHarness, prompt: str) -> str:
    """A session with a pull request that completed before the relay looked."""
    source = (await h.api.list_sources()).sources[0].name
    session = await h.api.create_session(prompt, source=source, automation_mode="AUTO_CREATE_PR")
    h.clock.now += SETTLED_AFTER
    done = await h.api.get_session(session.name)
    assert done.state == "COMPLETED" and done.outputs
    return session.name
