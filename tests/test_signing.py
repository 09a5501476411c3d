"""Standard Webhooks signing, cross-checked against the reference ``standardwebhooks`` package."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from sessionhook.relay.domain.signing import (
    SignatureError,
    decode_secret,
    generate_secret,
    sign,
    signature_header,
    verify,
)

pytestmark = pytest.mark.unit

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
OTHER = "whsec_" + base64.b64encode(b"another key, also 32 bytes long!").decode()
BODY = b'{"type":"activity.agent_messaged","timestamp":"2025-01-01T00:00:00.000000Z","data":{}}'
MSG_ID = "evt_0123456789abcdef0123456789abcdef"


def headers(msg_id: str, ts: int, signature: str) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": signature}


def test_known_vector() -> None:
    # The worked example of the Standard Webhooks specification.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    assert (
        sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
        == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


def test_our_signature_verifies_with_the_reference() -> None:
    ts = int(time.time())
    payload = Webhook(SECRET).verify(BODY, headers(MSG_ID, ts, sign(SECRET, MSG_ID, ts, BODY)))
    assert payload["type"] == "activity.agent_messaged"


def test_reference_signature_verifies_with_ours() -> None:
    ts = 1_700_000_000
    ref_sig = Webhook(SECRET).sign(MSG_ID, datetime.fromtimestamp(ts, tz=UTC), BODY.decode())
    assert ref_sig == sign(SECRET, MSG_ID, ts, BODY)
    verify(SECRET, headers(MSG_ID, ts, ref_sig), BODY, now=ts + 10)


@settings(max_examples=60, deadline=None)
@given(
    body=st.text(max_size=300).map(str.encode),
    msg_id=st.from_regex(r"evt_[0-9a-f]{32}", fullmatch=True),
    key=st.binary(min_size=1, max_size=64),
)
def test_any_body_agrees_with_the_reference(body: bytes, msg_id: str, key: bytes) -> None:
    secret = "whsec_" + base64.b64encode(key).decode()
    ts = 1_700_000_000
    ref = Webhook(secret).sign(msg_id, datetime.fromtimestamp(ts, tz=UTC), body.decode())
    assert sign(secret, msg_id, ts, body) == ref
    verify([secret], headers(msg_id, ts, ref), body, now=ts)


def test_rotation_header_has_one_signature_per_secret_and_each_verifies() -> None:
    ts = int(time.time())
    header = signature_header([OTHER, SECRET], MSG_ID, ts, BODY)
    parts = header.split(" ")
    assert parts == [sign(OTHER, MSG_ID, ts, BODY), sign(SECRET, MSG_ID, ts, BODY)]
    # A consumer holding only the old or only the new secret accepts the message.
    Webhook(SECRET).verify(BODY, headers(MSG_ID, ts, header))
    Webhook(OTHER).verify(BODY, headers(MSG_ID, ts, header))
    verify(SECRET, headers(MSG_ID, ts, header), BODY, now=ts)
    verify(f"{OTHER} {SECRET}", headers(MSG_ID, ts, sign(SECRET, MSG_ID, ts, BODY)), BODY, now=ts)


def test_signature_header_needs_a_secret() -> None:
    with pytest.raises(ValueError):
        signature_header([], MSG_ID, 1, BODY)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("body", BODY + b" "),
        ("webhook-id", "evt_ffffffffffffffffffffffffffffffff"),
        ("webhook-timestamp", "1700000001"),
    ],
)
def test_tampering_is_refused_by_both(field: str, value: str | bytes) -> None:
    ts = 1_700_000_000
    hdrs = headers(MSG_ID, ts, sign(SECRET, MSG_ID, ts, BODY))
    body = BODY
    if field == "body":
        assert isinstance(value, bytes)
        body = value
    else:
        assert isinstance(value, str)
        hdrs[field] = value
    with pytest.raises(SignatureError, match="no matching signature"):
        verify(SECRET, hdrs, body, now=ts)


def test_tampered_body_is_refused_by_the_reference_too() -> None:
    ts = int(time.time())
    hdrs = headers(MSG_ID, ts, sign(SECRET, MSG_ID, ts, BODY))
    Webhook(SECRET).verify(BODY, hdrs)
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(SECRET).verify(BODY.replace(b"agent", b"user!"), hdrs)


def test_wrong_secret_is_refused() -> None:
    ts = 1_700_000_000
    with pytest.raises(SignatureError, match="no matching signature"):
        verify(OTHER, headers(MSG_ID, ts, sign(SECRET, MSG_ID, ts, BODY)), BODY, now=ts)


def test_unknown_versions_and_garbage_entries_are_skipped() -> None:
    ts = 1_700_000_000
    good = sign(SECRET, MSG_ID, ts, BODY)
    header = f"v2,abc v1,!!!notbase64 {good}"
    verify(SECRET, headers(MSG_ID, ts, header), BODY, now=ts)
    with pytest.raises(SignatureError, match="no matching signature"):
        verify(SECRET, headers(MSG_ID, ts, "v2," + good.partition(",")[2]), BODY, now=ts)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_header(missing: str) -> None:
    ts = 1_700_000_000
    hdrs = headers(MSG_ID, ts, sign(SECRET, MSG_ID, ts, BODY))
    del hdrs[missing]
    with pytest.raises(SignatureError, match=f"missing header {missing}"):
        verify(SECRET, hdrs, BODY, now=ts)


def test_headers_are_case_insensitive() -> None:
    ts = 1_700_000_000
    hdrs = {k.title(): v for k, v in headers(MSG_ID, ts, sign(SECRET, MSG_ID, ts, BODY)).items()}
    verify(SECRET, hdrs, BODY, now=ts)


def test_timestamp_tolerance() -> None:
    ts = 1_700_000_000
    hdrs = headers(MSG_ID, ts, sign(SECRET, MSG_ID, ts, BODY))
    verify(SECRET, hdrs, BODY, now=ts + 300)
    verify(SECRET, hdrs, BODY, now=ts - 300)
    with pytest.raises(SignatureError, match="too old"):
        verify(SECRET, hdrs, BODY, now=ts + 301)
    with pytest.raises(SignatureError, match="too new"):
        verify(SECRET, hdrs, BODY, now=ts - 301)
    verify(SECRET, hdrs, BODY, now=ts + 3000, tolerance=3600)


def test_malformed_timestamp() -> None:
    hdrs = headers(MSG_ID, 0, "v1,AAAA")
    hdrs["webhook-timestamp"] = "yesterday"
    with pytest.raises(SignatureError, match="malformed webhook-timestamp"):
        verify(SECRET, hdrs, BODY, now=0)


def test_generate_secret_round_trips() -> None:
    secret = generate_secret()
    assert secret.startswith("whsec_")
    assert len(decode_secret(secret)) == 32
    assert secret != generate_secret()
    assert len(decode_secret(generate_secret(24))) == 24
    with pytest.raises(ValueError):
        generate_secret(8)
    ts = int(time.time())
    Webhook(secret).verify(BODY, headers(MSG_ID, ts, sign(secret, MSG_ID, ts, BODY)))


def test_decode_secret_errors_and_unpadded_input() -> None:
    assert decode_secret("whsec_" + base64.b64encode(b"ab").decode().rstrip("=")) == b"ab"
    assert decode_secret(base64.b64encode(b"no prefix").decode()) == b"no prefix"
    with pytest.raises(ValueError, match="not base64"):
        decode_secret("whsec_not base64!")
    with pytest.raises(ValueError, match="empty"):
        decode_secret("whsec_")
