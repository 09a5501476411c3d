"""Learning whether the server moves a session's ``updateTime`` when it gains an activity.

Where it does, one list page (100 sessions) tells which working sessions have something new,
and polling the others is waste: the poller polls a working session's activities only when
the list shows its ``updateTime`` moved (``list`` mode). Where it does not, only a timer
finds new activities (``timer`` mode, the relay's original behaviour).

The evidence: every activity poll that found new activities (not a session's first poll,
where all its history is new) leaves a *check*: the newest activity's ``createTime`` and the
``updateTime`` the previous poll covered. The next list read that began after that poll
ended judges it: a listed ``updateTime`` that moved and is at or after that ``createTime``
means "moved"; anything else "did not". Only the server's own timestamps are compared, so
clock skew does not matter.

:func:`judge` is the comparison, :class:`UpdateTimeLearning` the verdict (pure, no I/O):

* one "did not" makes the verdict ``still`` at once: a server that stops moving
  ``updateTime`` must not cost events, only the latency of the slow safety poll that found
  it out;
* ``LEARN_AFTER`` "moved" in a row (and no "did not" since) make it ``moves``.

``poll.mode`` forces either mode (``list``, ``timer``) or lets the verdict pick (``auto``,
starting in timer mode until the server has shown it moves ``updateTime``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sessionhook.api.models import parse_timestamp

__all__ = ["LEARN_AFTER", "UpdateTimeLearning", "judge"]

#: "Moved" observations in a row that make the verdict ``moves``.
LEARN_AFTER = 3


def judge(listed: str, newest_activity: datetime, before: str | None) -> bool | None:
    """Whether the list showed ``updateTime`` move for activities a poll found: the listed
    ``updateTime`` differs from ``before`` (the one the poll before covered) and is at or
    after the newest activity's ``createTime``. ``None``: the listed time cannot be read."""
    try:
        covers = parse_timestamp(listed) >= newest_activity
    except ValueError:
        return None
    return covers and listed != before


@dataclass
class UpdateTimeLearning:
    """The verdict on the server, from the observations so far (see the module docstring).

    ``verdict`` is ``None`` (not known yet), ``"moves"`` or ``"still"``.
    """

    mode: str = "auto"
    verdict: str | None = None
    streak: int = 0
    learn_after: int = LEARN_AFTER

    @property
    def list_driven(self) -> bool:
        """Whether working sessions are polled when the list shows them moving (not on a
        timer)."""
        if self.mode == "list":
            return True
        return self.mode == "auto" and self.verdict == "moves"

    def observe(self, moved: bool) -> bool:
        """Count one observation; returns whether the verdict changed."""
        before = self.verdict
        if not moved:
            self.streak = 0
            self.verdict = "still"
        else:
            self.streak += 1
            if self.streak >= self.learn_after:
                self.verdict = "moves"
        return self.verdict != before
