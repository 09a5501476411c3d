"""JSON schemas of each chat service's incoming-webhook body, written here from each
service's documentation (required members and size limits): what the chat presets must
send. Shared by the black-box test of the formats and the markup tests of the presets."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def _object(*required: str, **properties: Schema) -> Schema:
    """An object with these ``required`` members and ``properties``."""
    schema: Schema = {"type": "object"}
    if required:
        schema["required"] = list(required)
    schema["properties"] = properties
    return schema


def _array(items: Schema, **bounds: int) -> Schema:
    """An array of ``items``; ``bounds``: ``minItems``, ``maxItems``."""
    return {"type": "array", **bounds, "items": items}


def _string(max_length: int | None = None, *, min_length: int | None = None) -> Schema:
    schema: Schema = {"type": "string"}
    if min_length is not None:
        schema["minLength"] = min_length
    if max_length is not None:
        schema["maxLength"] = max_length
    return schema


def _const(value: str) -> Schema:
    return {"const": value}


_TEXT_OBJECT = _object(
    "type",
    "text",
    type={"enum": ["mrkdwn", "plain_text"]},
    text=_string(3000, min_length=1),
)
# api.slack.com/messaging/webhooks + Block Kit reference (section, context)
SLACK = _object(
    "text",
    text=_string(40000, min_length=1),
    blocks=_array(
        {
            "oneOf": [
                _object("type", "text", type=_const("section"), text=_TEXT_OBJECT),
                _object(
                    "type",
                    "elements",
                    type=_const("context"),
                    elements=_array(_TEXT_OBJECT, minItems=1, maxItems=10),
                ),
            ]
        },
        maxItems=50,
    ),
)
# discord.com/developers/docs/resources/webhook#execute-webhook + embed limits
DISCORD = {
    "type": "object",
    "anyOf": [{"required": ["content"]}, {"required": ["embeds"]}],
    "properties": {
        "content": _string(2000),
        "allowed_mentions": {"type": "object"},
        "embeds": _array(
            _object(
                title=_string(256),
                url={"type": "string", "format": "uri"},
                description=_string(4096),
                color={"type": "integer"},
                fields=_array(
                    _object(
                        "name",
                        "value",
                        name=_string(256, min_length=1),
                        value=_string(1024, min_length=1),
                        inline={"type": "boolean"},
                    ),
                    maxItems=25,
                ),
                footer=_object("text", text=_string(2048)),
            ),
            maxItems=10,
        ),
    },
}
# developers.google.com/workspace/chat/quickstart/webhooks (text message)
GOOGLE_CHAT = _object("text", text=_string(4096, min_length=1))
# learn.microsoft.com: incoming webhook / Workflows, Adaptive Card attachment
TEAMS = _object(
    "type",
    "attachments",
    type=_const("message"),
    attachments=_array(
        _object(
            "contentType",
            "content",
            contentType=_const("application/vnd.microsoft.card.adaptive"),
            content=_object(
                "type",
                "version",
                "body",
                type=_const("AdaptiveCard"),
                version=_string(),
                body=_array(_object("type", "text", type=_const("TextBlock")), minItems=1),
                actions=_array(_object("type", "title", "url", type=_const("Action.OpenUrl"))),
            ),
        ),
        minItems=1,
    ),
)
CHAT = {"slack": SLACK, "discord": DISCORD, "gchat": GOOGLE_CHAT, "teams": TEAMS}
CHAT_FORMATS = {"slack": "slack", "discord": "discord", "gchat": "google_chat", "teams": "teams"}
