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
SLACK = {  # api.slack.com/messaging/webhooks + Block Kit reference (section, context)
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
GOOGLE_CHAT = {  # developers.google.com/workspace/chat/quickstart/webhooks (text message)
    "type": "object",
    "required": ["text"],
    "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 4096}},
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
                                    "properties": {"type": {"const": "Action.OpenUrl"}},
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
