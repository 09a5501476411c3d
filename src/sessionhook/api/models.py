"""Pydantic models of every resource of the Sessions API (``/v1alpha``).

One definition of the wire shapes, shared by the client, the emulator and the relay.

Rules these models follow, because real servers of this shape behave so:

* Zero values are omitted upstream (a first plan step has no ``index``, a successful
  ``bashOutput`` no ``exitCode``), so every field but a resource's ``name`` has a default.
* Unknown fields are kept, not dropped (``extra="allow"``): the API is alpha and grows,
  and the relay forwards the upstream JSON whole. :meth:`WireModel.to_wire` gives back
  exactly the keys that were received, unknown ones included.
* Python attributes are snake_case; the wire uses camelCase (aliases). Both spellings are
  accepted on input.
* Timestamps stay strings: RFC 3339 with microseconds and a trailing ``Z``, compared through
  :func:`parse_timestamp`. Keeping the text avoids reformatting the server's clock.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from pydantic.alias_generators import to_camel, to_snake


class WireModel(BaseModel):
    """Base of every wire model: camelCase aliases, unknown fields kept."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        frozen=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The JSON object as the wire carries it: camelCase, only the keys that were set.

        For a parsed resource this is the received JSON, unknown fields included.
        """
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


# --------------------------------------------------------------------------- timestamps


#: The service's own spelling (UTC, microseconds, ``Z``): read without any rewriting.
_CANONICAL = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z\Z", re.ASCII)


def parse_timestamp(value: str) -> datetime:
    """Parse an RFC 3339 timestamp (``Z`` or offset; any fraction length) to aware UTC.

    Raises :class:`ValueError` for anything else, an instant outside the years 1-9999 in UTC
    (``0001-01-01T00:00:00+01:00``) included. The service's own spelling
    (``2026-01-02T03:04:05.123456Z``, several times per archived activity) is read
    directly, ten times faster than the general way, with the same result.
    """
    if _CANONICAL.match(value):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass  # month 13 and the like: the general way says why
    return _parse_general(value)


def _parse_general(value: str) -> datetime:
    """:func:`parse_timestamp` for any RFC 3339 spelling (the fast path's reference)."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    # Python 3.11's fromisoformat takes 1..6 fraction digits; servers may send 9 (nanoseconds).
    if "." in text:
        head, _, rest = text.partition(".")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        frac, tail = rest[:digits], rest[digits:]
        text = f"{head}.{frac[:6].ljust(6, '0')}{tail}" if frac else head + tail
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"timestamp out of range: {value!r}") from None


def format_timestamp(value: datetime) -> str:
    """Format as the service does: UTC, microsecond precision, trailing ``Z``."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------- sessions


#: ``automationMode`` that makes the service open pull requests by itself (spec 4.1).
AUTO_CREATE_PR: Final = "AUTO_CREATE_PR"


class SessionState(StrEnum):
    """Known session states. ``Session.state`` is a plain string so unknown states still parse."""

    STATE_UNSPECIFIED = "STATE_UNSPECIFIED"
    QUEUED = "QUEUED"
    PLANNING = "PLANNING"
    AWAITING_PLAN_APPROVAL = "AWAITING_PLAN_APPROVAL"
    AWAITING_USER_FEEDBACK = "AWAITING_USER_FEEDBACK"
    IN_PROGRESS = "IN_PROGRESS"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class HostRepoContext(WireModel):
    """The repository part of a session's source context."""

    starting_branch: str = ""


class SourceContext(WireModel):
    """Which source (and branch) a session works on; absent for a repoless session."""

    source: str = ""
    host_repo_context: HostRepoContext | None = None
    # Beyond the interface spec: the real service and its official SDK carry them.
    working_branch: str | None = None
    environment_variables_enabled: bool | None = None


class GitPatch(WireModel):
    """A patch against a base commit, as a unified diff."""

    base_commit_id: str = ""
    unidiff_patch: str = ""
    suggested_commit_message: str = ""


class ChangeSet(WireModel):
    """Code changes on a source."""

    source: str = ""
    git_patch: GitPatch | None = None


class PullRequest(WireModel):
    """A pull request a session produced."""

    url: str = ""
    title: str = ""
    description: str = ""


class SessionOutput(WireModel):
    """One result of a session: a pull request, or the final change set.

    There is no type discriminator on the wire, only which member is present.
    """

    pull_request: PullRequest | None = None
    change_set: ChangeSet | None = None


class Session(WireModel):
    """A coding session (spec 2.1). List items carry a reduced set of fields."""

    name: str
    id: str = ""
    prompt: str = ""
    title: str = ""
    state: str = ""
    url: str = ""
    create_time: str = ""
    update_time: str = ""
    source_context: SourceContext | None = None
    outputs: list[SessionOutput] = Field(default_factory=list)
    require_plan_approval: bool | None = None
    automation_mode: str | None = None
    #: Beyond the interface spec: archived sessions are left out of the default list.
    archived: bool | None = None
    # Set by the client (mark_repaired) when it mended the answer (see :attr:`repaired`).
    _repaired: tuple[str, ...] = PrivateAttr(default=())

    @property
    def repaired(self) -> tuple[str, ...]:
        """Where the client replaced text that is not Unicode (a lone surrogate, which JSON
        lets through as ``"\\ud800"``) with U+FFFD: dotted wire paths (``title``,
        ``outputs.0.pullRequest.title``); empty for a session received as it was sent."""
        return self._repaired

    def mark_repaired(self, paths: tuple[str, ...]) -> None:
        """Record where the client mended this session's text (see :attr:`repaired`)."""
        self._repaired = paths

    @property
    def session_id(self) -> str:
        """The id part of the name (``sessions/<id>``), also when ``id`` was omitted."""
        return self.id or self.name.removeprefix("sessions/")

    @property
    def pull_requests(self) -> list[PullRequest]:
        """The pull requests among the outputs."""
        return [o.pull_request for o in self.outputs if o.pull_request is not None]


class CreateSessionRequest(WireModel):
    """Body of ``POST /v1alpha/sessions`` (spec 4.1)."""

    prompt: str
    title: str | None = None
    source_context: SourceContext | None = None
    require_plan_approval: bool | None = None
    automation_mode: str | None = None


class SendMessageRequest(WireModel):
    """Body of ``POST /v1alpha/sessions/<id>:sendMessage`` (spec 4.5)."""

    prompt: str


# --------------------------------------------------------------------------- plans


class PlanStep(WireModel):
    """One step of a plan; the first one usually arrives without ``index`` (zero)."""

    id: str = ""
    index: int = 0
    title: str = ""
    description: str = ""


class Plan(WireModel):
    """A plan generated by the agent."""

    id: str = ""
    steps: list[PlanStep] = Field(default_factory=list)
    create_time: str = ""


# --------------------------------------------------------------------------- artifacts


class BashOutput(WireModel):
    """A command the agent ran and what it printed; ``exitCode`` is omitted when zero."""

    command: str = ""
    output: str = ""
    exit_code: int = 0


class Media(WireModel):
    """Binary media (for example a PNG screenshot), base64 in ``data``."""

    mime_type: str = ""
    data: str = ""


class Artifact(WireModel):
    """An artifact holds one of ``changeSet``, ``bashOutput`` or ``media``."""

    change_set: ChangeSet | None = None
    bash_output: BashOutput | None = None
    media: Media | None = None


# --------------------------------------------------------------------------- activities


class PlanGenerated(WireModel):
    """The agent created a plan."""

    plan: Plan = Field(default_factory=Plan)


class PlanApproved(WireModel):
    """A plan was approved, by the user or automatically."""

    plan_id: str = ""


class UserMessaged(WireModel):
    """A message from the user."""

    user_message: str = ""


class AgentMessaged(WireModel):
    """A message from the agent."""

    agent_message: str = ""


class ProgressUpdated(WireModel):
    """A status update during execution."""

    title: str = ""
    description: str = ""


class SessionCompleted(WireModel):
    """The session finished successfully."""


class SessionFailed(WireModel):
    """The session met an error."""

    reason: str = ""


#: Wire name of each known event member of an Activity, in the spec's order.
EVENT_MEMBERS: tuple[str, ...] = (
    "planGenerated",
    "planApproved",
    "userMessaged",
    "agentMessaged",
    "progressUpdated",
    "sessionCompleted",
    "sessionFailed",
)


class Activity(WireModel):
    """One unit of work in a session (spec 2.4), with at most one event member at top level.

    Activities with no event member (a "session started" system activity) and with members
    this version does not know both parse; :attr:`event_member` tells which case it is.
    """

    _known_members: ClassVar[frozenset[str]] = frozenset(EVENT_MEMBERS)

    name: str
    id: str = ""
    originator: str = ""
    description: str = ""
    create_time: str = ""
    artifacts: list[Artifact] = Field(default_factory=list)
    plan_generated: PlanGenerated | None = None
    plan_approved: PlanApproved | None = None
    user_messaged: UserMessaged | None = None
    agent_messaged: AgentMessaged | None = None
    progress_updated: ProgressUpdated | None = None
    session_completed: SessionCompleted | None = None
    session_failed: SessionFailed | None = None

    @property
    def event_member(self) -> str | None:
        """The wire name of the populated known event member, or ``None`` (none, or unknown)."""
        for member, attribute in _MEMBER_ATTRIBUTES:
            if getattr(self, attribute) is not None:
                return member
        return None

    @property
    def unknown_members(self) -> list[str]:
        """Top-level keys holding objects that this version does not know (future members)."""
        extra = self.model_extra or {}
        return [key for key, value in extra.items() if isinstance(value, dict)]

    @property
    def session_name(self) -> str:
        """``sessions/<id>`` taken from the activity's name."""
        parts = self.name.split("/")
        return "/".join(parts[:2]) if len(parts) >= 2 else ""


#: (wire name, attribute) of each event member, computed once (event_member is on the
#: ingest path of every activity).
_MEMBER_ATTRIBUTES = tuple((member, to_snake(member)) for member in EVENT_MEMBERS)


# --------------------------------------------------------------------------- sources


class Branch(WireModel):
    """A branch of a source repository."""

    display_name: str = ""


class HostRepo(WireModel):
    """The hosted repository behind a source."""

    owner: str = ""
    repo: str = ""
    is_private: bool = False
    default_branch: Branch | None = None
    branches: list[Branch] = Field(default_factory=list)


class Source(WireModel):
    """A connected repository (spec 2.7); names contain slashes (``sources/github/o/r``)."""

    name: str
    id: str = ""
    host_repo: HostRepo | None = None


# --------------------------------------------------------------------------- lists and errors


class ListSessionsResponse(WireModel):
    """A page of sessions; the last page has no ``nextPageToken``."""

    sessions: list[Session] = Field(default_factory=list)
    next_page_token: str = ""


class ListActivitiesResponse(WireModel):
    """A page of activities, oldest first."""

    activities: list[Activity] = Field(default_factory=list)
    next_page_token: str = ""


class ListSourcesResponse(WireModel):
    """A page of sources."""

    sources: list[Source] = Field(default_factory=list)
    next_page_token: str = ""


class ErrorDetail(WireModel):
    """The ``error`` object of an error body."""

    code: int = 0
    message: str = ""
    status: str = ""
    details: list[dict[str, Any]] = Field(default_factory=list)


class ErrorBody(WireModel):
    """``{"error": {"code", "message", "status", "details"}}``."""

    error: ErrorDetail = Field(default_factory=ErrorDetail)
