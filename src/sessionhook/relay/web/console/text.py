"""Text in and out of the console, pure: the templates' filters (times, ages, clipped and
pretty-printed bodies) and the numbers and times read from URLs and forms.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Final

from ....wording import counted
from ...domain.rows import AttemptRow, DeliveryRow

#: Shown of an event body or a response body before "... (N characters more)".
BODY_SHOWN: Final = 64 * 1024
#: The largest id or position in the stores (SQLite INTEGER, PostgreSQL BIGINT).
MAX_ID: Final = 2**63 - 1
#: Kept of a text filter from a URL (a search, a name): longer names nothing in the store.
QUERY_SHOWN: Final = 200

# --------------------------------------------------------------------------- out


def stamp(ts: float | None) -> str:
    """A Unix time as ``YYYY-MM-DD HH:MM:SSZ`` (empty for ``None``)."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def age(seconds: float | None) -> str:
    """A duration, short: ``42s``, ``17m``, ``5h03m``, ``3d`` (empty for ``None``)."""
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d"


def clip(text: str | bytes | None, limit: int = BODY_SHOWN) -> str:
    """At most ``limit`` characters of ``text``, with a note of how much was left out."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n... ({counted(len(text) - limit, 'character')} more)"


def pretty(body: bytes) -> str:
    """An event body pretty-printed (as it is stored when it is not JSON)."""
    try:
        return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except ValueError:
        return body.decode("utf-8", "replace")


def outcome(attempt: AttemptRow) -> str:
    """``ok`` for an attempt answered 2xx, else ``failed``."""
    if attempt.status_code is not None and 200 <= attempt.status_code < 300:
        return "ok"
    return "failed"


def answer(delivery: DeliveryRow) -> str:
    """A delivery's last answer in one line: ``HTTP 500``, ``HTTP 502: <error>``, or the
    error alone when nothing answered."""
    code = delivery.last_status_code
    error = (delivery.last_error or "").strip()
    status = "" if code is None else f"HTTP {code}"
    if not error or error == status:
        return status
    return f"{status}: {error}" if status else error


# --------------------------------------------------------------------------- in


def query_text(value: str | None, limit: int = QUERY_SHOWN) -> str:
    """A text filter from a URL, made harmless for the store: control characters dropped
    (PostgreSQL refuses NUL), stripped, at most ``limit`` characters."""
    text = "".join(c for c in (value or "")[: limit * 2] if c >= " " and c != "\x7f")
    return text.strip()[:limit]


class BadNumber(ValueError):
    """A whole number in a URL beyond what the store holds; ``str()`` says so."""


def url_int(value: str | None, name: str) -> int | None:
    """``value`` (from a URL) as a whole number from 0 to :data:`MAX_ID`, ``None`` when
    absent or not ASCII digits; larger is :class:`BadNumber` (the stores hold 64 bits)."""
    text = (value or "").strip()
    if not text.isascii() or not text.isdigit():
        return None
    # Judged by its length first: int() of a few thousand digits is refused, or slow.
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_ID)) or int(digits) > MAX_ID:
        raise BadNumber(f"{name} must be a whole number from 0 to {MAX_ID}")
    return int(digits)


def parse_when(value: str | None, now: float) -> float | None:
    """A filter's time: an age (``90s``, ``30m``, ``2h``, ``7d``) before ``now``, or ISO 8601
    (UTC unless an offset is given); ``None`` when empty or not understood."""
    if not value:
        return None
    text = value.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[-1:].lower() in units and text[:-1].replace(".", "", 1).isdigit():
        return now - float(text[:-1]) * units[text[-1].lower()]
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
