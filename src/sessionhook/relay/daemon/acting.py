"""The upstream actions a person takes through the relay (approve a plan, answer the agent,
create a session), made with the API client of the account that lists the session.

:class:`UpstreamActions` is the daemon's :data:`~sessionhook.relay.domain.actions.UpstreamAct`;
whatever the service answers comes back as an
:class:`~sessionhook.relay.domain.actions.ActOutcome` with one line for a person, never raised.
"""

from __future__ import annotations

from sessionhook.api import ApiError, ApiStatusError
from sessionhook.api.client import session_name
from sessionhook.api.models import AUTO_CREATE_PR

from ..domain.actions import ActionKind, ActOutcome, NewSession
from ..store import Ingest
from ..telemetry.logs import get_logger
from .state import DaemonState

_log = get_logger()


class UpstreamActions:
    """Approves plans and sends messages with the pollers' API clients (their budgets and
    bounds apply: an action is one more request of that account)."""

    def __init__(self, state: DaemonState) -> None:
        self._state = state

    async def __call__(self, session: str, kind: ActionKind, text: str | None) -> ActOutcome:
        """Make the call for ``session`` (:data:`~..domain.actions.UpstreamAct`)."""
        try:
            name = session_name(session)
        except ValueError as exc:
            return ActOutcome(False, None, str(exc))
        state = self._state
        store = state.store
        if store is None or not state.pollers:
            return ActOutcome(False, None, "the relay is starting: try again in a moment")
        account = await store.run(Ingest.session_account, name)
        if account is None:
            return ActOutcome(False, None, f"{name} is not a session this relay has seen")
        poller = next((p for p in state.pollers if p.account == account), None)
        if poller is None:
            return ActOutcome(False, None, f"account {account!r} of {name} is not configured")
        try:
            if kind == "approve_plan":
                await poller.client.approve_plan(name)
                done = "plan approved"
            else:
                if not text or not text.strip():
                    return ActOutcome(False, None, "a reply needs some text")
                await poller.client.send_message(name, text)
                done = "message sent"
        except ApiError as exc:
            status = exc.status_code if isinstance(exc, ApiStatusError) else None
            _log.warning("action.failed", session=name, action=kind, error=exc.message)
            return ActOutcome(False, status, exc.message)
        _log.info("action.done", session=name, action=kind, account=account)
        return ActOutcome(True, 200, done)

    async def create(self, new: NewSession) -> tuple[ActOutcome, str | None]:
        """Create a session with the account ``new.account`` names (or the only one), then
        archive and announce it at once (:data:`~..domain.actions.UpstreamCreate`)."""
        pollers = self._state.pollers
        if self._state.store is None or not pollers:
            return ActOutcome(False, None, "the relay is starting: try again in a moment"), None
        if new.account is None and len(pollers) > 1:
            names = ", ".join(p.account for p in pollers)
            return ActOutcome(False, None, f"several accounts: name one ({names})"), None
        poller = next((p for p in pollers if new.account in (None, p.account)), None)
        if poller is None:
            names = ", ".join(p.account for p in pollers)
            return ActOutcome(False, None, f"no account {new.account!r} ({names})"), None
        try:
            session = await poller.client.create_session(
                new.prompt,
                title=new.title,
                source=new.source,
                starting_branch=new.branch,
                require_plan_approval=new.require_plan_approval,
                automation_mode=AUTO_CREATE_PR if new.auto_pr else None,
            )
        except ValueError as exc:
            return ActOutcome(False, None, str(exc)), None
        except ApiError as exc:
            status = exc.status_code if isinstance(exc, ApiStatusError) else None
            _log.warning("action.failed", action="create_session", error=exc.message)
            return ActOutcome(False, status, exc.message), None
        await poller.adopt(session)
        _log.info("action.done", session=session.name, action="create_session")
        return ActOutcome(True, 200, "session created"), session.name
