"""Slack's request signature, version ``v0`` (pure): who may call the relay as Slack.

``X-Slack-Signature: v0=<hex HMAC-SHA256(signing secret, "v0:" + timestamp + ":" + body)>``
over the raw body. :func:`verify_slack_request` accepts a request only with both headers, a
timestamp within :data:`MAX_SKEW` seconds of now (either way), version ``v0`` and a matching
signature (constant time); each refusal is a :class:`SlackSignatureError` whose ``reason``
never holds the secret or the expected signature.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final

#: How far (seconds) a request's timestamp may be from now, either way.
MAX_SKEW: Final = 300
_VERSION: Final = "v0"
_TIMESTAMP: Final = re.compile(r"[0-9]{1,12}")
_SIGNATURE: Final = re.compile(r"v0=[0-9a-f]{64}")


class SlackSignatureError(ValueError):
    """A request Slack did not sign (or not now): ``reason`` says why, in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def slack_signature(secret: str, timestamp: str, body: bytes) -> str:
    """``v0=<hex>``: what Slack sends in ``X-Slack-Signature`` for ``body`` at ``timestamp``."""
    base = f"{_VERSION}:{timestamp}:".encode("ascii") + body
    return f"{_VERSION}=" + hmac.new(secret.encode("utf-8"), base, hashlib.sha256).hexdigest()


def verify_slack_request(
    secret: str,
    *,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
    now: float,
    max_skew: float = MAX_SKEW,
) -> None:
    """Accept a request signed with ``secret`` within ``max_skew`` seconds of ``now``, or
    raise :class:`SlackSignatureError` (``unsigned``, ``malformed timestamp``, ``stale
    timestamp``, ``unknown signature version``, ``malformed signature``, ``bad
    signature``)."""
    if not timestamp or not signature:
        raise SlackSignatureError("unsigned: no X-Slack-Signature / X-Slack-Request-Timestamp")
    if not _TIMESTAMP.fullmatch(timestamp):
        raise SlackSignatureError("malformed timestamp")
    if abs(now - int(timestamp)) > max_skew:
        # Checked before the MAC: a replayed request is refused whatever it carries.
        raise SlackSignatureError(f"stale timestamp (more than {max_skew:g} s from now)")
    version, _, _ = signature.partition("=")
    if version != _VERSION:
        raise SlackSignatureError("unknown signature version")
    if not _SIGNATURE.fullmatch(signature):
        raise SlackSignatureError("malformed signature")
    expected = slack_signature(secret, timestamp, body)
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii")):
        raise SlackSignatureError("bad signature")
