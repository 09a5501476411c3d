"""The poller: one account's collaborators composed, run as loops or as one pass.

:class:`Poller` builds the collaborators around one shared :class:`~.state.PollState`, each
given the peers it calls, and runs their loops under the account's
:class:`~.lease.PollerLease`. docs/polling.md ("Inside the poller") maps them.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

import anyio

from sessionhook.api.client import SessionsClient
from sessionhook.api.errors import ApiError, UnauthenticatedError
from sessionhook.api.models import Session

from ..config import DEFAULT_ACCOUNT
from ..store import AsyncStore
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics
from .archive import Archive
from .discovery import Discovery
from .failures import Failures
from .history import HistoryWalk
from .lease import PollerLease
from .scheduling import Scheduler
from .screening import SessionScreen
from .session_poll import SessionPoll
from .settings import OnceReport, PollSettings
from .state import PollState, Tracked

_log = get_logger()


class Poller:
    """Discovery plus the per-session scheduler; see the package docstring.

    ``on_enqueued`` wakes the dispatcher, ``on_ingested`` the event streams. ``clock``
    (wall), ``monotonic`` (the schedule) and ``rng`` are injectable for tests.
    """

    def __init__(
        self,
        client: SessionsClient,
        store: AsyncStore,
        settings: PollSettings,
        *,
        on_enqueued: Callable[[], None] = lambda: None,
        on_ingested: Callable[[], None] = lambda: None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        account: str = DEFAULT_ACCOUNT,
    ) -> None:
        #: The account this poller follows (``[[accounts]]`` name): ``data.account``.
        self.account = account
        #: The account's API client (the daemon's upstream actions use it too).
        self.client = client
        self._store = store
        self._mono = monotonic
        #: The handles, the tracked sessions and the loops' liveness the collaborators share.
        self.state = state = PollState(
            settings,
            account=account,
            client=client,
            store=store,
            metrics=metrics,
            clock=clock,
            monotonic=monotonic,
            heartbeat=monotonic(),
        )
        failures = Failures(state, rng=rng if rng is not None else random.Random())
        archive = Archive(state, on_enqueued=on_enqueued, on_ingested=on_ingested)
        #: Due times, list or timer mode, the loop that starts the polls.
        self.scheduler = Scheduler(state)
        #: Judges the session list's items (and notes sessions the client mended).
        screen = SessionScreen(metrics, account)
        self._sessions = SessionPoll(
            state, scheduler=self.scheduler, archive=archive, failures=failures, screen=screen
        )
        self._history = HistoryWalk(state, scheduler=self.scheduler, sessions=self._sessions)
        self._lease = PollerLease(state)
        self._discovery = Discovery(
            state,
            scheduler=self.scheduler,
            archive=archive,
            failures=failures,
            history=self._history,
            screen=screen,
        )

    @property
    def settings(self) -> PollSettings:
        """The poller's knobs; a reload assigns new ones (every collaborator sees them)."""
        return self.state.settings

    @settings.setter
    def settings(self, settings: PollSettings) -> None:
        self.state.settings = settings

    @property
    def first_pass_done(self) -> anyio.Event:
        """Set once the first discovery pass was tried (successfully or not): readiness."""
        return self.state.first_pass_done

    @property
    def list_driven(self) -> bool:
        """Whether working sessions are polled when the list shows them move (list mode)."""
        return self.scheduler.list_driven

    def due(self, now: float) -> list[str]:
        """Names of the sessions due for a poll at ``now``, most overdue first."""
        return self.scheduler.due(now)

    async def discover(self) -> None:
        """Walk the session list once; announce new sessions and schedule changed ones."""
        await self._discovery.discover()

    async def adopt(self, session: Session) -> None:
        """Archive and announce a session this relay created, and poll it at once
        (``Discovery.adopt``)."""
        await self._discovery.adopt(session)

    async def read_head(self) -> int:
        """Read the head of the session list (``Discovery.read_head``); the pages read."""
        return await self._discovery.read_head()

    async def run(self) -> None:
        """Discovery and the scheduler, forever, while this replica holds the account's poller
        lease; on standby otherwise. A store that is no registered replica's polls without one."""
        lease = self._lease
        registered = self._store.replica.replica_id is not None
        while True:
            if registered and not await lease.hold():
                await lease.standby()
            async with anyio.create_task_group() as tg:
                if registered:
                    tg.start_soon(lease.keep, tg.cancel_scope)
                tg.start_soon(self._discovery.loop)
                tg.start_soon(self._discovery.head_loop)
                tg.start_soon(self._history.run)
                await self.scheduler.run(tg, self._sessions.poll)

    async def run_once(self, *, max_attempts: int = 4) -> OnceReport:
        """One full pass: discovery, then every new, changed or working session polled, each
        transient failure retried up to ``max_attempts`` times; a 401 ends the pass."""
        report = OnceReport()
        for attempt in range(1, max_attempts + 1):
            try:
                await self._discovery.discover()
            except UnauthenticatedError as exc:
                self._discovery.failed(exc)
                report.unauthenticated = exc
                return report
            except ApiError as exc:
                delay = self._discovery.failed(exc)
                if attempt == max_attempts:
                    report.failed.append("discovery")
                    return report
                await anyio.sleep(delay)
            else:
                break
        # New sessions whose GET failed: give the service a moment, then ask again.
        for _ in range(max_attempts):
            if not self.state.pending:
                break
            due = min(p.retry_at for p in self.state.pending.values())
            await anyio.sleep(max(0.0, due - self._mono()))
            try:
                await self._discovery.retry_pending()
            except UnauthenticatedError as exc:
                report.unauthenticated = exc
                return report
        report.failed.extend(sorted(self.state.pending))
        # One pass archives everything, the history of the first start included.
        now = self._mono()
        for tracked in self.state.tracked.values():
            if tracked.history:
                self.scheduler.schedule(tracked, now, refresh=True)
        self._history.drop()
        todo = [self.state.tracked[name] for name in self.scheduler.due(math.inf)]
        limiter = anyio.CapacityLimiter(self.state.settings.concurrency)

        async def poll_until_done(tracked: Tracked) -> None:
            for attempt in range(1, max_attempts + 1):
                if report.unauthenticated is not None:
                    return
                async with limiter:
                    outcome = await self._sessions.poll(tracked)
                if outcome == "auth" and isinstance(tracked.last_error, UnauthenticatedError):
                    report.unauthenticated = tracked.last_error
                    return
                if outcome in ("ok", "gone"):
                    report.sessions_polled += 1
                    return
                if attempt < max_attempts:
                    await anyio.sleep(max(0.0, tracked.backoff_until - self._mono()))
            report.failed.append(tracked.name)

        async with anyio.create_task_group() as tg:
            for tracked in todo:
                tg.start_soon(poll_until_done, tracked)
        return report

    async def poll_due(self) -> dict[str, str]:
        """Poll every session due now, once (tests, tools); each one's outcome: ``ok``,
        ``retry``, ``gone`` or ``auth``."""
        outcomes: dict[str, str] = {}
        limiter = anyio.CapacityLimiter(self.state.settings.concurrency)

        async def poll(tracked: Tracked) -> None:
            async with limiter:
                outcomes[tracked.name] = await self._sessions.poll(tracked)

        async with anyio.create_task_group() as tg:
            for name in self.scheduler.due(self._mono()):
                tg.start_soon(poll, self.state.tracked[name])
        return outcomes
