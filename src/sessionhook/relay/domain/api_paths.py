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
)

__all__ = ["OPERATIONS", "SECURITY_SCHEMES", "Operation", "api_document"]

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


class ApiSlackForm(BaseModel):
    """What Slack posts (``application/x-www-form-urlencoded``)."""

    payload: str = Field(description="Slack's JSON payload")


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation of the API. ``answer``: the model of its success (``None``: the body
    ``content`` describes); ``query``: its query parameters (name, description; ``paged``
    adds ``pageSize`` and ``pageToken``), ``headers`` its request headers, ``about`` its
    path parameters' descriptions; ``body`` the model of its request body; ``errors`` the
    statuses it answers besides 401, and 400, 413 and 415 when it reads a JSON body
    (``error_words`` where one means more)."""

    method: str
    path: str
    summary: str
    answer: type[ApiModel] | None
    errors: tuple[int, ...] = ()
    about: str = ""
    query: tuple[tuple[str, str], ...] = ()
    paged: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    body: type[BaseModel] | None = None
    body_type: str = _JSON
    status: int = 200
    content: str = "application/json"
    content_words: str = "OK"
    security: str = "bearer"
    error_words: tuple[tuple[int, str], ...] = ()


_DELIVERY = "A delivery id"
_EVENT = "An event id (the webhook-id)"
_SESSION = "The session's id (the part after sessions/)"
_ENDPOINT = "The endpoint's name"
_EDIT = (400, 404, 409)

#: Every operation by its operationId, in the order of the document.
OPERATIONS: Final[dict[str, Operation]] = {
    "getStatus": Operation(
        "GET", "/v1/status", "What `sessionhook status --json` prints", ApiStatus, (503,)
    ),
    "listEndpoints": Operation(
        "GET",
        "/v1/endpoints",
        "Every endpoint (the config file's and those created here), by name",
        ApiEndpointPage,
        (400,),
        paged=True,
    ),
    "createEndpoint": Operation(
        "POST",
        "/v1/endpoints",
        "Create one in the store; its secret is in this answer only",
        ApiEndpoint,
        (400, 409),
        body=ApiEndpointCreate,
        status=201,
    ),
    "getEndpoint": Operation(
        "GET", "/v1/endpoints/{name}", "One endpoint", ApiEndpoint, (404,), _ENDPOINT
    ),
    "replaceEndpoint": Operation(
        "PUT",
        "/v1/endpoints/{name}",
        "Replace the definition (409: the config file's)",
        ApiEndpoint,
        _EDIT,
        _ENDPOINT,
        body=ApiEndpointChange,
    ),
    "updateEndpoint": Operation(
        "PATCH",
        "/v1/endpoints/{name}",
        "Change keys of the definition; null: the default (409: the config file's)",
        ApiEndpoint,
        _EDIT,
        _ENDPOINT,
        body=ApiEndpointChange,
    ),
    "deleteEndpoint": Operation(
        "DELETE",
        "/v1/endpoints/{name}",
        "Delete one created here; its open deliveries become dead (endpoint deleted)",
        ApiEndpointDeleted,
        (404, 409),
        _ENDPOINT,
    ),
    "enableEndpoint": Operation(
        "POST",
        "/v1/endpoints/{name}:enable",
        "Enable it",
        ApiEndpoint,
        (400, 404),
        _ENDPOINT,
        body=ApiEmptyBody,
    ),
    "disableEndpoint": Operation(
        "POST",
        "/v1/endpoints/{name}:disable",
        "Disable it (reason: optional)",
        ApiEndpoint,
        (400, 404),
        _ENDPOINT,
        body=ApiDisableBody,
    ),
    "testEndpoint": Operation(
        "POST",
        "/v1/endpoints/{name}:test",
        "Send it a signed ping now",
        ApiPing,
        (404, 503),
        _ENDPOINT,
        body=ApiEmptyBody,
    ),
    "rotateEndpointSecret": Operation(
        "POST",
        "/v1/endpoints/{name}:rotateSecret",
        "A new secret (in this answer only); the old one signs too for overlap seconds",
        ApiEndpoint,
        _EDIT,
        _ENDPOINT,
        body=ApiRotateBody,
    ),
    "listDeliveries": Operation(
        "GET",
        "/v1/deliveries",
        "The delivery log, newest first",
        ApiDeliveryPage,
        (400, 404),
        query=(
            ("endpoint", "Only this endpoint"),
            ("status", "pending, failed, delivered or dead"),
            ("session", "Only this session (sessions/...)"),
            ("event", "Only this event (the webhook-id)"),
        ),
        paged=True,
    ),
    "recoverDeliveries": Operation(
        "POST",
        "/v1/deliveries:recover",
        "Every failed or dead delivery of an endpoint since a time, due now",
        ApiRecovered,
        (400, 404),
        body=ApiRecoverBody,
    ),
    "retryDelivery": Operation(
        "POST",
        "/v1/deliveries/{id}:retry",
        "Send it again now: same webhook-id and body; its session's order kept",
        ApiRetried,
        (400, 404, 409),
        _DELIVERY,
        body=ApiEmptyBody,
    ),
    "getDelivery": Operation(
        "GET",
        "/v1/deliveries/{id}",
        "One delivery and every attempt",
        ApiDeliveryAttempts,
        (400, 404),
        _DELIVERY,
    ),
    "listEvents": Operation(
        "GET",
        "/v1/events",
        "Archived events in ingest order",
        ApiEventPage,
        (400,),
        query=(
            ("type", "A type or a glob (session.*)"),
            ("session", "Only this session (sessions/...)"),
        ),
        paged=True,
    ),
    "streamEvents": Operation(
        "GET",
        "/v1/events/stream",
        "The events as Server-Sent Events, live, from the newest or after the one named; "
        "each message: id (the webhook-id), event (the type), data (the body as delivered)",
        None,
        (400, 503),
        query=(
            ("type", "A type or a glob (session.*); repeat: any one"),
            ("session", "Only this session (sessions/...)"),
            ("last_event_id", "Start after this event (Last-Event-ID wins)"),
        ),
        headers=(("Last-Event-ID", "Start after this event (what EventSource sends)"),),
        content="text/event-stream",
        content_words="A stream that ends only when the relay stops (then reconnect with "
        "Last-Event-ID)",
        error_words=((503, "The store is not open yet, or too many streams (Retry-After)"),),
    ),
    "replayEvent": Operation(
        "POST",
        "/v1/events/{id}:replay",
        "Queue it again for an endpoint (same webhook-id and body)",
        ApiReplayed,
        (400, 404),
        _EVENT,
        body=ApiReplayBody,
    ),
    "getEvent": Operation(
        "GET", "/v1/events/{id}", "One event and its deliveries", ApiEventDetail, (400, 404), _EVENT
    ),
    "listSessions": Operation(
        "GET", "/v1/sessions", "Archived sessions by name", ApiSessionPage, (400,), paged=True
    ),
    "approvePlan": Operation(
        "POST",
        "/v1/sessions/{id}:approvePlan",
        "Approve the session's plan, with the session's account",
        ApiActed,
        (400, 404, 502, 503),
        _SESSION,
        body=ApiEmptyBody,
    ),
    "sendMessage": Operation(
        "POST",
        "/v1/sessions/{id}:sendMessage",
        "Send the agent a message, with the session's account",
        ApiActed,
        (400, 404, 502, 503),
        _SESSION,
        body=ApiMessageBody,
    ),
    "getSession": Operation(
        "GET",
        "/v1/sessions/{id}",
        "One session and its first 200 events (more_events: list the rest)",
        ApiSessionDetail,
        (400, 404),
        _SESSION,
    ),
    "listActions": Operation(
        "GET",
        "/v1/actions",
        "Actions taken through signed links, Slack, the console or the API, newest first",
        ApiActionPage,
        (400, 503),
        query=(("session", "Only this session's (sessions/<id>)"),),
        paged=True,
    ),
    "slackInteractions": Operation(
        "POST",
        "/v1/integrations/slack/interactions",
        "Slack's interactivity requests (block_actions of the buttons): answered at once, "
        "acted on after, the message updated through response_url",
        None,
        (400, 404, 413),
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
    found: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "description": op.about}
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
