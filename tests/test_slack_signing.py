"""Slack's v0 request signature (issue 23 item 4), with requests signed the way Slack's
documentation describes: ``v0=`` + hex HMAC-SHA256(signing secret,
``"v0:" + X-Slack-Request-Timestamp + ":" + raw body``), timestamps within 5 minutes."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from sessionhook.relay.domain.slack_signing import (
    MAX_SKEW,
    SlackSignatureError,
    slack_signature,
    verify_slack_request,
)

pytestmark = pytest.mark.unit

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
NOW = 1_531_420_618
#: The worked example of Slack's "Verifying requests from Slack" page: its secret, its
#: timestamp, its slash-command body and the signature it says Slack sends.
DOC_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&"
    b"channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&"
    b"command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands"
    b"%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015."
    b"47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
DOC_SIGNATURE = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
BODY = b"payload=%7B%22type%22%3A%22block_actions%22%7D"


def signed_by_slack(secret: str, timestamp: int, body: bytes) -> str:
    """The signature as Slack's documentation builds it (written out, not our function)."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify(
    timestamp: str | None, signature: str | None, body: bytes = BODY, now: float = NOW
) -> None:
    verify_slack_request(SECRET, timestamp=timestamp, signature=signature, body=body, now=now)


def refusal(*args: object, **kwargs: object) -> str:
    with pytest.raises(SlackSignatureError) as caught:
        verify(*args, **kwargs)  # type: ignore[arg-type]
    return caught.value.reason


def test_slacks_worked_example_verifies() -> None:
    assert slack_signature(SECRET, str(NOW), DOC_BODY) == DOC_SIGNATURE
    verify(str(NOW), DOC_SIGNATURE, DOC_BODY)


@pytest.mark.parametrize("skew", [0, 1, -1, MAX_SKEW, -MAX_SKEW])
def test_a_signed_request_within_five_minutes_either_way_is_accepted(skew: int) -> None:
    stamp = NOW + skew
    verify(str(stamp), signed_by_slack(SECRET, stamp, BODY))


@pytest.mark.parametrize("skew", [MAX_SKEW + 1, -(MAX_SKEW + 1), 86400, -86400 * 365])
def test_a_replayed_or_future_request_is_refused_even_correctly_signed(skew: int) -> None:
    stamp = NOW + skew
    assert refusal(str(stamp), signed_by_slack(SECRET, stamp, BODY)).startswith("stale")


def test_a_forged_request_is_refused() -> None:
    stamp = str(NOW)
    assert refusal(stamp, signed_by_slack("another app's secret", NOW, BODY)) == "bad signature"
    # One byte of the body changed after signing.
    assert refusal(stamp, signed_by_slack(SECRET, NOW, BODY), BODY + b"x") == "bad signature"
    # The signature of another moment, with this moment's timestamp.
    assert refusal(stamp, signed_by_slack(SECRET, NOW - 1, BODY)) == "bad signature"
    good = signed_by_slack(SECRET, NOW, BODY)
    flipped = good[:-1] + ("0" if good[-1] != "0" else "1")
    assert refusal(stamp, flipped) == "bad signature"


@pytest.mark.parametrize(
    ("timestamp", "signature", "reason"),
    [
        (None, None, "unsigned"),
        (str(NOW), None, "unsigned"),
        (None, "v0=" + "0" * 64, "unsigned"),
        ("", "", "unsigned"),
        ("12.5", "v0=" + "0" * 64, "malformed timestamp"),
        ("-1", "v0=" + "0" * 64, "malformed timestamp"),
        ("1e9", "v0=" + "0" * 64, "malformed timestamp"),
        ("9" * 40, "v0=" + "0" * 64, "malformed timestamp"),
        (str(NOW), "v1=" + "0" * 64, "unknown signature version"),
        (str(NOW), "0" * 64, "unknown signature version"),
        (str(NOW), "v0=" + "0" * 63, "malformed signature"),
        (str(NOW), "v0=" + "G" * 64, "malformed signature"),
        (str(NOW), "v0=" + "é" * 64, "malformed signature"),
    ],
)
def test_unsigned_or_malformed_headers_are_refused_by_name(
    timestamp: str | None, signature: str | None, reason: str
) -> None:
    assert refusal(timestamp, signature).startswith(reason)


def test_the_wrong_version_is_refused_even_with_the_right_mac() -> None:
    mac = signed_by_slack(SECRET, NOW, BODY).removeprefix("v0=")
    assert refusal(str(NOW), "v1=" + mac) == "unknown signature version"
