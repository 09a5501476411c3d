"""What the API's routes read from a request's path and query: ids and times, each
checked before it reaches the store, every refusal a 400 with a one-line reason (a huge
or non-numeric id, a time nobody can spell are never a 500). The query parameters
themselves are read through :func:`.common.query_text`, bounded."""

from __future__ import annotations

import re
from typing import Final

from ...ops.wire import parse_moment
from .common import bad_request

#: The largest delivery id (a signed 64-bit integer, the column's type on PostgreSQL).
_MAX_ID: Final = 2**63 - 1
_TOKEN: Final = re.compile(r"^[A-Za-z0-9_.~-]{1,200}$")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def delivery_id(text: str) -> int:
    """A delivery id from a path or a page token: a whole number that fits the column."""
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) > _MAX_ID:
        raise bad_request(f"a delivery id is a whole number, not {_shown(text)}")
    return int(text)


def event_id(text: str) -> str:
    """An event id from a path (``evt_…``: letters, digits, ``_.~-``)."""
    if not _TOKEN.match(text):
        raise bad_request(f"not an event id: {_shown(text)}")
    return text


def session_name(text: str) -> str:
    """``sessions/<id>`` from the path's ``<id>`` (letters, digits, ``_.~-``)."""
    if not _TOKEN.match(text):
        raise bad_request(f"not a session id: {_shown(text)}")
    return f"sessions/{text}"


def since_time(text: str, now: float, field: str = "since") -> float:
    """A moment as the CLI takes it (RFC 3339, ``now`` or an age such as ``1h``)."""
    try:
        return parse_moment(text, now)
    except ValueError as exc:
        raise bad_request(f"{field}: {exc}") from None
