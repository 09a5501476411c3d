"""Signed action links: capabilities to approve a plan or answer an agent from a chat message.

A token says who may do what, until when, and proves the relay wrote it::

    base64url(JSON [1, account, session, wait, action, expires]) "." base64url(HMAC-SHA256)

The HMAC (the action-link key, under a label of its own) covers the whole payload; base64 is
decoded strictly and the MAC compared in constant time against each key of the ring. A page
behind a link carries a form token (:func:`form_token`, an HMAC of the link token under
another label): a POST must come from that page or the link's holder, no cookie involved.
:class:`ActionLinks` builds the URLs an event carries. Nothing here does I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from .actions import ACTION_KINDS, ActionKind

#: Longer tokens are refused before any decoding (a real one is about 250 characters).
MAX_TOKEN_CHARS: Final = 2048
_VERSION: Final = 1
_LINK_LABEL: Final = b"sessionhook action link v1\x00"
_FORM_LABEL: Final = b"sessionhook action form v1\x00"
_MAC_BYTES: Final = hashlib.sha256().digest_size
#: The account of the links a sample event carries (``sessionhook trigger``): no account is
#: named so (names are letters, digits, ``_.-``), and its pages act on nothing upstream.
SAMPLE_ACCOUNT: Final = "(sample)"


@dataclass(frozen=True, slots=True)
class LinkClaims:
    """What a link allows: ``action`` on ``session`` (``sessions/<id>``) of ``account``,
    answering the wait ``wait`` (an activity name, or ``""``), until ``expires`` (Unix s)."""

    account: str
    session: str
    wait: str
    action: ActionKind
    expires: float


class LinkError(ValueError):
    """A token that gives nothing; ``reason`` is ``malformed``, ``bad signature`` or
    ``expired``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    """Strict base64url without padding: the only spelling :func:`_b64` gives."""
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise LinkError("malformed") from None
    if _b64(data) != text:  # other unused bits, stray padding: not our spelling
        raise LinkError("malformed")
    return data


def _mac(key: bytes, label: bytes, data: bytes) -> bytes:
    return hmac.new(key, label + data, hashlib.sha256).digest()


def _payload(claims: LinkClaims) -> bytes:
    seconds = float(claims.expires)
    expires: float | int = int(seconds) if seconds.is_integer() else seconds
    fields = [_VERSION, claims.account, claims.session, claims.wait, claims.action, expires]
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def sign_link(key: bytes, claims: LinkClaims) -> str:
    """The URL-safe token of ``claims`` under ``key``."""
    if not key:
        raise ValueError("an action-link key must not be empty")
    if claims.action not in ACTION_KINDS:
        raise ValueError(f"unknown action {claims.action!r}")
    if not math.isfinite(claims.expires):
        raise ValueError("a link's expiry must be a finite time")
    payload = _payload(claims)
    return f"{_b64(payload)}.{_b64(_mac(key, _LINK_LABEL, payload))}"


def verify_link(keys: Sequence[bytes], token: str, now: float) -> LinkClaims:
    """The claims of ``token`` when one of ``keys`` signed it and it has not expired at
    ``now``; :class:`LinkError` otherwise (the signature is checked before anything in
    the payload is read)."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not token.isascii():
        raise LinkError("malformed")
    encoded, dot, signature = token.partition(".")
    if not dot or not encoded or not signature:
        raise LinkError("malformed")
    payload, presented = _unb64(encoded), _unb64(signature)
    if len(presented) != _MAC_BYTES:
        raise LinkError("malformed")
    matched = False
    for key in keys:  # every key is tried: the time taken does not say which one matched
        matched |= hmac.compare_digest(_mac(key, _LINK_LABEL, payload), presented)
    if not matched:
        raise LinkError("bad signature")
    claims = _claims(payload)
    if now >= claims.expires:
        raise LinkError("expired")
    return claims


def _claims(payload: bytes) -> LinkClaims:
    try:
        fields = json.loads(payload)
    except ValueError:
        raise LinkError("malformed") from None
    if not (isinstance(fields, list) and len(fields) == 6 and fields[0] == _VERSION):
        raise LinkError("malformed")
    _, account, session, wait, action, expires = fields
    texts = (account, session, wait)
    if not all(isinstance(t, str) for t in texts) or not account or not session:
        raise LinkError("malformed")
    if action not in ACTION_KINDS:
        raise LinkError("malformed")
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        raise LinkError("malformed")
    return LinkClaims(account, session, wait, action, float(expires))


def form_token(key: bytes, token: str) -> str:
    """The token a link's page puts in its form: bound to that link token."""
    return _b64(_mac(key, _FORM_LABEL, token.encode("utf-8")))


def check_form_token(keys: Sequence[bytes], token: str, presented: str) -> bool:
    """Whether ``presented`` is :func:`form_token` of ``token`` under one of ``keys``."""
    good = False
    for key in keys:
        good |= hmac.compare_digest(form_token(key, token).encode(), presented.encode("utf-8"))
    return good


def token_digest(token: str) -> str:
    """What the store keeps of a used token (its SHA-256, hex): a link is used once."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class ActionLinks:
    """Builds the links of a ``session.action_required`` event: under ``public_url`` (how
    people's browsers reach the relay's web server), signed with ``key``, valid ``ttl``
    seconds from when the event is built."""

    public_url: str
    ttl: float
    key: bytes

    def links(
        self, account: str, session: str, wait: str, action: ActionKind, now: float
    ) -> dict[str, str]:
        """``{"approve": URL, "open": URL}`` for a plan, ``{"reply": URL, "open": URL}`` for
        a question; ``open`` is the session's timeline in the console."""
        claims = LinkClaims(account, session, wait, action, float(math.floor(now + self.ttl)))
        base = self.public_url.rstrip("/")
        act = f"{base}/actions/{sign_link(self.key, claims)}"
        open_url = f"{base}/console/timeline?session={quote(session, safe='')}"
        return {"approve" if action == "approve_plan" else "reply": act, "open": open_url}
