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


def _closed(*required: str, **properties: Schema) -> Schema:
    """:func:`_object` with no members but these (a misspelt key fails)."""
    return {**_object(*required, **properties), "additionalProperties": False}


def _plain_text(limit: int) -> Schema:
    return _closed(
        "type", "text", type=_const("plain_text"), text=_string(limit, min_length=1),
        emoji={"type": "boolean"},
    )  # fmt: skip


_BOOLEAN: Schema = {"type": "boolean"}


_TEXT_OBJECT = _object(
    "type",
    "text",
    type={"enum": ["mrkdwn", "plain_text"]},
    text=_string(3000, min_length=1),
)
# docs.slack.dev/reference/block-kit: button element, actions block, input block with a
# plain_text_input (the action buttons of a wait and its reply box)
_SLACK_BUTTON = _closed(
    "type",
    "text",
    type=_const("button"),
    text=_plain_text(75),
    action_id=_string(255, min_length=1),
    url=_string(3000, min_length=1),
    value=_string(2000, min_length=1),
    style={"enum": ["primary", "danger"]},
)
_SLACK_ACTIONS = _closed(
    "type",
    "elements",
    type=_const("actions"),
    block_id=_string(255, min_length=1),
    elements=_array(_SLACK_BUTTON, minItems=1, maxItems=25),
)
_SLACK_INPUT = _closed(
    "type",
    "label",
    "element",
    type=_const("input"),
    block_id=_string(255, min_length=1),
    label=_plain_text(2000),
    hint=_plain_text(2000),
    optional=_BOOLEAN,
    dispatch_action=_BOOLEAN,
    element=_closed(
        "type",
        type=_const("plain_text_input"),
        action_id=_string(255, min_length=1),
        multiline=_BOOLEAN,
        max_length={"type": "integer", "maximum": 3000},
    ),
)
# api.slack.com/messaging/webhooks + Block Kit reference (section, context, actions, input)
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
                _SLACK_ACTIONS,
                _SLACK_INPUT,
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
_HTTP_URL: Schema = {"type": "string", "pattern": "^https?://"}
# developers.google.com/workspace/chat/api/reference/rest/v1/cards: a Button that opens a link
_GOOGLE_BUTTON = _closed(
    "text",
    "onClick",
    text=_string(min_length=1),
    onClick=_closed("openLink", openLink=_closed("url", url=_HTTP_URL)),
)
_GOOGLE_CARD = _closed(
    "cardId",
    "card",
    cardId=_string(min_length=1),
    card=_object(
        "sections",
        sections=_array(
            _object(
                "widgets",
                widgets=_array(
                    _object(
                        "buttonList",
                        buttonList=_object("buttons", buttons=_array(_GOOGLE_BUTTON, minItems=1)),
                    ),
                    minItems=1,
                    maxItems=100,
                ),
            ),
            minItems=1,
        ),
    ),
)
# developers.google.com/workspace/chat/quickstart/webhooks: a text message, and cards
# (cardsV2: each {cardId, card}; here a card of link buttons)
GOOGLE_CHAT = {
    **_closed(
        text=_string(4096, min_length=1),
        cardsV2=_array(_GOOGLE_CARD, minItems=1),
    ),
    "anyOf": [{"required": ["text"]}, {"required": ["cardsV2"]}],
}
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
                actions=_array(
                    _object(
                        "type",
                        "title",
                        "url",
                        type=_const("Action.OpenUrl"),
                        title=_string(min_length=1),
                        url=_HTTP_URL,
                    )
                ),
            ),
        ),
        minItems=1,
    ),
)
CHAT = {"slack": SLACK, "discord": DISCORD, "gchat": GOOGLE_CHAT, "teams": TEAMS}
CHAT_FORMATS = {"slack": "slack", "discord": "discord", "gchat": "google_chat", "teams": "teams"}
