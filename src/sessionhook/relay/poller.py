"""Compatibility name of the poller: it lives in :mod:`sessionhook.relay.polling`.

Split by concern there: ``discovery`` (the session list), ``scheduling`` (when each session
is polled), ``session_poll`` (one session's activities), ``poller`` (the loops).
"""

from .polling import (
    ACTIVE_STATES,
    EPOCH_KEY,
    OnceReport,
    Poller,
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
