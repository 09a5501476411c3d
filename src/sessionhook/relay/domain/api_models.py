"""The management API's shapes (``/v1/`` on ``[server] listen``) as pydantic models: every
answer, request body, page and error. The handlers answer with them, the CLI's ``--json``
prints them and its ``--url`` mode reads a relay's answers back with them, and
:mod:`.api_paths` makes ``/openapi.json``'s ``paths`` and schemas from them.

Moments are :data:`Moment`: Unix seconds in the model (as the store keeps them), RFC 3339
in UTC with microseconds and ``Z`` on the wire (``2026-11-22T12:00:03.123456Z``). Durations
keep their names and units (``lease``, ``oldest_pending_age``, ``duration_ms``,
``eta_seconds``). A model reading an answer ignores fields it does not know (a newer relay
adds some); a key listed in :attr:`ApiModel.optional_keys` is written only when it was given.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    SkipValidation,
    WithJsonSchema,
    model_serializer,
)

from sessionhook.api.models import parse_timestamp

from .actions import ActionKind
from .delivery_states import DeliveryStatus, error_is_current

#: How long the secret a rotation replaces keeps signing, unless told (Svix's default).
DEFAULT_OVERLAP: Final = 24 * 3600.0
#: The longest message sent to an agent (a body's own bound is 64 KiB).
MAX_PROMPT: Final = 32_000


def json_stamp(ts: float) -> str:
    """Unix seconds as RFC 3339, UTC, microseconds, ``Z``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(value: object) -> object:
    """A moment read from the wire (RFC 3339) as Unix seconds; seconds stay as they are."""
    return parse_timestamp(value).timestamp() if isinstance(value, str) else value


#: A moment: Unix seconds in the model, :func:`json_stamp` on the wire.
Moment = Annotated[
    float,
    BeforeValidator(_seconds),
    PlainSerializer(json_stamp, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


class ApiModel(BaseModel):
    """A shape of the API. Its JSON Schema is made in validation mode: the serializer below
    hides the fields from a serialization-mode one (the moments are strings in both)."""

    # Built on first use: a command reads a few of these models, not all of them.
    model_config = ConfigDict(defer_build=True)

    #: Keys written only when they were given (absent otherwise, not ``null``).
    optional_keys: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _given_keys(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        for key in self.optional_keys:
            if key not in self.model_fields_set:
                data.pop(key, None)
        return data


def api_data(value: ApiModel | Sequence[ApiModel]) -> Any:
    """A model, or a list of them, as JSON data (what ``--json`` prints)."""
    if isinstance(value, ApiModel):
        return value.model_dump(mode="json")
    return [item.model_dump(mode="json") for item in value]


# --------------------------------------------------------------------------- errors


class ApiErrorDetail(ApiModel):
    code: int = Field(description="The HTTP status")
    message: str = Field(description="One line: what and why")
    status: str = Field(description="INVALID_ARGUMENT, NOT_FOUND, ...")


class ApiError(ApiModel):
    """Every error the API answers, in the Sessions API's shape."""

    error: ApiErrorDetail


# --------------------------------------------------------------------------- deliveries


class ApiDeliveryRow(ApiModel):
    """One delivery of an event to an endpoint (the webhook-id is ``event_id``)."""

    id: int
    event_id: str
    event_type: str
    endpoint: str
    session_name: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: Moment | None
    created_at: Moment
    updated_at: Moment
    delivered_at: Moment | None
    last_status_code: int | None
    last_error: str | None
    replayed: bool
    waiting_on: int | None = Field(
        default=None, description="The earlier open delivery of its session it waits behind"
    )


class ApiDelivery(ApiDeliveryRow):
    """A delivery, with the live replica attempting it now, if any."""

    claimed_by: str | None = Field(default=None, description="The replica sending it")
    claimed_at: Moment | None = None


class ApiAttempt(ApiModel):
    """One POST of a delivery, as logged (the response body capped)."""

    id: int
    delivery_id: int
    attempt: int
    started_at: Moment
    duration_ms: float
    status_code: int | None
    error: str | None
    response_body: str


class ApiDeliveryAttempts(ApiModel):
    """One delivery and every attempt (``GET /v1/deliveries/{id}``, ``attempts ID``)."""

    delivery: ApiDeliveryRow
    attempts: list[ApiAttempt]


class ApiEventAttempts(ApiModel):
    """Every delivery of an event with its attempts (``attempts EVENT --json``)."""

    event: str
    deliveries: list[ApiDeliveryAttempts]


class ApiRetried(ApiModel):
    """What ``:retry`` did (``deliveries retry --json``)."""

    delivery: ApiDelivery
    previous_status: str
    after: int | None = Field(description="An earlier delivery of its session made due first")
    message: str = Field(description="One line")


class ApiRecovered(ApiModel):
    """What ``:recover`` did (``deliveries recover --json``)."""

    recovered: int
    ids: list[int]
    following: int = Field(description="Open deliveries of the same sessions, sent after")
    reason: str | None = Field(description="Why nothing, if nothing")
    message: str = Field(description="One line")


# --------------------------------------------------------------------------- events


class ApiEvent(ApiModel):
    """An archived event; ``body`` is what the webhooks carry."""

    seq: int = Field(description="Position in ingest order")
    id: str = Field(description="The webhook-id")
    type: str
    session: str
    activity: str | None
    occurred_at: str = Field(description="The upstream's RFC 3339 time of what happened")
    archived_at: Moment
    body: dict[str, Any]


class ApiEventDetail(ApiModel):
    """One event and its deliveries."""

    event: ApiEvent
    deliveries: list[ApiDelivery]


class ApiReplayed(ApiModel):
    """What ``:replay`` queued, and why nothing when nothing."""

    queued: int
    reason: str | None
    message: str = Field(description="One line")


# --------------------------------------------------------------------------- sessions


class ApiSession(ApiModel):
    """An archived session (the upstream's fields, not the poller's bookkeeping)."""

    name: str
    id: str
    title: str
    state: str
    url: str
    source: str
    create_time: str
    update_time: str
    first_seen_at: Moment


class ApiSessionDetail(ApiModel):
    """One session and its first events (``more_events``: list the rest)."""

    session: ApiSession
    events: list[ApiEvent]
    more_events: bool


class ApiActed(ApiModel):
    """An action the Sessions API accepted."""

    ok: Literal[True]
    session: str
    detail: str


class ApiAction(ApiModel):
    """An action taken through a signed link, Slack, the console or the API."""

    taken_at: Moment
    session: str
    wait: str = Field(description="The activity the action answered")
    action: ActionKind
    account: str
    actor_kind: str = Field(description="link, slack, console, api or mcp")
    actor_address: str
    actor_agent: str
    chat_user: str | None
    token_hash: str = Field(description="SHA-256 of the link's token, never the token")
    id: int
    result: str = Field(description="pending, ok or failed")
    status: int | None = Field(description="The service's HTTP status")
    detail: str


# --------------------------------------------------------------------------- MCP tools
# What the MCP tools answer (docs/mcp.md): upstream text in them is cleaned and bounded
# (domain/agent_text.py), never the raw archive.


class ApiWait(ApiModel):
    """What a session waits for: a plan to approve, or a question to answer."""

    kind: Literal["plan_approval", "question"]
    activity: str = Field(description="The activity that opened the wait")
    plan_steps: list[str] | None = Field(description="The plan's steps (a plan_approval)")
    question: str | None = Field(description="The agent's question (a question)")


class ApiSessionItem(ApiModel):
    """A session as the MCP tools show it (text from the coding agent, bounded)."""

    session: str = Field(description="sessions/ID")
    id: str
    title: str
    state: str = Field(description="The upstream state (AWAITING_PLAN_APPROVAL, ...)")
    phase: Literal["waiting", "working", "done", "failed"]
    url: str
    updated: str = Field(description="The upstream's RFC 3339 updateTime")
    waiting_for: ApiWait | None


class ApiSessionList(ApiModel):
    """``list_sessions``: archived sessions, newest update first."""

    sessions: list[ApiSessionItem]


class ApiEventLine(ApiModel):
    """An archived event in one line."""

    id: str = Field(description="The webhook-id")
    type: str
    time: str = Field(description="The upstream's RFC 3339 time of what happened")
    summary: str


class ApiSessionView(ApiModel):
    """``get_session``: a session, what it waits for, its pull request, its last events."""

    session: ApiSessionItem
    pull_request_url: str | None
    events: list[ApiEventLine] = Field(description="The last 20 events, oldest first")


class ApiWaitAnswer(ApiModel):
    """``wait_for_session``: the first matching event, or ``timed_out``."""

    timed_out: bool
    event: ApiEventLine | None
    session: ApiSessionItem | None


class ApiCreatedSession(ApiModel):
    """``create_session``: the new session, archived."""

    session: ApiSessionItem


# --------------------------------------------------------------------------- endpoints


class ApiEndpointState(ApiModel):
    """An endpoint's state, its open deliveries and those in flight per replica (what
    ``endpoints list --json`` prints)."""

    name: str
    url: str = Field(description="User-info shown [redacted]")
    events: list[str]
    configured: bool
    enabled: bool
    disabled_reason: str | None
    disabled_at: Moment | None
    last_success_at: Moment | None
    failing_since: Moment | None
    last_error: str | None
    last_error_at: Moment | None
    created_at: Moment
    source: str = Field(description="config (the file) or api (the store)")
    description: str
    updated_at: Moment | None
    pending: int = Field(description="Open deliveries")
    in_flight: dict[str, int] = Field(description="Deliveries in flight per replica")


class ApiEndpoint(ApiEndpointState):
    """An endpoint with its definition (never its secret, but in the answer that makes
    one)."""

    optional_keys = ("definition", "previous_secret_expires_at", "secret")

    definition: dict[str, Any] | None = Field(
        default=None, description="Its keys of [[endpoints]] (when known)"
    )
    previous_secret_expires_at: Moment | None = Field(
        default=None,
        description="Created here: during a rotation's overlap, when the old secret stops signing",
    )
    secret: str | None = Field(
        default=None, description="Only in a create's or a rotation's answer"
    )


class ApiEndpointDeleted(ApiModel):
    """An endpoint deleted; its open deliveries are dead now."""

    name: str
    deleted: Literal[True]
    deliveries_closed: int
    deliveries_closed_reason: str


class ApiPing(ApiModel):
    """The answer to a signed ``ping`` sent now."""

    name: str
    ok: bool
    status_code: int | None
    error: str | None
    duration_ms: float
    response_body: str


class ApiTriggered(ApiPing):
    """The answer to a signed sample event sent now (``:trigger``): never archived, never
    retried, never counted as a delivery."""

    type: str
    webhook_id: str = Field(description="msg_trigger_ and 32 hex digits")


# --------------------------------------------------------------------------- status


class ApiEndpointSummary(ApiModel):
    """An endpoint's figures; ``*_last_hour`` count deliveries."""

    name: str
    url: str
    configured: bool
    enabled: bool
    disabled_reason: str | None
    pending: int
    oldest_pending_age: float | None = Field(description="Seconds")
    delivered_last_hour: int
    failed_last_hour: int
    dead_last_hour: int
    dead_total: int
    last_error: str | None
    last_error_at: Moment | None
    last_success_at: Moment | None
    failing_since: Moment | None

    @property
    def error_is_current(self) -> bool:
        """Whether ``last_error`` is news (no success came since)."""
        return error_is_current(self.last_error, self.last_error_at, self.last_success_at)


class ApiAccountPoll(ApiModel):
    """One account's discovery passes."""

    account: str
    last_poll_at: Moment
    last_ok_poll_at: Moment | None = Field(description="null: no pass has succeeded yet")
    list_cut: int | None = Field(
        description="Sessions its last good pass followed when its list went on past "
        "poll.max_pages; null: the whole list"
    )


class ApiUpstream(ApiModel):
    """The Sessions API as polled: the last polls, the last hour's requests. With several
    accounts, the passes' figures are of them all (each account's in ``accounts``)."""

    last_poll_at: Moment | None = Field(description="The newest pass of any account")
    last_ok_poll_at: Moment | None = Field(
        description="The oldest of the accounts' last good passes; null while one has none"
    )
    requests_last_hour: int
    throttled_last_hour: int
    errors_last_hour: int
    rejected_last_hour: int = Field(description="Of the errors: the key refused (401, 403)")
    malformed_last_hour: int = Field(description="Of the errors: 2xx answers not as promised")
    list_cut: int | None = Field(
        None,
        description="Sessions followed when the last good pass met poll.max_pages with the "
        "list going on (older ones are not followed; with several accounts, the sum over "
        "those cut); null: the whole list",
    )
    accounts: list[ApiAccountPoll] = Field(
        default_factory=list, description="Each account that has polled, by name"
    )


class ApiRefusedActivity(ApiModel):
    """An activity the relay refused to archive."""

    session_name: str
    name: str
    create_time: str
    reason: str
    detail: str
    size: int | None
    first_refused_at: Moment
    last_refused_at: Moment
    count: int


class ApiRefused(ApiModel):
    """Refused activities: in total, by reason, refused (again) in the last hour, the
    latest."""

    total: int
    by_reason: dict[str, int]
    recent: int
    latest: ApiRefusedActivity | None


class ApiHistoryWalk(ApiModel):
    """The walk of the sessions that predate the first start."""

    total: int
    done: int
    remaining: int
    sessions_per_second: float
    eta_seconds: int | None = Field(description="At the recent pace; null: unknown yet")


class ApiReplica(ApiModel):
    """A replica sharing the store, what it holds, and its health (alive, dead, stopped)."""

    id: str
    host: str
    pid: int
    started_at: Moment
    heartbeat_at: Moment
    lease: float
    stopped_at: Moment | None
    deliveries: int
    polls: int
    leases: list[str]
    health: str


class ApiStatus(ApiModel):
    """What ``sessionhook status --json`` prints."""

    now: Moment
    endpoints: list[ApiEndpointSummary]
    upstream: ApiUpstream
    sessions: int
    activities: int
    events: int
    baseline_complete: bool
    refused: ApiRefused
    history_walk: ApiHistoryWalk
    accounts: dict[str, int] = Field(description="Sessions per account")
    replicas: list[ApiReplica]


# --------------------------------------------------------------------------- pages


class ApiPage(ApiModel):
    """A page of a list: its items under the list's name (its first field), and
    ``nextPageToken`` when there is more (pass it back as ``pageToken``)."""

    optional_keys = ("nextPageToken",)

    def listed(self) -> list[Any]:
        """The page's items."""
        items: list[Any] = getattr(self, next(iter(type(self).model_fields)))
        return items

    def next_page(self) -> str | None:
        """Its ``nextPageToken`` (``None``: the last page)."""
        token: str | None = getattr(self, "nextPageToken", None)
        return token


_NEXT_PAGE = "The pageToken of the next page; absent on the last"


class ApiDeliveryPage(ApiPage):
    deliveries: list[ApiDelivery]
    nextPageToken: str | None = Field(default=None, description=_NEXT_PAGE)


class ApiEventPage(ApiPage):
    events: list[ApiEvent]
    nextPageToken: str | None = Field(default=None, description=_NEXT_PAGE)


class ApiSessionPage(ApiPage):
    sessions: list[ApiSession]
    nextPageToken: str | None = Field(default=None, description=_NEXT_PAGE)


class ApiActionPage(ApiPage):
    actions: list[ApiAction]
    nextPageToken: str | None = Field(default=None, description=_NEXT_PAGE)


class ApiEndpointPage(ApiPage):
    endpoints: list[ApiEndpoint]
    nextPageToken: str | None = Field(default=None, description=_NEXT_PAGE)


class ApiEndpointStatePage(ApiPage):
    """A page of endpoints read for their state alone (``endpoints list --url``)."""

    endpoints: list[ApiEndpointState]
    nextPageToken: str | None = None


# --------------------------------------------------------------------------- bodies


class ApiEmptyBody(ApiModel):
    """The body of an operation that takes nothing: empty or ``{}``; still read, so that a
    body that is not JSON (or names a field) is refused before anything is done."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ApiTriggerBody(ApiModel):
    model_config = ConfigDict(extra="forbid")
    type: str = Field(
        min_length=1, max_length=200, description="An event type (sessionhook trigger --list)"
    )
    session: str | None = Field(
        default=None,
        min_length=1,
        max_length=300,
        description="sessions/<id>: the sample is made from this archived session's data",
    )


class ApiRecoverBody(ApiModel):
    model_config = ConfigDict(extra="forbid")
    endpoint: str = Field(min_length=1, max_length=200)
    since: str = Field(min_length=1, max_length=100, description="RFC 3339, or an age: 1h")


class ApiReplayBody(ApiModel):
    model_config = ConfigDict(extra="forbid")
    endpoint: str = Field(min_length=1, max_length=200)


class ApiMessageBody(ApiModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT)


class ApiEndpointChange(ApiModel):
    """Keys of ``[[endpoints]]`` (``null``: back to the default) and a description. The
    definition keys are checked as the config file's are (a 400 naming the key), not here;
    their types below are what the check takes."""

    # Unknown keys reach that check too, which names them.
    model_config = ConfigDict(
        extra="allow", strict=True, json_schema_extra={"additionalProperties": False}
    )

    url: SkipValidation[str | None] = None
    events: SkipValidation[list[str] | None] = Field(default=None, description="Globs")
    accounts: SkipValidation[list[str] | None] = None
    payload: SkipValidation[Literal["full", "thin"] | None] = None
    format: SkipValidation[
        Literal["standard", "cloudevents", "slack", "discord", "google_chat", "teams"] | None
    ] = None
    template: SkipValidation[str | None] = None
    content_type: SkipValidation[str | None] = None
    filter: SkipValidation[dict[str, str | list[str]] | None] = Field(
        default=None, description="Dotted path of the payload: glob(s), all must match"
    )
    rate_limit: SkipValidation[float | None] = Field(default=None, description="Per second")
    disable_after: SkipValidation[float | str | None] = Field(
        default=None, description="Seconds, or 5d"
    )
    description: str | None = Field(default=None, json_schema_extra={"maxLength": 1000})

    def definition(self) -> dict[str, Any]:
        """The keys given but ``description`` (unknown ones too: the check names them)."""
        given = {k: getattr(self, k) for k in self.model_fields_set if k in _DEFINITION_KEYS}
        return given | (self.model_extra or {})


#: The keys of ``[[endpoints]]`` an endpoint created at run time may set, in order.
DEFINITION_KEYS: Final = tuple(k for k in ApiEndpointChange.model_fields if k != "description")
_DEFINITION_KEYS: Final = frozenset(DEFINITION_KEYS)


class ApiEndpointCreate(ApiEndpointChange):
    """A new endpoint: its name, optional secret (default: a new one) and definition."""

    name: str = Field(json_schema_extra={"maxLength": 64})
    url: SkipValidation[str]
    description: str = Field(default="", json_schema_extra={"maxLength": 1000})
    secret: str | None = Field(default=None, description="whsec_...; default: a new one")


class ApiDisableBody(ApiModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: str = Field(default="disabled through the API", min_length=1, max_length=200)


class ApiRotateBody(ApiModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    overlap: float | str = Field(
        default=DEFAULT_OVERLAP,
        description="Seconds (or 24h) the replaced secret signs too; at most 30 days",
    )
    secret: str | None = Field(default=None, description="whsec_...; default: a new one")
