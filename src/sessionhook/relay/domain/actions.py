"""What a person does to a session through the relay: approve its plan, or answer the agent.

The relay holds the API client of every account it polls, so the web layer (the management
API, the console, the pages behind signed action links, Slack's interactivity) can act on a
session without an API key of its own. It never reaches a client: the daemon hands it an
:data:`UpstreamAct` through :class:`~sessionhook.relay.web.WebContext`, which makes the call
with the session's account and tells how it went as an :class:`ActOutcome` (it never raises
for what the upstream answered).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal

#: ``approve_plan``: ``POST /v1alpha/sessions/{id}:approvePlan``; ``reply``:
#: ``:sendMessage`` with the person's text.
ActionKind = Literal["approve_plan", "reply"]
ACTION_KINDS: Final[tuple[ActionKind, ...]] = ("approve_plan", "reply")


@dataclass(frozen=True, slots=True)
class ActOutcome:
    """How an upstream action went.

    ``ok``: the service accepted it. ``status``: its HTTP status (``None`` when no answer
    came: a network error, no account for the session). ``detail``: one line for a person
    (the service's error message, or what was done).
    """

    ok: bool
    status: int | None
    detail: str


#: ``act(session, kind, text)``: make the upstream call for ``session`` (``sessions/<id>``)
#: with the account that lists it; ``text`` is the reply (``None`` for ``approve_plan``).
UpstreamAct = Callable[[str, ActionKind, str | None], Awaitable[ActOutcome]]


@dataclass(frozen=True, slots=True)
class NewSession:
    """A session to create upstream (``POST /v1alpha/sessions``): the agent's ``prompt``, a
    ``source`` (``sources/...`` or its id; ``None``: repoless) and starting ``branch``, a
    ``title``, whether its plan waits for approval, whether the service opens a pull request
    by itself (``auto_pr``), and the ``account`` (an ``[[accounts]]`` name; ``None``: the
    only one)."""

    prompt: str
    source: str | None = None
    branch: str | None = None
    title: str | None = None
    require_plan_approval: bool = False
    auto_pr: bool = False
    account: str | None = None


#: ``create(new)``: create the session with its account's client and archive it at once;
#: how it went, and the new session's name (``sessions/<id>``) when it was created.
UpstreamCreate = Callable[[NewSession], Awaitable[tuple[ActOutcome, str | None]]]
