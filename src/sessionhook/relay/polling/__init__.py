"""Discovery and per-session activity polling: the relay's only reader of the Sessions API.

Two loops share one request budget (the :class:`~sessionhook.relay.polling.budget.RateLimiter`
installed on the upstream HTTP client):

* **Discovery** walks every page of the session list each ``discovery_interval``. A new
  session is fetched whole, archived and announced (``session.discovered``); if that GET
  fails (404 right after creation, 5xx...) the session is asked again on a short backoff of
  its own, without failing the pass or holding up the others.
  A session whose state or ``updateTime`` moved is scheduled for an activity poll; an
  unchanged idle session costs nothing more.
* **The scheduler** starts activity polls most overdue session first, so dozens of sessions
  share the budget fairly, in a pool large enough (``concurrency``) that a session whose
  upstream answers slowly holds up only itself. Working sessions (QUEUED, PLANNING,
  IN_PROGRESS) are polled every ``active_interval``; the others only when discovery saw
  their ``updateTime`` move, at most once per ``idle_interval``, and at once after a state
  change.

An activity poll walks every page of the session's activities from its cursor (the newest
archived ``createTime``, minus a small overlap); the store archives each activity name
once, so a server that treats the ``createTime`` bound inclusively, exclusively or ignores
it are all safe, and so are repeated pages. After new activities that can come with a
change of the session (anything but progress updates), or a change seen by discovery, the
session is fetched once: a new state gives ``session.state_changed``, a new pull request
in ``outputs`` gives ``session.pull_request_opened``.

``backfill = false``: the first discovery records the first start in the store; events
whose upstream time is older (the history of sessions created before it) are archived but
not delivered. Sessions created after it are delivered whole, even when a failing upstream
delayed their discovery.

Failures never skip anything: the cursor only moves over archived activities, so a failed
poll is simply tried again. A full disk pauses polling: the writes in progress wait for space
(:class:`~sessionhook.relay.store.AsyncStore`), no new poll or discovery pass starts until a
write succeeds again. 429/5xx/timeouts/malformed answers back that session (or
discovery) off, exponentially and capped, never sooner than ``Retry-After``; the other
sessions go on. A 404 on a session first seen less than 30 s ago is the service's eventual
consistency and is retried; a later 404 means the session was deleted and it is dropped.
A rejected API key (401) is logged loudly and retried slowly. So does a walk that reaches
``max_pages`` pages (a server handing out a fresh page token forever), or a page that brings
it nothing new (the same items under a fresh token: ``page_loop``, see the client): what it
archived stays, the next poll resumes from the cursor.

What upstream sends is screened, never trusted (see ``docs/security.md``): an activity
whose ``name`` is not ``<polled session>/activities/<id>`` (``foreign_name``,
``not_a_name``), one archived under another session already (``duplicate_name``), an item
that is no activity (``malformed``) and a single activity too large to read (``too_large``:
the walk goes on after it, the cursor moves past it) are refused: recorded in the store
(``sessionhook status``), logged (``poll.activity_refused``), counted; the others of the
page go through. The cursor never moves past the service's clock (the ``Date`` header)
plus ``clock_skew``, so a createTime in the year 9999 cannot hold later activities back.
The session list is judged item by item too (``screening.py``): a session whose text is not
Unicode is relayed mended (U+FFFD), an item that is no session is refused; the other
sessions of the page are discovered as usual.
"""

from .poller import Poller
from .settings import (
    ACTIVE_STATES,
    EPOCH_KEY,
    OnceReport,
    PollSettings,
    backoff_delay,
    name_problem,
)

__all__ = [
    "ACTIVE_STATES",
    "EPOCH_KEY",
    "OnceReport",
    "PollSettings",
    "Poller",
    "backoff_delay",
    "name_problem",
]
