"""Credentials inside URLs: :func:`redact_userinfo`, the one helper every output goes through.

An endpoint URL may carry a user and password (``https://user:pw@hooks.example.com/in``), a
``base_url`` a token as its user (``https://TOKEN@api.example.com``). Whatever shows or logs a
URL (the operator CLI, its error lines, ``status --json``, the log redaction processor,
delivery errors kept in the store) passes the text through :func:`redact_userinfo`, so the
user-info part never leaves the process: ``https://[redacted]@hooks.example.com/in``.

The URL itself keeps working where it is used (the dispatcher sends with the configured URL,
credentials included); only what is shown is redacted.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["REDACTED_USERINFO", "redact_userinfo"]

#: What replaces the user-info part of a URL.
REDACTED_USERINFO: Final = "[redacted]"

# scheme://userinfo@ : the user-info runs to the LAST "@" of the authority (a password may
# hold an unescaped "@"), and the authority ends at "/", "?", "#", whitespace or a quote.
_USERINFO: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s\"'<>]*@")


def redact_userinfo(text: str) -> str:
    """``text`` with the user-info of every URL in it replaced by ``[redacted]``.

    Works on a bare URL and on free text that contains URLs (an error message, a log
    line). Text without credentials is returned unchanged.
    """
    if "@" not in text:
        return text
    return _USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED_USERINFO}@", text)
