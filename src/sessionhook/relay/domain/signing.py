"""Standard Webhooks signatures: sign, build the header, verify, make secrets (pure).

The scheme (https://www.standardwebhooks.com/): a ``whsec_`` secret, the signed content
``f"{webhook-id}.{webhook-timestamp}.{body}"``, and ``webhook-signature`` holding one
``v1,<base64 HMAC-SHA256>`` per secret in use (a rotation loses no delivery). Asymmetric
(``v1a``): a ``whsk_`` ed25519 signing key (libsodium's layout, or a bare seed) signs, and
consumers verify with the ``whpk_`` public key. Details: docs/domain.md, "Signing".

Errors::

    ValueError        a secret that is not ``whsec_`` + base64 (from :func:`decode_secret`)
    SignatureError    :func:`verify` refused a message; ``reason`` says why
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import secrets as _secrets
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # cryptography (about 9 MB of memory) is imported by the functions that use ed25519,
    # on first use: a relay signing with v1 (HMAC, the default) never loads it.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

#: Prefix of every Standard Webhooks secret.
SECRET_PREFIX = "whsec_"

#: Prefix of an ed25519 signing key (``v1a``) and of its public key.
SIGNING_KEY_PREFIX = "whsk_"
PUBLIC_KEY_PREFIX = "whpk_"

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


#: The decoded key of each secret in use (the dispatcher signs every delivery with the same
#: few secrets; decoding base64 each time cost as much as the HMAC itself).
_hmac_key = functools.lru_cache(maxsize=64)(decode_secret)


@functools.lru_cache(maxsize=64)
def _keyed(secret: str) -> hmac.HMAC:
    """An HMAC-SHA256 already keyed with ``secret``, never updated: each message signs a
    ``copy()`` of it (keying anew hashed the padded key twice per message, about a third
    of the signing time; the body is not concatenated to the prefix either)."""
    return hmac.new(_hmac_key(secret), digestmod=hashlib.sha256)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One signature, ``v1,<base64 HMAC-SHA256>``, over ``"{msg_id}.{timestamp}.{body}"``."""
    mac = _keyed(secret).copy()
    mac.update(f"{msg_id}.{int(timestamp)}.".encode())
    mac.update(body)
    return "v1," + base64.b64encode(mac.digest()).decode("ascii")


def decode_signing_key(key: str) -> Ed25519PrivateKey:
    """The ed25519 private key of a ``whsk_`` key (64 bytes seed + public key, or a 32-byte
    seed). Raises :class:`ValueError` when it is not that; a 64-byte key whose second half
    is not the seed's public key is refused (a corrupted key would sign unverifiably)."""
    text = key.strip()
    if not text.startswith(SIGNING_KEY_PREFIX):
        raise ValueError(f"signing key must start with {SIGNING_KEY_PREFIX}")
    text = text.removeprefix(SIGNING_KEY_PREFIX)
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("signing key is not base64 after the whsk_ prefix") from exc
    if len(raw) not in (32, 64):
        raise ValueError("signing key must hold 32 or 64 bytes (ed25519)")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.from_private_bytes(raw[:32])
    if len(raw) == 64 and _raw_public(private) != raw[32:]:
        raise ValueError("signing key's public half does not match its seed")
    return private


def public_key_of(key: str) -> str:
    """The ``whpk_`` public key of a ``whsk_`` signing key (what consumers verify with)."""
    return PUBLIC_KEY_PREFIX + base64.b64encode(_raw_public(decode_signing_key(key))).decode()


def generate_keypair() -> tuple[str, str]:
    """A fresh ed25519 pair: ``(whsk_ signing key, whpk_ public key)``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    public = _raw_public(private)
    signing_key = SIGNING_KEY_PREFIX + base64.b64encode(seed + public).decode("ascii")
    return signing_key, PUBLIC_KEY_PREFIX + base64.b64encode(public).decode("ascii")


def sign_v1a(key: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One asymmetric signature, ``v1a,<base64 ed25519>``, over the same content as v1."""
    content = f"{msg_id}.{int(timestamp)}.".encode() + body
    return "v1a," + base64.b64encode(decode_signing_key(key).sign(content)).decode("ascii")


def _decode_public_key(key: str) -> Ed25519PublicKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    text = key.strip().removeprefix(PUBLIC_KEY_PREFIX)
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("public key is not whpk_ + base64 of 32 bytes") from exc


def check_key(key: str) -> None:
    """Raise :class:`ValueError` (one line) unless ``key`` is something :func:`verify` takes:
    a ``whsec_`` secret or a ``whpk_`` public key."""
    if key.strip().startswith(PUBLIC_KEY_PREFIX):
        _decode_public_key(key)
    else:
        decode_secret(key)


def _raw_public(private: Ed25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def signature_header(secrets: Iterable[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one signature per secret, space-separated.

    A ``whsk_`` key signs ``v1a`` (ed25519), a ``whsec_`` secret ``v1`` (HMAC).
    """
    signatures = [
        sign_v1a(secret, msg_id, timestamp, body)
        if secret.strip().startswith(SIGNING_KEY_PREFIX)
        else sign(secret, msg_id, timestamp, body)
        for secret in secrets
    ]
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
    either); one string with spaces counts as several. A ``whpk_`` public key checks the
    ``v1a`` (ed25519) signatures. ``headers`` is looked up without
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
    public_keys = [s for s in secret_list if s.startswith(PUBLIC_KEY_PREFIX)]
    expected = [
        base64.b64decode(sign(secret, msg_id, timestamp, body).partition(",")[2])
        for secret in secret_list
        if not secret.startswith(PUBLIC_KEY_PREFIX)
    ]
    received: list[bytes] = []
    received_v1a: list[bytes] = []
    for entry in raw_sigs.split():
        version, _, encoded = entry.partition(",")
        if version not in ("v1", "v1a"):
            continue
        try:
            decoded = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        (received if version == "v1" else received_v1a).append(decoded)
    content = f"{msg_id}.{timestamp}.".encode() + body
    for public in public_keys:
        from cryptography.exceptions import InvalidSignature

        key = _decode_public_key(public)
        for signature in received_v1a:
            try:
                key.verify(signature, content)
            except InvalidSignature:
                continue
            return
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
