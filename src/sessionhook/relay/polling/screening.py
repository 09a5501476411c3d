"""The session list's items, judged one by one before discovery tracks them.

One bad item must not stop discovery for the whole account. A session the client *mended*
(lone surrogates replaced by U+FFFD) is tracked like any other, logged and counted the
first time (``discovery.session_repaired``); an item that is no session (``malformed``) or
whose ``name`` is not exactly ``sessions/<id>`` (``not_a_name``) is refused, logged and
counted (``discovery.session_refused``), and discovered once upstream sends it sound.
"First time" is per process.

An enum value this version does not know (a session ``state``, an ``automationMode``: the
service adds and retires them) is data, never a refusal: the session is tracked with the
text as it came, and the value logged and counted (``discovery.unknown_value``) the first
time per session.
"""

from __future__ import annotations

from sessionhook.api import SessionPage
from sessionhook.api.client import session_name
from sessionhook.api.models import AUTO_CREATE_PR, Session, SessionState

from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics

_log = get_logger()

#: The values of the service's enums this version knows, by wire field.
KNOWN_VALUES: dict[str, frozenset[str]] = {
    "state": frozenset(SessionState),
    "automationMode": frozenset({"AUTOMATION_MODE_UNSPECIFIED", AUTO_CREATE_PR}),
}


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
                self.note_values(session)
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

    def note_values(self, session: Session) -> None:
        """Log and count the enum values of ``session`` this version does not know (kept as
        text), the first time per session and field."""
        for field, value in (("state", session.state), ("automationMode", session.automation_mode)):
            if not value or value in KNOWN_VALUES[field]:
                continue
            if not self._first(("unknown", session.name, field)):
                continue
            if self._metrics is not None:
                self._metrics.unknown_values.labels(field=field).inc()
            _log.warning(
                "discovery.unknown_value",
                session=session.name[:200],
                field=field,
                value=value[:200],
                detail="a value this version does not know, kept as text",
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
