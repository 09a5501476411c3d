"""The management API (``/v1/`` on ``[server] listen``) in the OpenAPI document: its
``paths``, the schemas of its answers and the bearer token, beside the webhooks
(:func:`~.contract.openapi_document` puts them in).

Written by hand, one function per group of routes (``relay/web/api/``), so that a group
and its description change together. Every list is a page (``pageSize``, ``pageToken``;
``nextPageToken`` only when there is more); every error is an :data:`ERROR` body.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["API_SCHEMAS", "SECURITY_SCHEMES", "api_paths"]

_OPEN: Final = {"type": "object", "additionalProperties": True}
_MOMENT: Final = {"type": ["string", "null"], "format": "date-time"}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


#: The schemas of the API's answers (names beginning ``Api``: apart from the webhooks').
API_SCHEMAS: Final[dict[str, Any]] = {
    "ApiError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "status"],
                "properties": {
                    "code": {"type": "integer", "description": "The HTTP status"},
                    "message": {"type": "string", "description": "One line: what and why"},
                    "status": {"type": "string", "description": "INVALID_ARGUMENT, ..."},
                },
            }
        },
    },
    "ApiDelivery": {
        **_OPEN,
        "description": "One delivery of an event to an endpoint (the webhook-id is event_id)",
        "properties": {
            "id": {"type": "integer"},
            "event_id": {"type": "string"},
            "event_type": {"type": "string"},
            "endpoint": {"type": "string"},
            "session_name": {"type": "string"},
            "status": {"enum": ["pending", "failed", "delivered", "dead"]},
            "attempts": {"type": "integer"},
            "next_attempt_at": _MOMENT,
            "created_at": _MOMENT,
            "updated_at": _MOMENT,
            "delivered_at": _MOMENT,
            "last_status_code": {"type": ["integer", "null"]},
            "last_error": {"type": ["string", "null"]},
            "replayed": {"type": "boolean"},
            "waiting_on": {
                "type": ["integer", "null"],
                "description": "The earlier open delivery of its session it waits behind",
            },
            "claimed_by": {"type": ["string", "null"], "description": "Replica sending it"},
            "claimed_at": _MOMENT,
        },
    },
    "ApiAttempt": {
        **_OPEN,
        "properties": {
            "attempt": {"type": "integer"},
            "started_at": _MOMENT,
            "duration_ms": {"type": "number"},
            "status_code": {"type": ["integer", "null"]},
            "error": {"type": ["string", "null"]},
            "response_body": {"type": "string"},
        },
    },
    "ApiEvent": {
        **_OPEN,
        "description": "An archived event; body is what the webhooks carry",
        "properties": {
            "seq": {"type": "integer", "description": "Position in ingest order"},
            "id": {"type": "string", "description": "The webhook-id"},
            "type": {"type": "string"},
            "session": {"type": "string"},
            "activity": {"type": ["string", "null"]},
            "occurred_at": {"type": "string"},
            "archived_at": _MOMENT,
            "body": _OPEN,
        },
    },
    "ApiSession": {
        **_OPEN,
        "properties": {
            key: {"type": "string"}
            for key in ("name", "id", "title", "state", "url", "source", "create_time")
        }
        | {"update_time": {"type": "string"}, "first_seen_at": _MOMENT},
    },
    "ApiAction": {
        **_OPEN,
        "description": "An action taken through a signed link, Slack or the console",
        "properties": {
            "id": {"type": "integer"},
            "taken_at": _MOMENT,
            "session": {"type": "string"},
            "wait": {"type": "string", "description": "The activity the action answered"},
            "action": {"enum": ["approve_plan", "reply"]},
            "account": {"type": "string"},
            "actor_kind": {"enum": ["link", "slack", "console", "api"]},
            "actor_address": {"type": "string"},
            "actor_agent": {"type": "string"},
            "chat_user": {"type": ["string", "null"]},
            "token_hash": {"type": "string", "description": "SHA-256 of the link's token"},
            "result": {"enum": ["pending", "ok", "failed"]},
            "status": {"type": ["integer", "null"], "description": "The service's HTTP status"},
            "detail": {"type": "string"},
        },
    },
    "ApiEndpoint": {
        **_OPEN,
        "description": "An endpoint, its state and definition (never its secret)",
        "properties": {
            "name": {"type": "string"},
            "source": {"enum": ["config", "api"], "description": "The config file, or the store"},
            "url": {"type": "string", "description": "User-info shown [redacted]"},
            "events": {"type": "array", "items": {"type": "string"}},
            "description": {"type": "string"},
            "definition": {**_OPEN, "description": "Its keys of [[endpoints]]"},
            "configured": {"type": "boolean"},
            "enabled": {"type": "boolean"},
            "disabled_reason": {"type": ["string", "null"]},
            "pending": {"type": "integer", "description": "Open deliveries"},
            "in_flight": {**_OPEN, "description": "Deliveries in flight per replica"},
            "last_success_at": _MOMENT,
            "failing_since": _MOMENT,
            "last_error": {"type": ["string", "null"]},
            "previous_secret_expires_at": {
                **_MOMENT,
                "description": "During a rotation's overlap: when the old secret stops signing",
            },
            "secret": {"type": "string", "description": "Only in a create's or rotation's answer"},
        },
    },
    "ApiRequeued": {
        **_OPEN,
        "description": "What a retry, a recovery or a replay did; message: one line",
        "properties": {
            "message": {"type": "string"},
            "reason": {"type": ["string", "null"], "description": "Why nothing, if nothing"},
        },
    },
}

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


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "Invalid argument (one line says which)",
        401: "No token, or a wrong one",
        404: "No such thing",
        409: "Not possible in its state",
        502: "The Sessions API refused",
        503: "Not available now (the store is opening; this relay cannot act)",
    }
    return {str(c): _json(_ref("ApiError"), words[c]) for c in (401, *codes)}


def _query(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "description": description, "schema": {"type": "string"}}


_PAGE: Final = [
    {
        "name": "pageSize",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": 200},
    },
    _query("pageToken", "nextPageToken of the previous page"),
]


def _path_id(description: str) -> dict[str, Any]:
    return {
        "name": "id",
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string"},
    }


def _page_of(key: str, item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            key: {"type": "array", "items": _ref(item)},
            "nextPageToken": {"type": "string"},
        },
    }


def _body(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _op(op_id: str, summary: str, answer: dict[str, Any], *codes: int, **more: Any) -> Any:
    return {
        "operationId": op_id,
        "summary": summary,
        "security": [{"bearer": []}],
        "responses": {"200": answer, **_errors(*codes)},
        **more,
    }


def _status_paths() -> dict[str, Any]:
    return {
        "/v1/status": {
            "get": _op("getStatus", "What `sessionhook status --json` prints", _json(_OPEN), 503)
        }
    }


def _delivery_paths() -> dict[str, Any]:
    delivery_id = [_path_id("A delivery id")]
    return {
        "/v1/deliveries": {
            "get": _op(
                "listDeliveries",
                "The delivery log, newest first",
                _json(_page_of("deliveries", "ApiDelivery")),
                400,
                404,
                parameters=[
                    _query("endpoint", "Only this endpoint"),
                    _query("status", "pending, failed, delivered or dead"),
                    _query("session", "Only this session (sessions/...)"),
                    _query("event", "Only this event (the webhook-id)"),
                    *_PAGE,
                ],
            )
        },
        "/v1/deliveries/{id}": {
            "get": _op(
                "getDelivery",
                "One delivery and every attempt",
                _json(
                    {
                        "type": "object",
                        "properties": {
                            "delivery": _ref("ApiDelivery"),
                            "attempts": {"type": "array", "items": _ref("ApiAttempt")},
                        },
                    }
                ),
                400,
                404,
                parameters=delivery_id,
            )
        },
        "/v1/deliveries/{id}:retry": {
            "post": _op(
                "retryDelivery",
                "Send it again now: same webhook-id and body; its session's order kept",
                _json(_ref("ApiRequeued")),
                400,
                404,
                409,
                parameters=delivery_id,
            )
        },
        "/v1/deliveries:recover": {
            "post": _op(
                "recoverDeliveries",
                "Every failed or dead delivery of an endpoint since a time, due now",
                _json(_ref("ApiRequeued")),
                400,
                404,
                requestBody=_body(
                    {
                        "endpoint": {"type": "string"},
                        "since": {"type": "string", "description": "RFC 3339, or an age: 1h"},
                    },
                    ["endpoint", "since"],
                ),
            )
        },
    }


def _event_paths() -> dict[str, Any]:
    return {
        "/v1/events": {
            "get": _op(
                "listEvents",
                "Archived events in ingest order",
                _json(_page_of("events", "ApiEvent")),
                400,
                parameters=[
                    _query("type", "A type or a glob (session.*)"),
                    _query("session", "Only this session (sessions/...)"),
                    *_PAGE,
                ],
            )
        },
        "/v1/events/{id}": {
            "get": _op(
                "getEvent",
                "One event and its deliveries",
                _json(
                    {
                        "type": "object",
                        "properties": {
                            "event": _ref("ApiEvent"),
                            "deliveries": {"type": "array", "items": _ref("ApiDelivery")},
                        },
                    }
                ),
                400,
                404,
                parameters=[_path_id("An event id (the webhook-id)")],
            )
        },
        "/v1/events/{id}:replay": {
            "post": _op(
                "replayEvent",
                "Queue it again for an endpoint (same webhook-id and body)",
                _json(_ref("ApiRequeued")),
                400,
                404,
                parameters=[_path_id("An event id (the webhook-id)")],
                requestBody=_body({"endpoint": {"type": "string"}}, ["endpoint"]),
            )
        },
    }


def _session_paths() -> dict[str, Any]:
    session_id = [_path_id("The session's id (the part after sessions/)")]
    acted = _json(
        {
            "type": "object",
            "properties": {
                "ok": {"const": True},
                "session": {"type": "string"},
                "detail": {"type": "string"},
            },
        }
    )
    return {
        "/v1/sessions": {
            "get": _op(
                "listSessions",
                "Archived sessions by name",
                _json(_page_of("sessions", "ApiSession")),
                400,
                parameters=_PAGE,
            )
        },
        "/v1/sessions/{id}": {
            "get": _op(
                "getSession",
                "One session and its first 200 events (more_events: list the rest)",
                _json(
                    {
                        "type": "object",
                        "properties": {
                            "session": _ref("ApiSession"),
                            "events": {"type": "array", "items": _ref("ApiEvent")},
                            "more_events": {"type": "boolean"},
                        },
                    }
                ),
                400,
                404,
                parameters=session_id,
            )
        },
        "/v1/sessions/{id}:approvePlan": {
            "post": _op(
                "approvePlan",
                "Approve the session's plan, with the session's account",
                acted,
                400,
                404,
                502,
                503,
                parameters=session_id,
            )
        },
        "/v1/sessions/{id}:sendMessage": {
            "post": _op(
                "sendMessage",
                "Send the agent a message, with the session's account",
                acted,
                400,
                404,
                502,
                503,
                parameters=session_id,
                requestBody=_body({"prompt": {"type": "string", "minLength": 1}}, ["prompt"]),
            )
        },
    }


def _action_paths() -> dict[str, Any]:
    session = _query("session", "Only this session's (sessions/<id>)")
    return {
        "/v1/actions": {
            "get": _op(
                "listActions",
                "Actions taken through signed links, Slack, the console or the API, newest first",
                _json(_page_of("actions", "ApiAction")),
                400,
                503,
                parameters=[*_PAGE, session],
            )
        }
    }


def _slack_paths() -> dict[str, Any]:
    form = {
        "type": "object",
        "properties": {"payload": {"type": "string", "description": "Slack's JSON payload"}},
        "required": ["payload"],
    }
    errors = _errors(400, 404)
    errors["401"] = _json(_ref("ApiError"), "Not signed by Slack, or signed too long ago")
    errors["413"] = _json(_ref("ApiError"), "Larger than 256 KiB")
    return {
        "/v1/integrations/slack/interactions": {
            "post": {
                "operationId": "slackInteractions",
                "summary": "Slack's interactivity requests (block_actions of the buttons): "
                "answered at once, acted on after, the message updated through response_url",
                "security": [{"slackSignature": []}],
                "requestBody": {
                    "required": True,
                    "content": {"application/x-www-form-urlencoded": {"schema": form}},
                },
                "responses": {"200": {"description": "Received"}, **errors},
            }
        }
    }


def _endpoint_paths() -> dict[str, Any]:
    name = [
        {
            "name": "name",
            "in": "path",
            "required": True,
            "description": "The endpoint's name",
            "schema": {"type": "string"},
        }
    ]
    endpoint = _json(_ref("ApiEndpoint"))
    definition = {
        "description": {"type": "string", "maxLength": 1000},
        "url": {"type": "string"},
        "events": {"type": "array", "items": {"type": "string"}},
        "accounts": {"type": "array", "items": {"type": "string"}},
        "payload": {"enum": ["full", "thin"]},
        "format": {"enum": ["standard", "cloudevents", "slack", "discord", "google_chat", "teams"]},
        "template": {"type": "string"},
        "content_type": {"type": "string"},
        "filter": _OPEN,
        "rate_limit": {"type": "number"},
        "disable_after": {"type": ["number", "string"]},
    }
    created = _body(
        {
            "name": {"type": "string", "maxLength": 64},
            "secret": {"type": "string", "description": "whsec_...; default: a new one"},
            **definition,
        },
        ["name", "url"],
    )
    changed = _body(definition, [])
    verb = {"parameters": name}
    return {
        "/v1/endpoints": {
            "get": _op(
                "listEndpoints",
                "Every endpoint (the config file's and those created here), by name",
                _json(_page_of("endpoints", "ApiEndpoint")),
                400,
                parameters=_PAGE,
            ),
            "post": _op(
                "createEndpoint",
                "Create one in the store; its secret is in this answer only",
                endpoint,
                400,
                409,
                requestBody=created,
            ),
        },
        "/v1/endpoints/{name}": {
            "get": _op("getEndpoint", "One endpoint", endpoint, 404, **verb),
            "put": _op(
                "replaceEndpoint",
                "Replace the definition (409: the config file's)",
                endpoint,
                400,
                404,
                409,
                requestBody=changed,
                **verb,
            ),
            "patch": _op(
                "updateEndpoint",
                "Change keys of the definition; null: the default (409: the config file's)",
                endpoint,
                400,
                404,
                409,
                requestBody=changed,
                **verb,
            ),
            "delete": _op(
                "deleteEndpoint",
                "Delete one created here; its open deliveries become dead (endpoint deleted)",
                _json(_OPEN),
                404,
                409,
                **verb,
            ),
        },
        "/v1/endpoints/{name}:enable": {
            "post": _op("enableEndpoint", "Enable it", endpoint, 404, **verb)
        },
        "/v1/endpoints/{name}:disable": {
            "post": _op(
                "disableEndpoint",
                "Disable it (reason: optional)",
                endpoint,
                400,
                404,
                requestBody=_body({"reason": {"type": "string", "maxLength": 200}}, []),
                **verb,
            )
        },
        "/v1/endpoints/{name}:test": {
            "post": _op("testEndpoint", "Send it a signed ping now", _json(_OPEN), 404, 503, **verb)
        },
        "/v1/endpoints/{name}:rotateSecret": {
            "post": _op(
                "rotateEndpointSecret",
                "A new secret (in this answer only); the old one signs too for overlap seconds",
                endpoint,
                400,
                404,
                409,
                requestBody=_body(
                    {
                        "overlap": {
                            "type": ["number", "string"],
                            "description": "Seconds or 24h; default a day, at most 30 days",
                        },
                        "secret": {"type": "string"},
                    },
                    [],
                ),
                **verb,
            )
        },
    }


def api_paths() -> dict[str, Any]:
    """Every route of the management API, each with its answers and errors."""
    return {
        **_status_paths(),
        **_endpoint_paths(),
        **_delivery_paths(),
        **_event_paths(),
        **_session_paths(),
        **_action_paths(),
        **_slack_paths(),
    }
