"""One session (:class:`SessionRecord`) and the scripted agent that walks it through its
states, one step per step delay (the script: docs/emulator.md). Nothing here runs on its
own: the world calls :meth:`Agent.advance` before every request, so a fake clock makes
everything deterministic.
"""

from __future__ import annotations

import base64
import difflib
import random
import re
import struct
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

from ..api.models import (
    AUTO_CREATE_PR,
    Activity,
    AgentMessaged,
    Artifact,
    BashOutput,
    ChangeSet,
    GitPatch,
    Media,
    Plan,
    PlanApproved,
    PlanGenerated,
    PlanStep,
    ProgressUpdated,
    PullRequest,
    Session,
    SessionCompleted,
    SessionFailed,
    SessionOutput,
    SessionState,
    SourceContext,
    UserMessaged,
    WireModel,
    format_timestamp,
)
from ..wording import counted

#: A prompt containing this word makes the agent ask a question and wait for an answer.
ASK_WORD = "[ask]"
#: A prompt containing this word makes the session fail after its first progress update.
FAIL_WORD = "[fail]"

#: Base of the ``url`` of a session; ``.invalid`` so it can never reach a real host.
WEB_BASE = "https://sessions.emulator.invalid/session/"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EVENT_FIELDS: dict[type[WireModel], str] = {
    PlanGenerated: "plan_generated",
    PlanApproved: "plan_approved",
    UserMessaged: "user_messaged",
    AgentMessaged: "agent_messaged",
    ProgressUpdated: "progress_updated",
    SessionCompleted: "session_completed",
    SessionFailed: "session_failed",
}
_WAITING = frozenset(
    {SessionState.AWAITING_PLAN_APPROVAL, SessionState.AWAITING_USER_FEEDBACK, SessionState.PAUSED}
)
#: States in which the agent is at work: archiving the session pauses it (field notes).
_WORKING = frozenset({SessionState.QUEUED, SessionState.PLANNING, SessionState.IN_PROGRESS})
# Words that make poor names for the module and function the agent writes.
_STOPWORDS = frozenset(
    {"the", "this", "that", "with", "from", "into", "make", "please", "should", "could"}
    | {"would", "about", "when", "then", "there", "their", "them", "they", "have", "update"}
    | {"change", "code", "file", "files", "repo", "repository", "ask", "fail"}
)


def hex_id(rng: random.Random) -> str:
    """A 32-character lowercase hex id, as activities, plans and plan steps carry."""
    return f"{rng.getrandbits(128):032x}"


def make_title(prompt: str) -> str:
    """A session title generated from its prompt: the first line, trimmed to 60 characters."""
    text = re.sub(r"\[(ask|fail)\]", "", prompt, flags=re.IGNORECASE)
    line = next((" ".join(row.split()) for row in text.splitlines() if row.strip()), "")
    line = line.rstrip(" .")
    if not line:
        return "Untitled session"
    if len(line) > 60:
        line = line[:60].rsplit(" ", 1)[0] + "..."
    return line[0].upper() + line[1:]


def _slug(prompt: str) -> str:
    words = [
        w
        for w in re.findall(r"[a-z][a-z0-9]*", prompt.lower())
        if len(w) >= 4 and w not in _STOPWORDS
    ]
    return "_".join(words[:2]) or "task"


def _tiny_png(rng: random.Random, width: int = 48, height: int = 32) -> bytes:
    """A real (decodable) PNG: a vertical gradient in a colour drawn from ``rng``."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    red, green, blue = (rng.randrange(256) for _ in range(3))
    rows = b"".join(
        b"\x00" + bytes((red * y // height, green, blue)) * width for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@dataclass(frozen=True)
class _Task:
    kind: str
    title: str
    description: str


_TASKS = (
    _Task("explore", "Explore the repository", "Read the layout and find the code involved."),
    _Task("reproduce", "Add a failing test", "Write a test that shows what is wrong today."),
    _Task("implement", "Implement the change", "Change the code as the task asks."),
    _Task("verify", "Run the test suite", "Run every test and fix what the change broke."),
    _Task("document", "Update the README", "Describe the new behaviour for users."),
)


class _Workshop:
    """The fake repository a session works on: files, edits and the commands run on them."""

    def __init__(self, prompt: str, source: str, rng: random.Random) -> None:
        self._rng = rng
        self._source = source
        self.repo = source.rsplit("/", 1)[-1] if source else "app"
        self.package = re.sub(r"[^a-z0-9_]", "_", self.repo.lower()) or "app"
        self.slug = _slug(prompt)
        self.base_commit = f"{rng.getrandbits(160):040x}"
        self.module = f"src/{self.package}/{self.slug}.py"
        self.test = f"tests/test_{self.slug}.py"
        words = self.slug.replace("_", " ")
        self._originals: dict[str, str | None] = {
            "README.md": f"# {self.repo}\n\nA small project.\n",
            self.module: (
                f'"""{words.capitalize()} support."""\n\n\n'
                f"def describe() -> str:\n    return {self.slug!r}\n"
            ),
        }
        self._current: dict[str, str] = {}

    def _read(self, path: str) -> str:
        return self._current.get(path, self._originals.get(path) or "")

    def _write(self, path: str, text: str) -> None:
        self._originals.setdefault(path, None)
        self._current[path] = text

    def _stat(self, path: str) -> str:
        added = len(self._read(path).splitlines()) - len((self._originals[path] or "").splitlines())
        changed = counted(added, "insertion(+)", "insertions(+)")
        return f" {path} | {added} {'+' * added}\n 1 file changed, {changed}\n"

    def work_on(self, kind: str) -> list[Artifact]:
        """Do one plan step: edit files, run a command; the artifacts it leaves."""
        rng, slug, media = self._rng, self.slug, None
        if kind == "explore":
            listing = sorted(
                {"pyproject.toml", f"src/{self.package}/__init__.py", *self._originals}
            )
            bash = BashOutput(command="git ls-files", output="\n".join(listing) + "\n")
        elif kind == "reproduce":
            self._write(
                self.test,
                f"from {self.package}.{slug} import {slug}\n\n\n"
                f"def test_{slug}_strips_whitespace() -> None:\n"
                f'    assert {slug}("  x  ") == "x"\n',
            )
            bash = BashOutput(
                command=f"python -m pytest -q {self.test}",
                output=f"F\nFAILED {self.test}::test_{slug}_strips_whitespace - ImportError\n"
                f"1 failed in 0.{rng.randint(10, 99)}s\n",
                exit_code=1,
            )
        elif kind == "implement":
            self._write(
                self.module,
                self._read(self.module) + f"\n\ndef {slug}(value: str) -> str:\n"
                '    """Strip the value; an empty one is an error."""\n'
                "    if not value.strip():\n"
                '        raise ValueError("value must not be empty")\n'
                "    return value.strip()\n",
            )
            bash = BashOutput(command="git diff --stat", output=self._stat(self.module))
        elif kind == "verify":
            passed, seconds = rng.randint(12, 80), rng.randint(100, 999) / 100
            bash = BashOutput(
                command="python -m pytest -q",
                output=f"{'.' * min(passed, 40)}\n{passed} passed in {seconds:.2f}s\n",
            )
            png = base64.b64encode(_tiny_png(rng)).decode("ascii")
            media = Media(mime_type="image/png", data=png)
        else:  # document
            self._write(
                "README.md",
                self._read("README.md")
                + f"\n## {slug}\n\n`{slug}()` strips its input and rejects empty values.\n",
            )
            bash = BashOutput(command="git diff --stat README.md", output=self._stat("README.md"))
        artifacts = [Artifact(bash_output=bash), Artifact(change_set=self.change_set())]
        return artifacts if media is None else [*artifacts, Artifact(media=media)]

    def follow_up(self, number: int) -> list[Artifact]:
        """A small change answering a message on a finished session."""
        text = self._read(self.module) + f"\n\n# Follow-up {number}: reviewed and adjusted.\n"
        self._write(self.module, text)
        bash = BashOutput(command="git diff --stat", output=self._stat(self.module))
        return [Artifact(bash_output=bash), Artifact(change_set=self.change_set())]

    def change_set(self, commit_message: str = "") -> ChangeSet:
        """The whole change so far as one unified diff (only the base commit before edits)."""
        parts = []
        for path, text in self._current.items():
            original = self._originals[path]
            header = f"diff --git a/{path} b/{path}\n"
            if original is None:
                header += "new file mode 100644\n"
            diff = difflib.unified_diff(
                (original or "").splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"a/{path}" if original is not None else "/dev/null",
                tofile=f"b/{path}",
            )
            parts.append(header + "".join(diff))
        patch = GitPatch(
            base_commit_id=self.base_commit,
            unidiff_patch="".join(parts),
            suggested_commit_message=commit_message,
        )
        return ChangeSet(source=self._source, git_patch=patch)


@dataclass(frozen=True)
class _Step:
    kind: str
    run: Callable[[int], None]


class Agent:
    """Drives one session through its script; see the module docstring for the timeline."""

    def __init__(self, session: SessionRecord, rng: random.Random, step_us: int) -> None:
        self._session = session
        self._rng = rng
        self._step_us = step_us
        source = session.source_context.source if session.source_context else ""
        self._workshop = _Workshop(session.prompt, source, rng)
        count = rng.randint(2, 4)
        others = [t for t in _TASKS if t.kind != "implement"]
        chosen = {"implement", *(t.kind for t in rng.sample(others, count - 1))}
        self._tasks = [t for t in _TASKS if t.kind in chosen]
        self._plan = Plan(
            id=hex_id(rng),
            steps=[
                PlanStep(id=hex_id(rng), index=i, title=t.title, description=t.description)
                for i, t in enumerate(self._tasks)
            ],
        )
        self._follow_ups = 0
        self._resume_state = SessionState.IN_PROGRESS
        self._steps: deque[_Step] = deque(self._script())
        self._next_due: int | None = session.create_us + step_us

    # ------------------------------------------------------------------ public

    @property
    def awaiting_plan_approval(self) -> bool:
        """Whether a generated plan waits for :meth:`approve_plan`."""
        return self._session.state == SessionState.AWAITING_PLAN_APPROVAL

    def advance(self, now_us: int) -> None:
        """Apply every step due at or before ``now_us``, each at its scheduled time."""
        while self._steps and self._next_due is not None and self._next_due <= now_us:
            due = self._next_due
            self._steps.popleft().run(due)
            self._next_due = due + self._step_us if self._runnable() else None

    def approve_plan(self, now_us: int) -> None:
        """Approve the waiting plan now (the script does it itself without
        ``require_plan_approval``); the caller checks :attr:`awaiting_plan_approval`."""
        self._session.emit(now_us, "user", PlanApproved(plan_id=self._plan.id))
        self._session.set_state(now_us, SessionState.IN_PROGRESS)
        if self._next_due is None:  # else a reply is already due; the script follows it
            self._next_due = now_us + self._step_us

    def pause(self, now_us: int) -> None:
        """Archiving a working session pauses it where it is; a message resumes it."""
        session = self._session
        if session.state not in _WORKING:
            return
        self._resume_state = session.state
        session.set_state(now_us, SessionState.PAUSED)
        self._next_due = None

    def on_message(self, now_us: int, text: str) -> None:
        """A user message: recorded at once, answered one step later; resumes a finished
        or paused run."""
        session = self._session
        session.emit(now_us, "user", UserMessaged(user_message=text))
        if session.state == SessionState.PAUSED:
            session.set_state(now_us, self._resume_state)
        quoted = " ".join(text.split())[:80]
        if session.state in (SessionState.COMPLETED, SessionState.FAILED):
            self._follow_ups += 1
            session.set_state(now_us, SessionState.IN_PROGRESS)
            reply = f'Picking this up again: "{quoted}".'
            self._steps = deque(
                [
                    _Step("reply", partial(self._reply, reply)),
                    _Step("work", partial(self._follow_up, self._follow_ups)),
                    *self._closing(),
                ]
            )
            self._next_due = now_us + self._step_us
            return
        if session.state == SessionState.AWAITING_USER_FEEDBACK:
            session.set_state(now_us, SessionState.IN_PROGRESS)
            reply = "Thanks, that answers my question. Continuing with the plan."
        elif session.state == SessionState.AWAITING_PLAN_APPROVAL:
            reply = "Noted. I will take this into account once the plan is approved."
        else:
            reply = f'Got it, I will take this into account: "{quoted}".'
        # Replies keep the order of the messages they answer, ahead of the rest of the script;
        # a reply already scheduled keeps its time and this one follows a step after it.
        pending = next((i for i, s in enumerate(self._steps) if s.kind != "reply"), None)
        position = len(self._steps) if pending is None else pending
        self._steps.insert(position, _Step("reply", partial(self._reply, reply)))
        if position == 0 or self._next_due is None:
            self._next_due = now_us + self._step_us

    # ------------------------------------------------------------------ script

    def _script(self) -> list[_Step]:
        prompt = self._session.prompt.lower()
        steps = [_Step("start", self._start), _Step("plan", self._generate_plan)]
        if not self._session.require_plan_approval:
            steps.append(_Step("approve", self.approve_plan))
        for number, task in enumerate(self._tasks):
            steps.append(_Step("work", partial(self._work_on, task)))
            if number == 0 and ASK_WORD in prompt:
                steps.append(_Step("ask", self._ask))
            if number == 0 and FAIL_WORD in prompt:
                steps.append(_Step("fail", self._fail))
        return steps + self._closing()

    def _closing(self) -> list[_Step]:
        session = self._session
        steps = []
        has_repo = session.source_context is not None
        if session.automation_mode == AUTO_CREATE_PR and has_repo and not session.outputs:
            steps.append(_Step("pull_request", self._open_pull_request))
        steps.append(_Step("complete", self._complete))
        return steps

    def _runnable(self) -> bool:
        """Whether the next step may run: a reply always, the script only when not waiting."""
        if not self._steps:
            return False
        return self._steps[0].kind == "reply" or self._session.state not in _WAITING

    def _start(self, t: int) -> None:
        self._session.set_state(t, SessionState.PLANNING)
        self._session.emit(t, "system", None, description="Session started")

    def _generate_plan(self, t: int) -> None:
        event = PlanGenerated(plan=self._plan.model_copy(deep=True))
        activity = self._session.emit(t, "agent", event)
        event.plan.create_time = activity.create_time
        if self._session.require_plan_approval:
            self._session.set_state(t, SessionState.AWAITING_PLAN_APPROVAL)

    def _work_on(self, task: _Task, t: int) -> None:
        artifacts = self._workshop.work_on(task.kind)
        event = ProgressUpdated(title=task.title, description=task.description)
        self._session.emit(t, "agent", event, artifacts=artifacts)

    def _follow_up(self, number: int, t: int) -> None:
        artifacts = self._workshop.follow_up(number)
        event = ProgressUpdated(title="Addressing your message", description="Adjusted the change.")
        self._session.emit(t, "agent", event, artifacts=artifacts)

    def _ask(self, t: int) -> None:
        question = (
            f"Before I go on: should `{self._workshop.slug}()` keep accepting empty values "
            "for backwards compatibility, or may it raise an error?"
        )
        self._session.emit(t, "agent", AgentMessaged(agent_message=question))
        self._session.set_state(t, SessionState.AWAITING_USER_FEEDBACK)

    def _fail(self, t: int) -> None:
        reason = "The test suite kept failing after the change ([fail] in the prompt)."
        self._session.emit(t, "system", SessionFailed(reason=reason))
        self._session.set_state(t, SessionState.FAILED)
        self._steps.clear()

    def _reply(self, text: str, t: int) -> None:
        self._session.emit(t, "agent", AgentMessaged(agent_message=text))

    def _open_pull_request(self, t: int) -> None:
        session, source = self._session, self._workshop
        owner_repo = session.source_context.source if session.source_context else ""
        owner_repo = owner_repo.removeprefix("sources/github/")
        pull = PullRequest(
            url=f"https://github.com/{owner_repo}/pull/{self._rng.randint(1, 999)}",
            title=session.title,
            description=f"{session.title}\n\nAdds `{source.slug}()` with tests.",
        )
        session.outputs.append(SessionOutput(pull_request=pull))
        event = ProgressUpdated(title="Opened a pull request", description=pull.url)
        session.emit(t, "agent", event)

    def _complete(self, t: int) -> None:
        message = f"{self._session.title}\n\nAdds `{self._workshop.slug}()` with tests."
        change = self._workshop.change_set(commit_message=message)
        self._session.emit(t, "agent", SessionCompleted(), artifacts=[Artifact(change_set=change)])
        # The final change set is an output too (what public clients read generated files
        # from); a resumed session's new completion replaces it.
        outputs = [o for o in self._session.outputs if o.change_set is None]
        outputs.append(SessionOutput(change_set=change.model_copy(deep=True)))
        self._session.outputs = outputs
        self._session.set_state(t, SessionState.COMPLETED)


def format_us(time_us: int) -> str:
    """Microseconds since the epoch as the service writes timestamps (``...123456Z``)."""
    return format_timestamp(_EPOCH + timedelta(microseconds=time_us))


def to_us(moment: datetime) -> int:
    """An aware datetime as whole microseconds since the epoch (the world's time unit)."""
    return (moment - _EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class Account:
    """An account: an id and its 1-3 API keys."""

    id: str
    keys: tuple[str, ...]


@dataclass(kw_only=True, eq=False)
class SessionRecord:
    """One session: what was asked, its state, its activities; driven by its :class:`Agent`."""

    seq: int
    id: str
    account: Account
    prompt: str
    title: str
    source_context: SourceContext | None
    require_plan_approval: bool
    automation_mode: str
    create_us: int
    rng: InitVar[random.Random]
    step_us: InitVar[int]
    state: SessionState = field(default=SessionState.QUEUED, init=False)
    archived: bool = field(default=False, init=False)
    outputs: list[SessionOutput] = field(default_factory=list, init=False)
    activities: list[tuple[int, Activity]] = field(default_factory=list, init=False)
    activity_index: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self, rng: random.Random, step_us: int) -> None:
        self.name = f"sessions/{self.id}"
        self.update_us = self.create_us
        self._rng = rng
        self.agent = Agent(self, rng, step_us)

    def emit(
        self,
        time_us: int,
        originator: str,
        event: WireModel | None,
        *,
        description: str = "",
        artifacts: Sequence[Artifact] = (),
    ) -> Activity:
        """Append an activity; its createTime is ``time_us``, nudged to stay strictly increasing.

        Strictly increasing times within a session keep an exclusive ``createTime`` cursor
        from skipping an activity that shares a microsecond with the previous one.
        """
        if self.activities:
            time_us = max(time_us, self.activities[-1][0] + 1)
        activity_id = hex_id(self._rng)
        activity = Activity(
            name=f"{self.name}/activities/{activity_id}",
            id=activity_id,
            originator=originator,
            description=description,
            create_time=format_us(time_us),
            artifacts=list(artifacts),
        )
        if event is not None:
            setattr(activity, _EVENT_FIELDS[type(event)], event)
        self.activity_index[activity_id] = len(self.activities)
        self.activities.append((time_us, activity))
        self.update_us = max(self.update_us, time_us)
        return activity

    def set_state(self, time_us: int, state: SessionState) -> None:
        """Move to ``state`` at ``time_us``; ``updateTime`` follows."""
        self.state = state
        self.update_us = max(self.update_us, time_us)

    def to_session(self, *, full: bool = True) -> Session:
        """The wire model: the full session, or the reduced set list items carry."""
        reduced = Session(
            name=self.name,
            id=self.id,
            title=self.title,
            state=self.state.value,
            create_time=format_us(self.create_us),
            update_time=format_us(self.update_us),
        )
        if self.archived:  # false is a zero value: omitted, as the service omits it
            reduced.archived = True
        if not full:
            return reduced
        return reduced.model_copy(
            update={
                "prompt": self.prompt,
                "url": WEB_BASE + self.id,
                "source_context": self.source_context,
                "outputs": list(self.outputs),
            }
        )
