"""What a Slack interaction asks for (no I/O): the ``block_actions`` payload of a click on
one of the chat presets' buttons, read defensively, and where the answer may go.

:func:`read_interaction` turns the form's ``payload`` JSON into a :class:`SlackClick`, or
raises :class:`PayloadError` naming the first thing wrong (a 400); nothing here trusts the
body's size or shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import parse_qs, urlsplit

from ...config import is_loopback

#: The chat presets' ``action_id``\ s (relay/domain/templates/slack.json.j2).
APPROVE: Final = "sessionhook_approve"
REPLY: Final = "sessionhook_reply"
OPEN: Final = "sessionhook_open"
REPLY_TEXT: Final = "sessionhook_reply_text"
#: Longest link token, reply and user name read from a payload.
MAX_TOKEN: Final = 2048
MAX_REPLY: Final = 10_000
_MAX_NAME: Final = 256
#: The presets' blocks a click takes away (the buttons, the reply box), and what is kept.
_ACTION_BLOCKS: Final = frozenset({"sessionhook_actions", "sessionhook_reply"})
_KEPT_BLOCK_TYPES: Final = frozenset({"section", "context", "header", "divider"})
_MAX_BLOCKS: Final = 40


class PayloadError(ValueError):
    """A body that is not a Slack interaction this route can read (one line, a 400)."""


@dataclass(frozen=True, slots=True)
class SlackClick:
    """One click: ``kind`` (``approve``, ``reply`` or ``other``: nothing to do), the button's
    link ``token``, the reply box's ``text``, the ``user``, the ``response_url`` and the
    message's text ``blocks`` (buttons and reply box left out)."""

    kind: Literal["approve", "reply", "other"]
    token: str
    text: str | None
    user: str
    response_url: str | None
    blocks: tuple[dict[str, Any], ...] = ()


def read_interaction(body: bytes) -> SlackClick:
    """The click in a form-encoded Slack interaction body; :class:`PayloadError` if not."""
    try:
        form = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        raise PayloadError("the body is not a UTF-8 url-encoded form") from None
    fields = form.get("payload", [])
    if len(fields) != 1:
        raise PayloadError("the form must have exactly one payload field")
    try:
        payload = json.loads(fields[0])
    except (ValueError, RecursionError):
        raise PayloadError("payload is not JSON") from None
    if not isinstance(payload, dict):
        raise PayloadError("payload must be a JSON object")
    if payload.get("type") != "block_actions":
        raise PayloadError(
            f"payload.type: only block_actions is handled, not {_shown(payload.get('type'))}"
        )
    user = _user(payload.get("user"))
    response_url = _optional_text(payload, "response_url", 4096)
    actions = payload.get("actions")
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        raise PayloadError("payload.actions must be a list of at least one action object")
    action = actions[0]
    action_id = action.get("action_id")
    if not isinstance(action_id, str):
        raise PayloadError("payload.actions[0].action_id must be a string")
    if action_id not in (APPROVE, REPLY):
        return SlackClick("other", "", None, user, response_url)
    token = action.get("value")
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN:
        raise PayloadError(
            f"payload.actions[0].value must be a link token (1 to {MAX_TOKEN} characters)"
        )
    blocks = _text_blocks(payload.get("message"))
    if action_id == APPROVE:
        return SlackClick("approve", token, None, user, response_url, blocks)
    text = _reply_text(payload.get("state"))
    return SlackClick("reply", token, text, user, response_url, blocks)


def response_url_refusal(url: str, hosts: tuple[str, ...]) -> str | None:
    """Why the relay must not POST to ``url`` (``None``: it may): https on one of ``hosts``,
    or http to a loopback host listed there by name; no user info, printable ASCII only."""
    if len(url) > 4096 or not url.isascii() or not url.isprintable() or " " in url:
        return "not a printable URL"
    try:
        parts = urlsplit(url)
        host, port = (parts.hostname or ""), parts.port
    except ValueError:
        return "not a URL"
    if parts.username is not None or parts.password is not None:
        return "it carries user info"
    if host not in hosts:
        return f"{host or 'no host'} is not in slack.response_url_hosts"
    if parts.scheme == "https":
        return None if port in (None, 443) or is_loopback(host) else f"port {port} on {host}"
    if parts.scheme == "http" and is_loopback(host):
        return None
    return f"{parts.scheme or 'no'} scheme (https only, http for a listed loopback host)"


def _user(value: Any) -> str:
    if not isinstance(value, dict):
        raise PayloadError("payload.user must be an object")
    for key in ("username", "name", "id"):
        name = value.get(key)
        if isinstance(name, str) and name.strip():
            return name.strip()[:_MAX_NAME]
    raise PayloadError("payload.user has no username or id")


def _optional_text(payload: dict[str, Any], key: str, limit: int) -> str | None:
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise PayloadError(f"payload.{key} must be a string of at most {limit} characters")
    return value


def _reply_text(state: Any) -> str | None:
    """The reply box's text in ``state.values`` (whichever block holds it)."""
    if state is None:
        return None
    values = state.get("values") if isinstance(state, dict) else None
    if not isinstance(values, dict):
        raise PayloadError("payload.state.values must be an object")
    for block in values.values():
        box = block.get(REPLY_TEXT) if isinstance(block, dict) else None
        if box is None:
            continue
        text = box.get("value") if isinstance(box, dict) else None
        if text is None:
            return None
        if not isinstance(text, str) or len(text) > MAX_REPLY:
            raise PayloadError(f"the reply must be a string of at most {MAX_REPLY} characters")
        return text.strip() or None
    return None


def _text_blocks(message: Any) -> tuple[dict[str, Any], ...]:
    """The message's text blocks, to keep when the click updates it (none when the payload
    has no readable message: the update then shows only who acted)."""
    blocks = message.get("blocks") if isinstance(message, dict) else None
    if not isinstance(blocks, list):
        return ()
    kept = [
        block
        for block in blocks
        if isinstance(block, dict)
        and block.get("type") in _KEPT_BLOCK_TYPES
        and block.get("block_id") not in _ACTION_BLOCKS
    ]
    return tuple(kept[:_MAX_BLOCKS])


def _shown(value: Any) -> str:
    return repr(value)[:60] if isinstance(value, str) else type(value).__name__
