"""What a black-box test makes happen upstream: scripted lives of sessions (:func:`script`)
played on the stand-in by a :class:`World`, which keeps the truth the deliveries are
checked against (states, pull requests, activities in order)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.support.standin import StandIn

Step = tuple[str, Any, dict[str, Any]]


def bash(command: str, output: str) -> dict[str, Any]:
    return {"bashOutput": {"command": command, "output": output}}  # exitCode 0: omitted


def change_set(message: str | None = None) -> dict[str, Any]:
    patch: dict[str, Any] = {"baseCommitId": "9f2c1e0d4b3a"}
    if message is not None:
        patch["unidiffPatch"] = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
        patch["suggestedCommitMessage"] = message
    return {"changeSet": {"source": "sources/github/acme/api", "gitPatch": patch}}


def script(kind: str) -> list[Step]:
    """A plausible life of a session: activities (member, kwargs) and state moves."""
    start: list[Step] = [
        ("state", "PLANNING", {}),
        ("activity", None, {"description": "Session started"}),
        ("activity", "planGenerated", {}),
    ]
    if kind == "resumed":  # COMPLETED is not final: a user message resumes the session
        return [
            *script("pr"),
            ("activity", "userMessaged", {}),
            ("state", "IN_PROGRESS", {}),
            ("activity", "agentMessaged", {}),
            ("activity", "sessionCompleted", {}),
            ("state", "COMPLETED", {}),
        ]
    if kind == "pr":
        return [
            *start,
            ("activity", "planApproved", {}),
            ("state", "IN_PROGRESS", {}),
            ("activity", "progressUpdated", {"artifacts": [bash("pytest -q", "3 passed")]}),
            ("activity", "progressUpdated", {"artifacts": [change_set()]}),
            ("activity", "agentMessaged", {}),
            ("activity", "sessionCompleted", {"artifacts": [change_set("Fix the login test")]}),
            ("pr", "https://github.example.test/acme/api/pull/7", {}),
            ("state", "COMPLETED", {}),
        ]
    if kind == "feedback":
        return [
            *start,
            ("state", "AWAITING_PLAN_APPROVAL", {}),
            ("activity", "planApproved", {}),
            ("state", "IN_PROGRESS", {}),
            ("activity", "agentMessaged", {}),
            ("state", "AWAITING_USER_FEEDBACK", {}),
            ("activity", "userMessaged", {}),
            ("state", "IN_PROGRESS", {}),
            ("activity", "toolCallCompleted", {"payload": {"tool": "grep", "ok": True}}),
            ("activity", "progressUpdated", {}),
            ("activity", "sessionCompleted", {}),
            ("state", "COMPLETED", {}),
        ]
    if kind == "fail":
        return [
            *start,
            ("activity", "planApproved", {}),
            ("state", "IN_PROGRESS", {}),
            ("activity", "progressUpdated", {"artifacts": [bash("make", "error 2")]}),
            ("activity", "sessionFailed", {}),
            ("state", "FAILED", {}),
        ]
    if kind == "short":
        return [
            ("state", "IN_PROGRESS", {}),
            ("activity", None, {"description": "Session started"}),
            ("activity", "planGenerated", {}),
            ("activity", "progressUpdated", {}),
            ("activity", "sessionCompleted", {}),
            ("state", "COMPLETED", {}),
        ]
    raise ValueError(kind)


@dataclass
class World:
    """What the test made happen upstream (the truth the deliveries are checked against)."""

    standin: StandIn
    states: dict[str, list[str]] = field(default_factory=dict)  # state history per session
    prs: dict[str, list[str]] = field(default_factory=dict)
    pending: dict[str, list[Step]] = field(default_factory=dict)

    def add(self, kind: str, **kwargs: Any) -> str:
        name = self.standin.add_session(f"{kind} task", **kwargs)
        self.states[name] = [self.standin.session(name)["state"]]
        self.prs[name] = []
        self.pending[name] = script(kind)
        return name

    def step(self, name: str) -> bool:
        """Do the next step of a session's script; False when it had none left."""
        if not self.pending[name]:
            return False
        what, arg, kwargs = self.pending[name].pop(0)
        if what == "state":
            self.standin.set_state(name, arg)
            self.states[name].append(arg)
        elif what == "pr":
            self.standin.add_pull_request(name, arg)
            self.prs[name].append(arg)
        else:
            self.standin.append_activity(name, arg, **kwargs)
        return True

    def play(
        self, rounds: int | None = None, pause: float = 0.0, only: Iterable[str] | None = None
    ) -> None:
        """Round-robin over the sessions (or ``only`` these), one step each per round."""
        names = list(self.pending if only is None else only)
        done = 0
        while rounds is None or done < rounds:
            progressed = [self.step(name) for name in names]
            if not any(progressed):
                return
            done += 1
            if pause:
                time.sleep(pause)

    def activity_names(self) -> set[str]:
        return set(self.standin.all_activities())

    def order(self) -> dict[str, list[str]]:
        return {name: [a["name"] for a in self.standin.activities(name)] for name in self.states}


# --------------------------------------------------------------------------- checks


def preload(standin: StandIn, sessions: int, per_session: int) -> dict[str, list[str]]:
    """Sessions with their whole history already upstream; activity names in order."""
    order: dict[str, list[str]] = {}
    for i in range(sessions):
        name = standin.add_session(f"Busy {i}", state="IN_PROGRESS")
        order[name] = [
            standin.append_activity(name, "progressUpdated")["name"] for _ in range(per_session)
        ]
    return order
