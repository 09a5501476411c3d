"""The session list's items, judged one by one before discovery tracks them.

One bad item must not stop discovery for the whole account. A session the client *mended*
(lone surrogates replaced by U+FFFD) is tracked like any other, logged and counted the
first time (``discovery.session_repaired``); an item that is no session (``malformed``) or
whose ``name`` is not exactly ``sessions/<id>`` (``not_a_name``) is refused, logged and
counted (``discovery.session_refused``), and discovered once upstream sends it sound.
"First time" is per process.
"""

from __future__ import annotations

from sessionhook.api import SessionPage
from sessionhook.api.client import session_name
from sessionhook.api.models import Session

from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics

_log = get_logger()


class SessionScreen:
    """Judges the items of the session list (see the module docstring)."""

    def __init__(self, metrics: Metrics | None, account: str) -> None:
        self._metrics = metrics
        self._account = account
        #: What was logged loudly already: (what, session, detail).
        self._met: set[tuple[str, str, str]] = set()

    def accepted(self, page: SessionPage) -> list[Session]:
        """The sessions of ``page`` discovery may track; the others are refused."""
        for item in page.invalid:
            self._refuse(item.name, "malformed", item.detail)
        kept = []
        for session in page.sessions:
            if _is_name(session.name):
                self.note_repairs(session)
                kept.append(session)
            else:
                self._refuse(session.name, "not_a_name", "the name is not sessions/<id>")
        return kept

    def note_repairs(self, session: Session) -> None:
        """Log and count a session whose text the client mended (loudly the first time)."""
        if not session.repaired:
            return
        fields = ",".join(session.repaired)
        # Counted once per session; warned once per set of fields (a GET may mend more of
        # the session than its list item showed: the prompt, a pull request's title).
        if self._first(("repaired", session.name, "")) and self._metrics is not None:
            self._metrics.sessions_repaired.inc()
        loud = self._first(("repaired", session.name, fields))
        (_log.warning if loud else _log.debug)(
            "discovery.session_repaired",
            session=session.name,
            fields=fields[:200],
            detail="text that is not Unicode (a lone surrogate) replaced by U+FFFD",
            account=self._account,
        )

    def _refuse(self, name: str, reason: str, detail: str) -> None:
        first = self._first(("refused", name, reason))
        if first and self._metrics is not None:
            self._metrics.sessions_refused.labels(reason=reason).inc()
        (_log.warning if first else _log.debug)(
            "discovery.session_refused",
            session=name[:200],
            reason=reason,
            detail=detail[:500],
            account=self._account,
        )

    def _first(self, key: tuple[str, str, str]) -> bool:
        """Whether ``key`` is met for the first time (and remember it)."""
        if key in self._met:
            return False
        self._met.add(key)
        return True


def _is_name(name: str) -> bool:
    """Whether ``name`` is exactly ``sessions/<id>`` (what discovery may GET and poll)."""
    try:
        return session_name(name) == name
    except ValueError:
        return False
