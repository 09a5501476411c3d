"""Upstream text made inert for each chat service's markup (pure): titles, plan steps,
messages and URLs are data, never markup.

:func:`mrkdwn` (Slack, Google Chat) escapes ``& < >``; :func:`markdown` (Discord, Teams)
backslash-escapes what makes a link or a mention; a URL goes into link syntax only if
:func:`http_url` accepts it (:func:`mrkdwn_link` writes the escaped text otherwise).
``limit`` cuts the escaped text without splitting an escape. These are also the template
filters of the same names (docs/events.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_ENTITIES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\[]()<>"})
#: Anything but printable ASCII, and what ends or nests a link in one of the syntaxes
#: (``<url|label>``, ``[label](url)``) or quotes an attribute.
_NOT_IN_LINKS = re.compile(r"[^\x21-\x7e]|[<>|\[\]()\\\"'`{}^]")
#: ``http://`` or ``https://``, an optional ``user@``, then a host of at least one character
#: (a regex: urllib's urlsplit took 8 us per URL, four times the rest of the check).
_HTTP_WITH_HOST = re.compile(r"https?://([^/?#@]*@)?[^/?#@:]", re.IGNORECASE)
_MAX_URL = 2048
_ELLIPSIS = "..."


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _fit(text: str, escape: Callable[[str], str], limit: int | None) -> str:
    """``escape(text)``, or when longer than ``limit`` the escape of the longest prefix
    that fits with ``...`` after it (an escape is never cut in half)."""
    escaped = escape(text)
    if limit is None or len(escaped) <= limit:
        return escaped
    room = max(limit - len(_ELLIPSIS), 0)
    # The longest prefix whose escape fits: escaping only ever lengthens, so search.
    low, high = 0, min(len(text), room)
    while low < high:
        middle = (low + high + 1) // 2
        if len(escape(text[:middle])) <= room:
            low = middle
        else:
            high = middle - 1
    return escape(text[:low]) + _ELLIPSIS


def _entities(text: str) -> str:
    return text.translate(_ENTITIES)


def _backslashes(text: str) -> str:
    return text.translate(_MARKDOWN)


def mrkdwn(value: Any, limit: int | None = None) -> str:
    """Text for Slack mrkdwn or Google Chat: ``& < >`` as entities (``None`` is empty)."""
    return _fit(_text(value), _entities, limit)


def markdown(value: Any, limit: int | None = None) -> str:
    """Text for Discord or a Teams ``TextBlock``: no link, autolink or mention syntax."""
    return _fit(_text(value), _backslashes, limit)


def http_url(value: Any) -> str:
    """``value`` if it is an http(s) URL safe to put into link syntax, else ``""``."""
    if not isinstance(value, str) or len(value) > _MAX_URL or _NOT_IN_LINKS.search(value):
        return ""
    return value if _HTTP_WITH_HOST.match(value) else ""


def mrkdwn_link(url: Any, label: Any = None, limit: int | None = None) -> str:
    """A Slack / Google Chat link ``<url|label>`` (``<url>`` without a label), the label
    escaped (and cut to ``limit``); for a URL :func:`http_url` refuses, the escaped
    ``label: url`` as plain text."""
    safe = http_url(url)
    if not safe:
        shown = mrkdwn(url, _MAX_URL)
        return f"{mrkdwn(label, limit)}: {shown}" if label else shown
    target = _entities(safe)  # only & can be left: Slack reads entities inside <...> too
    return f"<{target}|{mrkdwn(label, limit)}>" if label else f"<{target}>"
