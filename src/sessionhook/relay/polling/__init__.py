"""Discovery and per-session activity polling: the relay's only reader of the Sessions API.

docs/polling.md says what it reads and when, how it backs off, what it refuses and how a
full disk pauses it; its "Inside the poller" section maps :class:`Poller`'s collaborators.
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
