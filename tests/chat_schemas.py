"""JSON schemas of each chat service's incoming-webhook body, written here from each
service's documentation (required members and size limits): what the chat presets must
send. Shared by the black-box test of the formats and the markup tests of the presets."""

from __future__ import annotations

_TEXT_OBJECT = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {
        "type": {"enum": ["mrkdwn", "plain_text"]},
        "text": {"type": "string", "minLength": 1, "maxLength": 3000},
    },
}


def _plain_text(limit: int) -> dict[str, object]:
    return {
        "type": "object",
        "required": ["type", "text"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "plain_text"},
            "text": {"type": "string", "minLength": 1, "maxLength": limit},
            "emoji": {"type": "boolean"},
        },
    }


_SLACK_BUTTON = {  # docs.slack.dev/reference/block-kit/block-elements/button-element
    "type": "object",
    "required": ["type", "text"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "button"},
        "text": _plain_text(75),
        "action_id": {"type": "string", "minLength": 1, "maxLength": 255},
        "url": {"type": "string", "minLength": 1, "maxLength": 3000},
        "value": {"type": "string", "minLength": 1, "maxLength": 2000},
        "style": {"enum": ["primary", "danger"]},
    },
}
_SLACK_ACTIONS = {  # docs.slack.dev/reference/block-kit/blocks/actions-block
    "type": "object",
    "required": ["type", "elements"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "actions"},
        "block_id": {"type": "string", "minLength": 1, "maxLength": 255},
        "elements": {"type": "array", "minItems": 1, "maxItems": 25, "items": _SLACK_BUTTON},
    },
}
_SLACK_INPUT = {  # docs.slack.dev/reference/block-kit/blocks/input-block (plain_text_input)
    "type": "object",
    "required": ["type", "label", "element"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "input"},
        "block_id": {"type": "string", "minLength": 1, "maxLength": 255},
        "label": _plain_text(2000),
        "hint": _plain_text(2000),
        "optional": {"type": "boolean"},
        "dispatch_action": {"type": "boolean"},
        "element": {
            "type": "object",
            "required": ["type"],
            "additionalProperties": False,
            "properties": {
                "type": {"const": "plain_text_input"},
                "action_id": {"type": "string", "minLength": 1, "maxLength": 255},
                "multiline": {"type": "boolean"},
                "max_length": {"type": "integer", "maximum": 3000},
            },
        },
    },
}
SLACK = {  # api.slack.com/messaging/webhooks + Block Kit reference (section, context,
    # actions of buttons, input of a plain_text_input)
    "type": "object",
    "required": ["text"],
    "properties": {
        "text": {"type": "string", "minLength": 1, "maxLength": 40000},
        "blocks": {
            "type": "array",
            "maxItems": 50,
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {"type": {"const": "section"}, "text": _TEXT_OBJECT},
                    },
                    {
                        "type": "object",
                        "required": ["type", "elements"],
                        "properties": {
                            "type": {"const": "context"},
                            "elements": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": 10,
                                "items": _TEXT_OBJECT,
                            },
                        },
                    },
                    _SLACK_ACTIONS,
                    _SLACK_INPUT,
                ]
            },
        },
    },
}
DISCORD = {  # discord.com/developers/docs/resources/webhook#execute-webhook + embed limits
    "type": "object",
    "anyOf": [{"required": ["content"]}, {"required": ["embeds"]}],
    "properties": {
        "content": {"type": "string", "maxLength": 2000},
        "allowed_mentions": {"type": "object"},
        "embeds": {
            "type": "array",
            "maxItems": 10,
            "items": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "maxLength": 256},
                    "url": {"type": "string", "format": "uri"},
                    "description": {"type": "string", "maxLength": 4096},
                    "color": {"type": "integer"},
                    "fields": {
                        "type": "array",
                        "maxItems": 25,
                        "items": {
                            "type": "object",
                            "required": ["name", "value"],
                            "properties": {
                                "name": {"type": "string", "minLength": 1, "maxLength": 256},
                                "value": {"type": "string", "minLength": 1, "maxLength": 1024},
                                "inline": {"type": "boolean"},
                            },
                        },
                    },
                    "footer": {
                        "type": "object",
                        "required": ["text"],
                        "properties": {"text": {"type": "string", "maxLength": 2048}},
                    },
                },
            },
        },
    },
}
_GOOGLE_BUTTON = {  # developers.google.com/workspace/chat/api/reference/rest/v1/cards (Button)
    "type": "object",
    "required": ["text", "onClick"],
    "additionalProperties": False,
    "properties": {
        "text": {"type": "string", "minLength": 1},
        "onClick": {
            "type": "object",
            "required": ["openLink"],
            "additionalProperties": False,
            "properties": {
                "openLink": {
                    "type": "object",
                    "required": ["url"],
                    "additionalProperties": False,
                    "properties": {"url": {"type": "string", "pattern": "^https?://"}},
                }
            },
        },
    },
}
GOOGLE_CHAT = {  # developers.google.com/workspace/chat/quickstart/webhooks (a text message,
    # and cardsV2: each {cardId, card}, a card's sections of widgets, here a buttonList)
    "type": "object",
    "anyOf": [{"required": ["text"]}, {"required": ["cardsV2"]}],
    "additionalProperties": False,
    "properties": {
        "text": {"type": "string", "minLength": 1, "maxLength": 4096},
        "cardsV2": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["cardId", "card"],
                "additionalProperties": False,
                "properties": {
                    "cardId": {"type": "string", "minLength": 1},
                    "card": {
                        "type": "object",
                        "required": ["sections"],
                        "properties": {
                            "sections": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "required": ["widgets"],
                                    "properties": {
                                        "widgets": {
                                            "type": "array",
                                            "minItems": 1,
                                            "maxItems": 100,
                                            "items": {
                                                "type": "object",
                                                "required": ["buttonList"],
                                                "properties": {
                                                    "buttonList": {
                                                        "type": "object",
                                                        "required": ["buttons"],
                                                        "properties": {
                                                            "buttons": {
                                                                "type": "array",
                                                                "minItems": 1,
                                                                "items": _GOOGLE_BUTTON,
                                                            }
                                                        },
                                                    }
                                                },
                                            },
                                        }
                                    },
                                },
                            }
                        },
                    },
                },
            },
        },
    },
}
TEAMS = {  # learn.microsoft.com: incoming webhook / Workflows, Adaptive Card attachment
    "type": "object",
    "required": ["type", "attachments"],
    "properties": {
        "type": {"const": "message"},
        "attachments": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["contentType", "content"],
                "properties": {
                    "contentType": {"const": "application/vnd.microsoft.card.adaptive"},
                    "content": {
                        "type": "object",
                        "required": ["type", "version", "body"],
                        "properties": {
                            "type": {"const": "AdaptiveCard"},
                            "version": {"type": "string"},
                            "body": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "required": ["type", "text"],
                                    "properties": {"type": {"const": "TextBlock"}},
                                },
                            },
                            "actions": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["type", "title", "url"],
                                    "properties": {
                                        "type": {"const": "Action.OpenUrl"},
                                        "title": {"type": "string", "minLength": 1},
                                        "url": {"type": "string", "pattern": "^https?://"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
CHAT = {"slack": SLACK, "discord": DISCORD, "gchat": GOOGLE_CHAT, "teams": TEAMS}
CHAT_FORMATS = {"slack": "slack", "discord": "discord", "gchat": "google_chat", "teams": "teams"}
