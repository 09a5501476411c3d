"""Standard Webhooks signatures: sign, build the header, verify, make secrets (pure).

The scheme (https://www.standardwebhooks.com/):

* a secret is ``whsec_`` followed by the base64 of the HMAC key;
* the signed content is ``f"{webhook-id}.{webhook-timestamp}.{body}"`` (timestamp in integer
  Unix seconds, body the exact bytes sent);
* ``webhook-signature`` holds ``v1,<base64 HMAC-SHA256>`` entries separated by spaces: one per
  secret in use, so that an endpoint's secret can be rotated without losing a delivery.

Errors::

    ValueError        a secret that is not ``whsec_`` + base64 (from :func:`decode_secret`)
    SignatureError    :func:`verify` refused a message; ``reason`` says why
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets as _secrets
import time
from collections.abc import Iterable, Mapping

__all__ = [
    "SECRET_PREFIX",
    "SignatureError",
    "decode_secret",
    "generate_secret",
    "sign",
    "signature_header",
    "verify",
]

#: Prefix of every Standard Webhooks secret.
SECRET_PREFIX = "whsec_"

#: Default tolerance of :func:`verify` between the message timestamp and the clock (seconds).
DEFAULT_TOLERANCE = 300


class SignatureError(Exception):
    """A webhook message failed verification; :attr:`reason` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a secret: base64-decode what follows ``whsec_`` (prefix optional).

    Unpadded base64 is accepted, as the reference implementation does. Raises
    :class:`ValueError` when the text is not base64 or decodes to nothing.
    """
    text = secret.strip().removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("secret is not base64 after the whsec_ prefix") from exc
    if not key:
        raise ValueError("secret is empty")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One signature, ``v1,<base64 HMAC-SHA256>``, over ``"{msg_id}.{timestamp}.{body}"``."""
    content = f"{msg_id}.{int(timestamp)}.".encode() + body
    digest = hmac.new(decode_secret(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_header(secrets: Iterable[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one signature per secret, space-separated."""
    signatures = [sign(secret, msg_id, timestamp, body) for secret in secrets]
    if not signatures:
        raise ValueError("at least one secret is needed to sign")
    return " ".join(signatures)


def verify(
    secrets: str | Iterable[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> None:
    """Check a received message; return nothing when it is authentic, else raise.

    ``secrets`` is one secret or several (a consumer in the middle of a rotation accepts
    either); one string with spaces counts as several. ``headers`` is looked up without
    regard to case. The timestamp must lie within ``tolerance`` seconds of ``now``
    (default: the current time). Signatures are compared in constant time.

    Raises :class:`SignatureError` naming the reason: a missing header, a malformed or
    out-of-tolerance timestamp, or no matching signature.
    """
    wanted = _header_lookup(headers)
    msg_id = _required(wanted, "webhook-id")
    raw_ts = _required(wanted, "webhook-timestamp")
    raw_sigs = _required(wanted, "webhook-signature")
    try:
        timestamp = int(raw_ts.strip())
    except ValueError:
        raise SignatureError(f"malformed webhook-timestamp {raw_ts!r}") from None
    clock = time.time() if now is None else now
    if timestamp < clock - tolerance:
        raise SignatureError(f"timestamp too old ({clock - timestamp:.0f} s > {tolerance} s)")
    if timestamp > clock + tolerance:
        raise SignatureError(f"timestamp too new ({timestamp - clock:.0f} s > {tolerance} s)")

    secret_list = secrets.split() if isinstance(secrets, str) else list(secrets)
    if not secret_list:
        raise SignatureError("no secret to verify with")
    expected = [
        base64.b64decode(sign(secret, msg_id, timestamp, body).partition(",")[2])
        for secret in secret_list
    ]
    received: list[bytes] = []
    for entry in raw_sigs.split():
        version, _, encoded = entry.partition(",")
        if version != "v1":
            continue
        try:
            received.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    matched = False
    # Compare every pair (no early exit) so the time taken does not hint at which matched.
    for got in received:
        for want in expected:
            matched |= hmac.compare_digest(got, want)
    if not matched:
        raise SignatureError("no matching signature")


def generate_secret(nbytes: int = 32) -> str:
    """A fresh random secret: ``whsec_`` + base64 of ``nbytes`` (24..64) random bytes."""
    if not 24 <= nbytes <= 64:
        raise ValueError("nbytes must be between 24 and 64")
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(nbytes)).decode("ascii")


def _header_lookup(headers: Mapping[str, str]) -> dict[str, str]:
    return {key.lower(): value for key, value in headers.items()}


def _required(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name, "").strip()
    if not value:
        raise SignatureError(f"missing header {name}")
    return value
