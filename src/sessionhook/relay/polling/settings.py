"""The poller's settings, its report, and the pure helpers its collaborators share."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sessionhook.api.client import activity_name
from sessionhook.api.errors import UnauthenticatedError

from ..config import Config
from ..domain.action_links import ActionLinks

#: ``meta`` key of the first start (Unix seconds): what came before is not delivered unless
#: ``poll.backfill``.
EPOCH_KEY = "first_started_at"
#: ``meta`` key of the learned verdict on ``updateTime`` (``moves`` / ``still``).
VERDICT_KEY = "update_time_verdict"

#: States in which the agent works and new activities are expected any moment.
ACTIVE_STATES: frozenset[str] = frozenset({"QUEUED", "PLANNING", "IN_PROGRESS"})


@dataclass(frozen=True)
class PollSettings:
    """The poller's knobs; :meth:`from_config` takes them from the ``[poll]`` section."""

    active_interval: float = 2.0
    idle_interval: float = 30.0
    discovery_interval: float = 10.0
    backfill: bool = False
    max_media_bytes: int = 262144
    #: Session polls at once: a cap on tasks (the request budget is the real bound).
    concurrency: int = 32
    page_size: int = 100
    #: Backoff after an upstream failure: ``base * 2**(n-1)``, capped, +-20 % jitter.
    backoff_base: float = 1.0
    backoff_cap: float = 30.0
    #: The slower pace after the API key was rejected.
    unauthenticated_delay: float = 60.0
    #: How far before the cursor the activity list is asked from (late commits).
    cursor_overlap: float = 1.0
    #: A 404 on a session first seen less recently than this means it was deleted.
    young_session: float = 30.0
    #: Backoff (base, cap) of the GET that announces a new session (its events wait).
    announce_backoff: tuple[float, float] = (0.25, 1.0)
    #: Pages one walk may take; one more offered is a failure (runaway pagination).
    max_pages: int = 200
    #: How far past the service's clock (the whole-second ``Date``) the cursor may move.
    clock_skew: float = 1.0
    #: The same against the local clock, for an answer without a ``Date`` header.
    unsynced_clock_skew: float = 60.0
    #: ``auto`` (learn whether ``updateTime`` moves), ``list`` or ``timer``.
    mode: str = "auto"
    #: List mode: how often the head of the session list is read.
    list_interval: float = 1.0
    #: List mode: pages of the head read at most (sessions deeper keep their timer).
    head_pages: int = 3
    #: List mode: a working session is still polled this often.
    safety_interval: float = 30.0
    #: How long a waiting or final state waits for the activity behind it (the plan, the
    #: question) before its event goes without it.
    lifecycle_wait: float = 5.0
    #: Share of ``requests_per_minute`` the history walk may take (newest sessions first).
    history_share: float = 0.2
    #: Share of ``requests_per_minute`` the full passes over the session list may take: a
    #: pass of more pages than that allows per ``discovery_interval`` waits longer.
    list_share: float = 0.5
    #: The budget those shares are of (``api.requests_per_minute``).
    requests_per_minute: int = 600
    #: The signed links of ``session.action_required`` events (``None``: no links).
    action_links: Callable[[], ActionLinks | None] | None = None

    def pass_spacing(self, pages: int) -> float:
        """Seconds from the start of a full pass over the session list that read ``pages``
        pages to the start of the next: ``discovery_interval``, or longer for an account
        whose list takes more than ``list_share`` of the budget at that pace."""
        per_second = max(1e-6, self.list_share * self.requests_per_minute / 60.0)
        return max(self.discovery_interval, pages / per_second)

    @classmethod
    def from_config(cls, config: Config) -> PollSettings:
        """Settings from a loaded config; the rest keep their defaults."""
        return cls().with_config(config)

    def with_config(self, config: Config) -> PollSettings:
        """These settings with the values the config sets (a reload keeps the others)."""
        return replace(
            self,
            active_interval=config.poll.active_interval,
            idle_interval=config.poll.idle_interval,
            discovery_interval=config.poll.discovery_interval,
            backfill=config.poll.backfill,
            mode=config.poll.mode,
            list_interval=config.poll.list_interval,
            safety_interval=config.poll.safety_interval,
            history_share=config.poll.history_share,
            list_share=config.poll.list_share,
            requests_per_minute=config.api.requests_per_minute,
            max_media_bytes=config.delivery.max_media_bytes,
            max_pages=config.poll.max_pages,
        )


def name_problem(name: str, session: str) -> str | None:
    """Why an activity listed under ``session`` cannot be archived as such: ``not_a_name``
    (not exactly ``sessions/<id>/activities/<id>``), ``foreign_name``, or ``None``."""
    try:
        canonical = activity_name(name)
    except ValueError:
        return "not_a_name"
    if canonical != name:
        return "not_a_name"
    if not name.startswith(session + "/activities/"):
        return "foreign_name"
    return None


def backoff_delay(
    errors: int,
    retry_after: float | None,
    *,
    base: float,
    cap: float,
    rng: random.Random,
) -> float:
    """Seconds to wait after the ``errors``-th consecutive failure: ``base * 2**(errors-1)``
    capped at ``cap``, +-20 %, never less than ``Retry-After`` (even above the cap)."""
    exponent = min(max(errors, 1) - 1, 32)
    delay = min(cap, base * 2.0**exponent) * rng.uniform(0.8, 1.2)
    if retry_after is not None and math.isfinite(retry_after):
        delay = max(delay, retry_after)
    return delay


@dataclass
class OnceReport:
    """What :meth:`Poller.run_once` achieved."""

    sessions_polled: int = 0
    failed: list[str] = field(default_factory=list)
    #: The 401 that stopped the pass, when the API key was rejected.
    unauthenticated: UnauthenticatedError | None = None
