"""The MCP tools: their names, arguments, descriptions, annotations and output schemas
(:data:`TOOLS`), and what each does (:class:`Tools`).

Arguments are pydantic models (``extra="forbid"``): each one's JSON Schema is the tool's
input schema, and a call whose arguments it refuses is a tool error of one line. Answers
are the management API's models (:mod:`...domain.api_models`): each one's JSON Schema is the
tool's output schema, its JSON the structured content, beside a short text summary.
Reading goes through :mod:`...ops.session_views`, acting through
:func:`...ops.actions.perform_once` (actor ``mcp``), creating through
:attr:`~..context.WebContext.create`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sessionhook.api.client import session_name
from sessionhook.wording import counted

from ...domain.actions import ActionKind, NewSession
from ...domain.agent_text import PROVENANCE, agent_text
from ...domain.api_models import (
    MAX_PROMPT,
    ApiActed,
    ApiCreatedSession,
    ApiEventLine,
    ApiModel,
    ApiSessionItem,
    ApiSessionList,
    ApiSessionView,
    ApiWaitAnswer,
)
from ...ops import OperatorError
from ...ops import session_views as views
from ...ops.actions import REFUSALS, Actor, Performed, perform_once, record_direct
from ...store import AsyncStore, OperatorQueries, StoreError
from ...telemetry.logs import get_logger
from ..context import WebContext
from .watch import Stopping, TooManyWaits, Watcher

_log = get_logger()

#: The longest wait (seconds).
MAX_WAIT: Final = 3600
#: Seconds a wait waits for the archive's reader to start (the store away: a refusal).
READY_WAIT: Final = 10.0


class ToolProblem(Exception):
    """A tool's refusal: one line for the caller (a result with ``isError``)."""


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionArg(_Args):
    session: Annotated[str, Field(min_length=1, max_length=200, description="sessions/ID or ID")]

    @field_validator("session")
    @classmethod
    def _name(cls, value: str) -> str:
        return session_name(value.strip())


class ListArgs(_Args):
    state: Literal["waiting", "working", "done", "failed", "all"] = Field(
        default="waiting", description="waiting: the session waits for the user"
    )
    limit: int = Field(default=20, ge=1, le=views.MAX_LIST)


class MessageArgs(SessionArg):
    text: Annotated[str, Field(min_length=1, max_length=16_000, description="The message")]


class WaitArgs(SessionArg):
    until: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=lambda: ["action_required", "completed", "failed"],
        min_length=1,
        max_length=32,
        description="action_required, completed, failed, or event types",
    )
    timeout_s: float = Field(default=300, gt=0, le=MAX_WAIT, allow_inf_nan=False)


class CreateArgs(_Args):
    prompt: Annotated[str, Field(min_length=1, max_length=MAX_PROMPT)]
    source: Annotated[str, Field(min_length=1, max_length=500)] | None = Field(
        default=None, description="sources/github/OWNER/REPO or github/OWNER/REPO"
    )
    branch: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    title: Annotated[str, Field(max_length=500)] | None = None
    require_plan_approval: bool = False
    auto_pr: bool = False
    account: Annotated[str, Field(min_length=1, max_length=100)] | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: its name, what it says, its arguments and answer models, whether it acts."""

    name: str
    description: str
    args: type[_Args]
    answer: type[ApiModel]
    acts: bool
    destructive: bool = False


TOOLS: Final[tuple[ToolSpec, ...]] = (
    ToolSpec(
        "list_sessions",
        "List archived coding-agent sessions, the latest update first; state='waiting' lists "
        "those waiting for the user (a plan to approve or a question to answer), with what "
        "each waits for. Reads the relay's archive: no request to the service.",
        ListArgs,
        ApiSessionList,
        acts=False,
    ),
    ToolSpec(
        "get_session",
        "One session: title, state, the pending plan's steps or question, the pull request, "
        "the last 20 events. Reads the archive: no request to the service.",
        SessionArg,
        ApiSessionView,
        acts=False,
    ),
    ToolSpec(
        "wait_for_session",
        "Wait until the session needs the user or ends: returns the first matching event "
        "archived after the call (session.action_required, session.completed, "
        "session.failed, or any event type named in until), at once if the session already "
        "is in that condition, or timed_out after timeout_s (at most 3600). Costs no "
        "request to the service: the relay pushes what it archives.",
        WaitArgs,
        ApiWaitAnswer,
        acts=False,
    ),
    ToolSpec(
        "approve_plan",
        "Approve the plan the session waits on (once: a second call is refused). The agent "
        "then carries the plan out.",
        SessionArg,
        ApiActed,
        acts=True,
        destructive=True,
    ),
    ToolSpec(
        "send_message",
        "Send the coding agent a message: the answer to its question, or a new instruction.",
        MessageArgs,
        ApiActed,
        acts=True,
    ),
    ToolSpec(
        "create_session",
        "Start a coding-agent session with a prompt (optionally on a source repository and "
        "branch); it is archived at once, so it can be waited on and read right away.",
        CreateArgs,
        ApiCreatedSession,
        acts=True,
    ),
)
#: Each tool's description ends with what its text is.
DESCRIPTIONS: Final = {spec.name: f"{spec.description} {PROVENANCE}" for spec in TOOLS}


def tool_specs(allow_actions: bool) -> tuple[ToolSpec, ...]:
    """The tools served: every one, or the read tools only."""
    return tuple(spec for spec in TOOLS if allow_actions or not spec.acts)


def first_error(exc: ValidationError) -> str:
    """A pydantic refusal as one line naming the argument."""
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"]) or "arguments"
    return agent_text(f"{where}: {err['msg']}", 300).replace("\n", " ")


Answer = tuple[ApiModel, str]


class Tools:
    """What the tools do, over the web context and the watcher."""

    def __init__(self, ctx: WebContext, watcher: Watcher) -> None:
        self._ctx = ctx
        self._watcher = watcher
        self._handlers: dict[str, Callable[[Any, str], Awaitable[Answer]]] = {
            "list_sessions": self._list,
            "get_session": self._get,
            "wait_for_session": self._wait,
            "approve_plan": self._approve,
            "send_message": self._message,
            "create_session": self._create,
        }

    def _store(self) -> AsyncStore:
        astore = self._ctx.store()
        if astore is None:
            raise ToolProblem("the relay is starting: try again in a moment")
        return astore

    async def call(self, spec: ToolSpec, arguments: dict[str, Any], client: str) -> Answer:
        """Run tool ``spec`` (:class:`ToolProblem`: a refusal of one line)."""
        try:
            args = spec.args.model_validate(arguments)
        except ValidationError as exc:
            raise ToolProblem(first_error(exc)) from None
        failures: tuple[type[Exception], ...] = (StoreError, *self._ctx.store_errors)
        try:
            return await self._handlers[spec.name](args, client)
        except OperatorError as exc:
            raise ToolProblem(str(exc)) from None
        except failures as exc:  # the database away: one line, as the API's 503
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            _log.warning("mcp.store_failed", tool=spec.name, error=text[:200])
            raise ToolProblem(f"the store cannot be read now: {text[:200]}") from None

    async def _list(self, args: ListArgs, client: str) -> Answer:
        phase = None if args.state == "all" else args.state
        found = await self._store().run(views.list_phase, phase, args.limit)
        text = f"{counted(len(found.sessions), 'session')} ({args.state})"
        lines = [f"- {s.session} [{s.phase}] {s.title[:80]}" for s in found.sessions]
        return found, "\n".join([text, *lines])

    async def _get(self, args: SessionArg, client: str) -> Answer:
        view = await self._store().run(views.session_view, args.session)
        item = view.session
        text = f"{item.session} [{item.phase}, {item.state}] {item.title[:200]}"
        if item.waiting_for is not None:
            text += f"; waits for {item.waiting_for.kind.replace('_', ' ')}"
        return view, text

    async def _wait(self, args: WaitArgs, client: str) -> Answer:
        types = views.until_types(args.until)
        astore = self._store()
        try:
            with self._watcher.waiter(args.session, types) as waiter:
                with anyio.move_on_after(READY_WAIT):
                    await self._watcher.ready.wait()
                if not self._watcher.ready.is_set():
                    raise ToolProblem("the archive cannot be read now: try again in a moment")
                waiter.start(await astore.run(OperatorQueries.last_event_seq))
                now: tuple[ApiSessionItem | None, ApiEventLine | None]
                now = await astore.run(views.already, args.session, types)
                if now[1] is None:
                    with anyio.move_on_after(args.timeout_s):
                        await waiter.done.wait()
                    if waiter.found is None and self._watcher.closing:
                        raise Stopping
                    if waiter.found is None:
                        answer = ApiWaitAnswer(timed_out=True, event=None, session=None)
                        return answer, f"timed out after {args.timeout_s:g} s"
                    now = await astore.run(views.answer_of, waiter.found)
        except TooManyWaits:
            raise ToolProblem(
                f"too many waits open ({self._watcher.max_waits}): try again later"
            ) from None
        except Stopping:
            raise ToolProblem(
                "the relay is stopping: call wait_for_session again in a moment"
            ) from None
        item, line = now
        assert line is not None
        answer = ApiWaitAnswer(timed_out=False, event=line, session=item)
        return answer, f"{line.type} ({line.time}): {line.summary}"

    async def _act(self, name: str, kind: ActionKind, text: str | None, client: str) -> Answer:
        act = self._ctx.act
        if act is None:
            raise ToolProblem("this relay cannot act on sessions (no upstream client here)")
        astore, actor, now = self._store(), Actor("mcp", client, "mcp"), self._ctx.clock()
        metrics = self._ctx.metrics
        performed = await perform_once(
            astore, act, name, kind, text, actor=actor, now=now, metrics=metrics
        )
        if kind == "reply" and performed.reason == "not waiting":
            # A message needs no question: an instruction to a working agent is sent as the
            # API's and the console's are, and recorded afterwards.
            outcome = await act(name, kind, text)
            await record_direct(astore, name, kind, outcome, actor=actor, now=now, metrics=metrics)
            performed = Performed(outcome.ok, "done" if outcome.ok else "upstream failed", outcome)
        _log.info("mcp.act", session=name, kind=kind, reason=performed.reason)
        if not performed.ok:
            if performed.outcome is not None:
                detail = " ".join(performed.outcome.detail.split())[:500]
                raise ToolProblem(f"the Sessions API refused: {detail or 'no reason given'}")
            raise ToolProblem(f"{performed.reason}: {REFUSALS[performed.reason]}")
        detail = performed.outcome.detail if performed.outcome else ""
        return ApiActed(ok=True, session=name, detail=detail), f"{name}: {detail}"

    async def _approve(self, args: SessionArg, client: str) -> Answer:
        return await self._act(args.session, "approve_plan", None, client)

    async def _message(self, args: MessageArgs, client: str) -> Answer:
        if not args.text.strip():
            raise ToolProblem("text: the message is empty")
        return await self._act(args.session, "reply", args.text, client)

    async def _create(self, args: CreateArgs, client: str) -> Answer:
        create = self._ctx.create
        if create is None:
            raise ToolProblem("this relay cannot create sessions (no upstream client here)")
        if not args.prompt.strip():
            raise ToolProblem("prompt: the prompt is empty")
        new = NewSession(**args.model_dump())
        outcome, name = await create(new)
        _log.info("mcp.create", ok=outcome.ok, session=name, status=outcome.status)
        if not outcome.ok or name is None:
            detail = " ".join(outcome.detail.split())[:500]
            raise ToolProblem(f"the session was not created: {detail or 'no reason given'}")
        view = await self._store().run(views.session_view, name)
        return ApiCreatedSession(session=view.session), f"created {name}"
