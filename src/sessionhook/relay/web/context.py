"""What the web layer is handed: :class:`WebContext`, the one seam between the daemon and
its routes.

The web layer imports no poller, dispatcher or daemon (an import-linter contract): whatever
it shows comes from the store and the config, and whatever it sets off (a test event, a
readiness probe, a refresh of the gauges, a wake-up of the dispatcher) is a callable the
daemon put in here. Tests and benchmarks build one with stand-ins.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from starlette.routing import BaseRoute

from ..config import Config
from ..config.action_keys import LinkKeys
from ..domain.actions import UpstreamAct, UpstreamCreate
from ..domain.retry import AttemptResult
from ..store import AsyncStore, database_errors
from ..telemetry.metrics import Metrics
from .auth import WebAuth
from .bell import Bell
from .server import ReadinessCheck, ScrapeHook, always_ready

#: Sends endpoint NAME a signed test event now; the answer (never raises for the network;
#: :class:`~sessionhook.relay.ops.OperatorError` for a name the config does not have).
SendTest = Callable[[str], Awaitable[AttemptResult]]
#: Sends endpoint NAME a signed sample of an event type now (``trigger``): ``(name, type,
#: archived session or None)`` -> ``(webhook-id, answer)``.
SendSample = Callable[[str, str, str | None], Awaitable[tuple[str, AttemptResult]]]
#: Acts on a signed action link's token for a chat user: ``(token, chat_user, text)`` ->
#: ``(done, one line for the user)`` (``text``: the reply; ``None`` to approve a plan).
PerformLink = Callable[[str, str, str | None], Awaitable[tuple[bool, str]]]


@dataclass
class WebContext:
    """What web routes may use of the daemon; ``store`` returns ``None`` until the store is
    open (routes answer 503)."""

    config: Callable[[], Config]
    store: Callable[[], AsyncStore | None]
    metrics: Metrics
    auth: WebAuth
    bell: Bell = field(default_factory=Bell)
    clock: Callable[[], float] = time.time
    #: /readyz asks it (default: ready whenever asked, for an app with nothing behind it).
    readiness: ReadinessCheck = always_ready
    #: /metrics runs it before rendering (the daemon refreshes its outbox gauges).
    before_scrape: ScrapeHook | None = None
    #: What /readyz says of the store (``backend``, ``database``: never a password).
    store_facts: Mapping[str, str] | None = None
    #: What the store's engine raises for a database problem: a route failing with one of
    #: these (or :class:`~sessionhook.relay.store.StoreError`) is a 503, never a traceback.
    store_errors: tuple[type[Exception], ...] = field(default_factory=database_errors)
    #: The console's actions: send endpoint NAME a signed test event now (``None``: not
    #: available), and wake the dispatcher after a replay or an endpoint enabled.
    send_test: SendTest | None = None
    #: The API's ``:trigger``: a signed sample event now (``None``: not available).
    send_sample: SendSample | None = None
    wake: Callable[[], None] = lambda: None
    #: Approve a session's plan or answer its agent with the session's account (the
    #: management API, the console, action links); ``None``: not available (answer 503).
    act: UpstreamAct | None = None
    #: Create a session with an account's client and archive it at once (the MCP tool
    #: ``create_session``); ``None``: not available.
    create: UpstreamCreate | None = None
    #: The action-link keys (``[actions]``): the pages behind the links verify with them;
    #: ``None``: the pages answer 404.
    link_keys: LinkKeys | None = None
    #: Acts on an action link's token for a Slack button; ``None``: ``perform_for_chat``.
    perform_link: PerformLink | None = None


#: Builds a group of protected routes.
RouteProvider = Callable[[WebContext], Sequence[BaseRoute]]
