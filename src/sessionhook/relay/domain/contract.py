"""The webhook contract as pydantic models, and the OpenAPI 3.1 document made from them.

Each event type has a model of its body (what ``format = "standard"`` sends); the
document's ``webhooks`` section has one entry per event type, whose request body is that
model or, for endpoints with ``payload = "thin"``, :class:`ThinEvent`; its ``paths`` are
the management API's, made from its operations and models (:mod:`.api_paths`). Consumers in
any language can generate types from it. The document is shipped in the package
(``relay/domain/openapi.json``, kept equal to :func:`openapi_document` by a test) and served at
``/openapi.json`` by the daemon's health server.

Every object allows properties it does not list: upstream grows (the API is alpha) and so
may the relay, additively; consumers must ignore what they do not know.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from sessionhook import __version__
from sessionhook.api.models import Activity, PullRequest

from .api_paths import SECURITY_SCHEMES, api_document
from .events import ACTIVITY_EVENT_TYPES, ACTIVITY_SESSION_STARTED, ACTIVITY_UNKNOWN, EVENT_TYPES


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class SessionSummary(_Open):
    """``data.session``: the session as the relay last saw it (its state may be stale in an
    activity event: the activity can be older than the last poll)."""

    name: str = Field(description="sessions/<id>")
    id: str
    title: str
    state: str = Field(description="QUEUED, PLANNING, AWAITING_PLAN_APPROVAL, ...")
    url: str = Field(description="Link to the session in the service's web app")
    source: str = Field(description="sourceContext.source; empty for a repoless session")
    createTime: str
    updateTime: str
    prompt: str | None = Field(default=None, description="Present when the session has one")
    outputs: list[dict[str, Any]] | None = Field(
        default=None, description="The session's outputs as upstream sends them, when any"
    )


class _AccountData(_Open):
    account: str = Field(
        default="default",
        description="The [[accounts]] entry whose session this is (`default` for [api])",
    )
    sample: bool | None = Field(
        default=None,
        description="true in a sample event (sessionhook trigger, webhook-id msg_trigger_...): "
        "nothing happened upstream; absent in real events",
    )


class _Event(_Open):
    timestamp: str = Field(description="RFC 3339 upstream time of what happened")


class ActivityData(_AccountData):
    session: SessionSummary
    activity: Activity = Field(description="The upstream activity whole (large media trimmed)")


#: Every activity event type: one per known member, the system's "Session started" notice
#: (no member), and an unknown member.
_ACTIVITY_TYPES = (*ACTIVITY_EVENT_TYPES.values(), ACTIVITY_SESSION_STARTED, ACTIVITY_UNKNOWN)


class ActivityEvent(_Event):
    """An activity of a session (one event per activity, id from its name)."""

    type: Literal[_ACTIVITY_TYPES]  # type: ignore[valid-type]
    data: ActivityData


class SessionData(_AccountData):
    session: SessionSummary


class SessionDiscoveredEvent(_Event):
    """The relay saw the session for the first time."""

    type: Literal["session.discovered"]
    data: SessionData


class SessionArchivedEvent(_Event):
    """The session was archived (the service leaves it out of its default list; a working
    one pauses). Beyond the interface spec: the real service and its official SDK."""

    type: Literal["session.archived"]
    data: SessionData


class SessionUnarchivedEvent(_Event):
    """The session was unarchived: back in the service's default list."""

    type: Literal["session.unarchived"]
    data: SessionData


class StateChangedData(_AccountData):
    session: SessionSummary
    previous_state: str


class SessionStateChangedEvent(_Event):
    """A snapshot: the state differs from the last poll's (states in between can be skipped)."""

    type: Literal["session.state_changed"]
    data: StateChangedData


class PullRequestData(_AccountData):
    session: SessionSummary
    pull_request: PullRequest


class SessionPullRequestOpenedEvent(_Event):
    """A pull request appeared in the session's outputs."""

    type: Literal["session.pull_request_opened"]
    data: PullRequestData


class PlanStepSummary(_Open):
    id: str
    index: int
    title: str
    description: str


class PlanSummary(_Open):
    id: str
    steps: list[PlanStepSummary]


class ApiCall(_Open):
    """The Sessions API call that ends the wait (path relative to the API's base URL)."""

    method: Literal["POST"]
    path: str = Field(description="/v1alpha/sessions/<id>:approvePlan or :sendMessage")
    body: dict[str, Any]


class WaitLinks(_Open):
    """Signed links of the wait (with ``[actions]`` enabled): each works until it expires
    (``actions.link_ttl``), once, and only while the session still waits for this wait."""

    approve: str | None = Field(
        default=None,
        description="approve_plan: a page that approves the plan (GET shows, POST acts)",
    )
    reply: str | None = Field(
        default=None,
        description="answer: a page that sends the agent a reply (GET shows, POST acts)",
    )
    open: str = Field(description="The session's timeline in the relay's console")


class ActionRequiredData(_AccountData):
    session: SessionSummary
    activity_name: str | None = Field(description="The planGenerated / agentMessaged activity")
    action: Literal["approve_plan", "answer"]
    plan: PlanSummary | None = Field(default=None, description="approve_plan: the plan")
    question: str | None = Field(default=None, description="answer: the agent's message")
    call: ApiCall
    links: WaitLinks | None = Field(
        default=None, description="Present when the relay's [actions] are enabled"
    )


class SessionActionRequiredEvent(_Event):
    """The session waits for its user: approve the plan, or answer the agent. Once per wait."""

    type: Literal["session.action_required"]
    data: ActionRequiredData


class FileChange(_Open):
    path: str
    added: int
    removed: int


class ChangeSetSummary(_Open):
    source: str
    base_commit_id: str
    suggested_commit_message: str
    files: list[FileChange]
    files_changed: int
    lines_added: int
    lines_removed: int


class PullRequestSummary(_Open):
    url: str
    title: str


class CompletedOutputs(_Open):
    pull_requests: list[PullRequestSummary]
    change_set: ChangeSetSummary | None = Field(
        description="From outputs[].changeSet, else the final sessionCompleted change set"
    )


class CompletedData(_AccountData):
    session: SessionSummary
    activity_name: str | None = Field(description="The sessionCompleted activity")
    outputs: CompletedOutputs


class SessionCompletedEvent(_Event):
    """The session completed. Once per completion: a resumed session completes again."""

    type: Literal["session.completed"]
    data: CompletedData


class FailedData(_AccountData):
    session: SessionSummary
    activity_name: str | None = Field(description="The sessionFailed activity")
    reason: str


class SessionFailedEvent(_Event):
    """The session failed."""

    type: Literal["session.failed"]
    data: FailedData


class ThinActivity(_Open):
    name: str
    id: str | None = None
    createTime: str | None = None
    originator: str | None = None


class ThinSession(_Open):
    name: str
    id: str
    title: str
    state: str
    url: str
    source: str
    createTime: str
    updateTime: str


class ThinData(_AccountData):
    session: ThinSession
    activity: ThinActivity | None = None
    previous_state: str | None = None
    action: str | None = None
    activity_name: str | None = None
    pull_request: PullRequestSummary | None = None


class ThinEvent(_Event):
    """``payload = "thin"``: type, ids and the session summary, for consumers that fetch the
    details themselves (no artifacts, media, plan or message text)."""

    type: str
    data: ThinData


class CloudEvent(_Open):
    """``format = "cloudevents"``: CloudEvents 1.0, structured JSON mode, around ``data``."""

    specversion: Literal["1.0"]
    id: str = Field(description="The webhook-id")
    source: str = Field(description="The session name, sessions/<id>")
    type: str = Field(description="The event type")
    time: str = Field(description="RFC 3339 upstream time of what happened")
    subject: str | None = Field(default=None, description="The activity, when there is one")
    datacontenttype: Literal["application/json"]
    data: dict[str, Any] = Field(description="The event's data (full or thin)")


#: Event type -> model of its full body.
EVENT_MODELS: dict[str, type[BaseModel]] = {
    "session.discovered": SessionDiscoveredEvent,
    "session.state_changed": SessionStateChangedEvent,
    "session.pull_request_opened": SessionPullRequestOpenedEvent,
    "session.archived": SessionArchivedEvent,
    "session.unarchived": SessionUnarchivedEvent,
    "session.action_required": SessionActionRequiredEvent,
    "session.completed": SessionCompletedEvent,
    "session.failed": SessionFailedEvent,
    **{t: ActivityEvent for t in _ACTIVITY_TYPES},
}

_HEADERS = (
    ("webhook-id", "Event id: stable across retries (deduplicate on it)"),
    ("webhook-timestamp", "Unix seconds of this attempt"),
    (
        "webhook-signature",
        "Space-separated v1,<base64 HMAC-SHA256> (whsec_ secrets) or v1a,<base64 ed25519> "
        '(signature = "v1a") signatures of "{webhook-id}.{webhook-timestamp}.{body}"',
    ),
)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document: a ``webhooks`` entry per event type, schemas in
    ``components``. Deterministic (same input, same document)."""
    models: list[type[BaseModel]] = list(
        dict.fromkeys([*EVENT_MODELS.values(), ThinEvent, CloudEvent])
    )
    paths, api_models = api_document()
    # The API's models in validation mode (see api_models.ApiModel), in one namespace with
    # the webhooks' (a name taken twice would be told apart, not overwritten).
    _, schemas = models_json_schema(
        [(m, "serialization") for m in models] + [(m, "validation") for m in api_models],
        ref_template="#/components/schemas/{model}",
    )
    webhooks: dict[str, Any] = {}
    for event_type in EVENT_TYPES:
        model = EVENT_MODELS[event_type]
        ref = {"$ref": f"#/components/schemas/{model.__name__}"}
        data_model = model.model_fields["data"].annotation
        assert isinstance(data_model, type)
        cloud_event = {
            "allOf": [
                {"$ref": "#/components/schemas/CloudEvent"},
                {
                    "properties": {
                        "type": {"const": event_type},
                        "data": {
                            "anyOf": [
                                {"$ref": f"#/components/schemas/{data_model.__name__}"},
                                {"$ref": "#/components/schemas/ThinData"},
                            ]
                        },
                    }
                },
            ]
        }
        webhooks[event_type] = {
            "post": {
                "operationId": event_type.replace(".", "_"),
                "summary": (model.__doc__ or "").strip().splitlines()[0],
                "parameters": [
                    {
                        "name": n,
                        "in": "header",
                        "required": True,
                        "description": d,
                        "schema": {"type": "string"},
                    }
                    for n, d in _HEADERS
                ],
                "requestBody": {
                    "required": True,
                    "description": 'The standard JSON body; endpoints with payload = "thin" '
                    'get a ThinEvent; format = "cloudevents" wraps the data in a CloudEvent. '
                    "Chat presets and templates are made from the same body.",
                    "content": {
                        "application/json": {
                            "schema": {"anyOf": [ref, {"$ref": "#/components/schemas/ThinEvent"}]}
                        },
                        "application/cloudevents+json": {"schema": cloud_event},
                    },
                },
                "responses": {
                    "2XX": {"description": "Delivered"},
                    "410": {"description": "Gone: the relay disables the endpoint"},
                    "default": {"description": "Retried per the schedule (Retry-After honoured)"},
                },
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sessionhook webhooks",
            "version": __version__,
            "description": "Events sessionhook delivers, signed per Standard Webhooks; "
            "the management API (paths under /v1/, the console's token as a bearer).",
        },
        "paths": paths,
        "webhooks": webhooks,
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": SECURITY_SCHEMES,
        },
    }


@functools.cache
def shipped_document() -> dict[str, Any]:
    """The document shipped in the package (``relay/domain/openapi.json``)."""
    text = (resources.files(__package__) / "openapi.json").read_text("utf-8")
    document: dict[str, Any] = json.loads(text)
    return document
