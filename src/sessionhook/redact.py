"""Credentials inside URLs: :func:`redact_userinfo`, the one helper every output goes through.

An endpoint URL may carry ``user:password@``, a ``base_url`` a token as its user. Whatever
shows or logs a URL (the CLI, ``status --json``, the logs, delivery errors kept in the store)
passes it through :func:`redact_userinfo`; the URL itself is used with its credentials.
"""

from __future__ import annotations

import re
from typing import Final

#: What replaces the user-info part of a URL.
REDACTED_USERINFO: Final = "[redacted]"

# scheme://userinfo@ : the user-info runs to the LAST "@" of the authority (a password may
# hold an unescaped "@"), and the authority ends at "/", "?", "#", whitespace or a quote.
_USERINFO: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s\"'<>]*@")


def redact_userinfo(text: str) -> str:
    """``text`` (a URL, or free text such as an error message or a log line) with the
    user-info of every URL in it replaced by ``[redacted]``."""
    if "@" not in text:
        return text
    return _USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED_USERINFO}@", text)
