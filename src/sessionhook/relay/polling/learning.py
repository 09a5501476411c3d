"""Learning whether the server moves a session's ``updateTime`` when it gains an activity
(docs/polling.md: ``list`` and ``timer`` modes).

Each activity poll that found new activities leaves a *check* (the newest ``createTime``,
the ``updateTime`` covered); the next list read begun after it judges it by the server's own
timestamps (:func:`judge`). One "did not" makes the verdict ``still`` at once;
``LEARN_AFTER`` "moved" in a row make it ``moves`` (:class:`UpdateTimeLearning`, pure).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sessionhook.api.models import parse_timestamp

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
    """The verdict on the server so far: ``None`` (not known yet), ``"moves"`` or ``"still"``."""

    mode: str = "auto"
    verdict: str | None = None
    streak: int = 0
    learn_after: int = LEARN_AFTER

    @property
    def list_driven(self) -> bool:
        """Whether working sessions are polled when the list shows them moving (not on a timer)."""
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
