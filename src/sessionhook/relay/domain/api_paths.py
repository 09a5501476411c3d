"""The management API's operations (``/v1/`` on ``[server] listen``), one entry each: method,
path, what it answers and refuses, its query, body and answer (models of
:mod:`.api_models`). The web layer serves each at its path (``web.answers.api_route``);
:func:`api_document` makes the OpenAPI document's ``paths`` and the schemas they name, which
:func:`~.contract.openapi_document` puts beside the webhooks.

Every list is a page (``pageSize``, ``pageToken``; ``nextPageToken`` only when there is
more); every error is an :class:`~.api_models.ApiError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, Field

from .api_models import (
    ApiActed,
    ApiActionPage,
    ApiDeliveryAttempts,
    ApiDeliveryPage,
    ApiDisableBody,
    ApiEmptyBody,
    ApiEndpoint,
    ApiEndpointChange,
    ApiEndpointCreate,
    ApiEndpointDeleted,
    ApiEndpointPage,
    ApiError,
    ApiEventDetail,
    ApiEventPage,
    ApiMessageBody,
    ApiModel,
    ApiPing,
    ApiRecoverBody,
    ApiRecovered,
    ApiReplayBody,
    ApiReplayed,
    ApiRetried,
    ApiRotateBody,
    ApiSessionDetail,
    ApiSessionPage,
    ApiStatus,
    ApiTriggerBody,
    ApiTriggered,
)

#: The token of the console and the event stream (``Authorization: Bearer``); Slack's
#: request signature for the one route Slack calls.
SECURITY_SCHEMES: Final = {
    "bearer": {"type": "http", "scheme": "bearer"},
    "slackSignature": {
        "type": "apiKey",
        "in": "header",
        "name": "X-Slack-Signature",
        "description": "v0=HMAC-SHA256(signing secret, 'v0:' + X-Slack-Request-Timestamp + "
        "':' + raw body), the timestamp within 5 minutes",
    },
}

#: What each error status means, unless an operation says otherwise.
_ERRORS: Final = {
    400: "Invalid argument (one line says which)",
    401: "No token, or a wrong one",
    404: "No such thing",
    409: "Not possible in its state",
    413: "Larger than the operation takes (a JSON body: 64 KiB)",
    415: "Not a JSON body",
    502: "The Sessions API refused",
    503: "Not available now (the store is opening; this relay cannot act)",
}
#: What an operation that reads a JSON body answers for one it cannot read.
_BODY_ERRORS: Final = (400, 413, 415)
_JSON: Final = "application/json"
_PATH_PARAMETER: Final = re.compile(r"\{(\w+)\}")
#: What the parameter in a path names, by the collection it is in.
_NAMED: Final = {
    "deliveries": "A delivery id",
    "events": "An event id (the webhook-id)",
    "sessions": "The session's id (the part after sessions/)",
    "endpoints": "The endpoint's name",
}


class ApiSlackForm(BaseModel):
    """What Slack posts (``application/x-www-form-urlencoded``)."""

    payload: str = Field(description="Slack's JSON payload")


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation of the API: its method and path, what it does, the model of its
    success (``answer``; ``None``: the body ``content`` describes) and the statuses it
    answers besides 401 (``errors``; and 400, 413 and 415 when it reads a JSON ``body``;
    ``error_words`` where one means more than :data:`_ERRORS` says). ``query`` and
    ``headers``: its parameters (name, description); ``paged`` adds ``pageSize`` and
    ``pageToken``."""

    method: str
    path: str
    summary: str
    answer: type[ApiModel] | None
    errors: tuple[int, ...] = ()
    query: tuple[tuple[str, str], ...] = ()
    paged: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    body: type[BaseModel] | None = None
    body_type: str = _JSON
    status: int = 200
    content: str = _JSON
    content_words: str = "OK"
    security: str = "bearer"
    error_words: tuple[tuple[int, str], ...] = ()


def _op(
    route: str, summary: str, answer: type[ApiModel] | None, *errors: int, **more: Any
) -> Operation:
    """The operation at ``route`` (``"GET /v1/status"``)."""
    method, path = route.split(" ")
    return Operation(method, path, summary, answer, errors, **more)


_SESSION: Final = ("session", "Only this session (sessions/...)")

#: Every operation by its operationId, in the order of the document.
OPERATIONS: Final[dict[str, Operation]] = {
    "getStatus": _op("GET /v1/status", "What `sessionhook status --json` prints", ApiStatus, 503),
    "listEndpoints": _op(
        "GET /v1/endpoints",
        "Every endpoint (the config file's and those created here), by name",
        ApiEndpointPage,
        400,
        paged=True,
    ),
    "createEndpoint": _op(
        "POST /v1/endpoints",
        "Create one in the store; its secret is in this answer only",
        ApiEndpoint,
        409,
        body=ApiEndpointCreate,
        status=201,
    ),
    "getEndpoint": _op("GET /v1/endpoints/{name}", "One endpoint", ApiEndpoint, 404),
    "replaceEndpoint": _op(
        "PUT /v1/endpoints/{name}",
        "Replace the definition (409: the config file's)",
        ApiEndpoint,
        *(404, 409),
        body=ApiEndpointChange,
    ),
    "updateEndpoint": _op(
        "PATCH /v1/endpoints/{name}",
        "Change keys of the definition; null: the default (409: the config file's)",
        ApiEndpoint,
        *(404, 409),
        body=ApiEndpointChange,
    ),
    "deleteEndpoint": _op(
        "DELETE /v1/endpoints/{name}",
        "Delete one created here; its open deliveries become dead (endpoint deleted)",
        ApiEndpointDeleted,
        *(404, 409),
    ),
    "enableEndpoint": _op(
        "POST /v1/endpoints/{name}:enable", "Enable it", ApiEndpoint, 404, body=ApiEmptyBody
    ),
    "disableEndpoint": _op(
        "POST /v1/endpoints/{name}:disable",
        "Disable it (reason: optional)",
        ApiEndpoint,
        404,
        body=ApiDisableBody,
    ),
    "testEndpoint": _op(
        "POST /v1/endpoints/{name}:test",
        "Send it a signed ping now",
        ApiPing,
        404,
        503,
        body=ApiEmptyBody,
    ),
    "triggerEndpoint": _op(
        "POST /v1/endpoints/{name}:trigger",
        "Send it a signed sample event of a type now, as its delivery would be",
        ApiTriggered,
        *(400, 404),
        503,
        body=ApiTriggerBody,
    ),
    "rotateEndpointSecret": _op(
        "POST /v1/endpoints/{name}:rotateSecret",
        "A new secret (in this answer only); the old one signs too for overlap seconds",
        ApiEndpoint,
        *(404, 409),
        body=ApiRotateBody,
    ),
    "listDeliveries": _op(
        "GET /v1/deliveries",
        "The delivery log, newest first",
        ApiDeliveryPage,
        *(400, 404),
        query=(
            ("endpoint", "Only this endpoint"),
            ("status", "pending, failed, delivered or dead"),
            _SESSION,
            ("event", "Only this event (the webhook-id)"),
        ),
        paged=True,
    ),
    "recoverDeliveries": _op(
        "POST /v1/deliveries:recover",
        "Every failed or dead delivery of an endpoint since a time, due now",
        ApiRecovered,
        404,
        body=ApiRecoverBody,
    ),
    "retryDelivery": _op(
        "POST /v1/deliveries/{id}:retry",
        "Send it again now: same webhook-id and body; its session's order kept",
        ApiRetried,
        *(404, 409),
        body=ApiEmptyBody,
    ),
    "getDelivery": _op(
        "GET /v1/deliveries/{id}", "One delivery and every attempt", ApiDeliveryAttempts, 400, 404
    ),
    "listEvents": _op(
        "GET /v1/events",
        "Archived events in ingest order",
        ApiEventPage,
        400,
        query=(("type", "A type or a glob (session.*)"), _SESSION),
        paged=True,
    ),
    "streamEvents": _op(
        "GET /v1/events/stream",
        "The events as Server-Sent Events, live, from the newest or after the one named; "
        "each message: id (the webhook-id), event (the type), data (the body as delivered)",
        None,
        *(400, 503),
        query=(
            ("type", "A type or a glob (session.*); repeat: any one"),
            _SESSION,
            ("last_event_id", "Start after this event (Last-Event-ID wins)"),
        ),
        headers=(("Last-Event-ID", "Start after this event (what EventSource sends)"),),
        content="text/event-stream",
        content_words="A stream that ends only when the relay stops (then reconnect with "
        "Last-Event-ID)",
        error_words=((503, "The store is not open yet, or too many streams (Retry-After)"),),
    ),
    "replayEvent": _op(
        "POST /v1/events/{id}:replay",
        "Queue it again for an endpoint (same webhook-id and body)",
        ApiReplayed,
        404,
        body=ApiReplayBody,
    ),
    "getEvent": _op(
        "GET /v1/events/{id}", "One event and its deliveries", ApiEventDetail, 400, 404
    ),
    "listSessions": _op(
        "GET /v1/sessions", "Archived sessions by name", ApiSessionPage, 400, paged=True
    ),
    "approvePlan": _op(
        "POST /v1/sessions/{id}:approvePlan",
        "Approve the session's plan, with the session's account",
        ApiActed,
        *(404, 502, 503),
        body=ApiEmptyBody,
    ),
    "sendMessage": _op(
        "POST /v1/sessions/{id}:sendMessage",
        "Send the agent a message, with the session's account",
        ApiActed,
        *(404, 502, 503),
        body=ApiMessageBody,
    ),
    "getSession": _op(
        "GET /v1/sessions/{id}",
        "One session and its first 200 events (more_events: list the rest)",
        ApiSessionDetail,
        *(400, 404),
    ),
    "listActions": _op(
        "GET /v1/actions",
        "Actions taken through signed links, Slack, the console or the API, newest first",
        ApiActionPage,
        *(400, 503),
        query=(("session", "Only this session's (sessions/<id>)"),),
        paged=True,
    ),
    "slackInteractions": _op(
        "POST /v1/integrations/slack/interactions",
        "Slack's interactivity requests (block_actions of the buttons): answered at once, "
        "acted on after, the message updated through response_url",
        None,
        *(400, 404, 413),
        body=ApiSlackForm,
        body_type="application/x-www-form-urlencoded",
        content="",
        content_words="Received",
        security="slackSignature",
        error_words=(
            (401, "Not signed by Slack, or signed too long ago"),
            (413, "Larger than 256 KiB"),
        ),
    ),
}

_PAGE: Final = (
    {
        "name": "pageSize",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": 200},
    },
    {
        "name": "pageToken",
        "in": "query",
        "description": "nextPageToken of the previous page",
        "schema": {"type": "string"},
    },
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _parameters(op: Operation) -> list[dict[str, Any]]:
    about = _NAMED.get(op.path.split("/")[2].split(":")[0], "")
    found: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "description": about}
        for name in _PATH_PARAMETER.findall(op.path)
    ]
    found += [{"name": n, "in": "query", "description": d} for n, d in op.query]
    found += [{"name": n, "in": "header", "description": d} for n, d in op.headers]
    for parameter in found:
        parameter["schema"] = {"type": "string"}
    return found + list(_PAGE if op.paged else ())


def _body_errors(op: Operation) -> tuple[int, ...]:
    return _BODY_ERRORS if op.body is not None and op.body_type == _JSON else ()


def _operation(operation_id: str, op: Operation) -> dict[str, Any]:
    words = {**_ERRORS, **dict(op.error_words)}
    success: dict[str, Any] = {"description": op.content_words}
    if op.content:
        schema = _ref(op.answer) if op.answer is not None else {"type": "string"}
        success["content"] = {op.content: {"schema": schema}}
    errors = {
        str(code): {
            "description": words[code],
            "content": {"application/json": {"schema": _ref(ApiError)}},
        }
        for code in sorted({401, *op.errors, *_body_errors(op)})
    }
    described: dict[str, Any] = {
        "operationId": operation_id,
        "summary": op.summary,
        "security": [{op.security: []}],
    }
    if parameters := _parameters(op):
        described["parameters"] = parameters
    if op.body is not None:
        described["requestBody"] = {
            "required": op.body is not ApiEmptyBody,
            "content": {op.body_type: {"schema": _ref(op.body)}},
        }
    described["responses"] = {str(op.status): success, **errors}
    return described


def api_document() -> tuple[dict[str, Any], list[type[BaseModel]]]:
    """The document's ``paths`` (every operation with its parameters, body, answers and
    errors) and the models whose schemas they name."""
    paths: dict[str, Any] = {}
    models: list[type[BaseModel]] = [ApiError]
    for operation_id, op in OPERATIONS.items():
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(operation_id, op)
        models += [m for m in (op.answer, op.body) if m is not None]
    return paths, list(dict.fromkeys(models))
