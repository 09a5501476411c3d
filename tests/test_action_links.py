"""Signed action links (relay/domain/action_links.py): what a token proves, and that any
change to it proves nothing."""

from __future__ import annotations

import string

import pytest

from sessionhook.relay.domain.action_links import (
    MAX_TOKEN_CHARS,
    ActionLinks,
    LinkClaims,
    LinkError,
    check_form_token,
    form_token,
    sign_link,
    verify_link,
)

pytestmark = pytest.mark.unit

KEY = b"k" * 32
OTHER = b"o" * 32
CLAIMS = LinkClaims(
    account="default",
    session="sessions/12345678901234567890",
    wait="sessions/12345678901234567890/activities/" + "a" * 32,
    action="approve_plan",
    expires=1_800_000_000.0,
)
NOW = 1_700_000_000.0


def reason(keys: list[bytes], token: str, now: float = NOW) -> str:
    with pytest.raises(LinkError) as caught:
        verify_link(keys, token, now)
    return caught.value.reason


def test_a_signed_link_gives_back_its_claims() -> None:
    token = sign_link(KEY, CLAIMS)
    assert set(token) <= set(string.ascii_letters + string.digits + "-_.")
    assert verify_link([KEY], token, NOW) == CLAIMS
    reply = LinkClaims("acme", "sessions/1", "", "reply", 1_700_000_100.5)
    assert verify_link([KEY], sign_link(KEY, reply), NOW) == reply


def test_any_one_byte_changed_fails() -> None:
    token = sign_link(KEY, CLAIMS)
    alphabet = string.ascii_letters + string.digits + "-_."
    for i, char in enumerate(token):
        for other in {alphabet[(alphabet.index(char) + 1) % len(alphabet)], "A", "="}:
            if other == char:
                continue
            tampered = token[:i] + other + token[i + 1 :]
            assert reason([KEY], tampered) in ("malformed", "bad signature"), (i, other)


def test_a_token_signed_by_another_key_or_expired_is_refused() -> None:
    token = sign_link(KEY, CLAIMS)
    assert reason([OTHER], token) == "bad signature"
    assert reason([], token) == "bad signature"
    assert reason([KEY], token, now=CLAIMS.expires) == "expired"
    # the key ring: an older key kept for the overlap still verifies
    assert verify_link([OTHER, KEY], token, NOW) == CLAIMS


@pytest.mark.parametrize(
    "token",
    ["", ".", "abc", "abc.", ".abc", "a" * (MAX_TOKEN_CHARS + 1), "é.é", "x" * 10_000, "ab.cd.ef"],
)
def test_garbage_is_malformed(token: str) -> None:
    assert reason([KEY], token) == "malformed"


def test_a_signed_payload_that_is_not_claims_is_malformed() -> None:
    # Only the holder of the key can get here; still, nothing but claims is accepted.
    import base64
    import hashlib
    import hmac

    from sessionhook.relay.domain import action_links as al

    def forged(payload: bytes) -> str:
        mac = hmac.new(KEY, al._LINK_LABEL + payload, hashlib.sha256).digest()
        b64 = base64.urlsafe_b64encode
        return b64(payload).rstrip(b"=").decode() + "." + b64(mac).rstrip(b"=").decode()

    payloads = (
        b"{}",
        b'[2,"a","s","","reply",1]',
        b'[1,"a","s","","delete",1]',
        b'[1,"","s","","reply",1]',
        b'[1,"a","s","","reply",true]',
        b"\xff",
    )
    for payload in payloads:
        assert reason([KEY], forged(payload)) == "malformed", payload


def test_form_tokens_are_bound_to_the_link() -> None:
    token = sign_link(KEY, CLAIMS)
    other = sign_link(KEY, LinkClaims("default", "sessions/2", "", "reply", 1_800_000_000))
    good = form_token(KEY, token)
    assert check_form_token([OTHER, KEY], token, good)
    assert not check_form_token([KEY], other, good)
    assert not check_form_token([OTHER], token, good)
    assert not check_form_token([KEY], token, good[:-1] + ("A" if good[-1] != "A" else "B"))
    assert not check_form_token([KEY], token, "é")


def test_links_of_an_event() -> None:
    links = ActionLinks("https://relay.example/", 3600, KEY)
    plan = links.links("default", CLAIMS.session, CLAIMS.wait, "approve_plan", NOW)
    assert set(plan) == {"approve", "open"}
    assert plan["approve"].startswith("https://relay.example/actions/")
    token = plan["approve"].rsplit("/", 1)[1]
    claims = verify_link([KEY], token, NOW)
    assert claims.expires == NOW + 3600 and claims.wait == CLAIMS.wait
    assert plan["open"] == (
        "https://relay.example/console/timeline?session=sessions%2F12345678901234567890"
    )
    reply = links.links("default", CLAIMS.session, "", "reply", NOW)
    assert set(reply) == {"reply", "open"}


def test_action_required_events_carry_the_links_of_their_wait() -> None:
    from sessionhook.api.models import Activity, Session
    from sessionhook.relay.domain.lifecycle import lifecycle_events

    session = Session.model_validate(
        {"name": "sessions/7", "id": "7", "state": "AWAITING_USER_FEEDBACK", "title": "t"}
    )
    asked = Activity.model_validate(
        {"name": "sessions/7/activities/" + "b" * 32, "agentMessaged": {"agentMessage": "Why?"}}
    )
    links = ActionLinks("https://relay.example", 600, KEY)
    [event] = lifecycle_events(session, asked, entered=True, now=NOW, account="acme", links=links)
    data = event.payload()["data"]
    assert data["action"] == "answer" and set(data["links"]) == {"reply", "open"}
    claims = verify_link([KEY], data["links"]["reply"].rsplit("/", 1)[1], NOW)
    assert claims == LinkClaims("acme", "sessions/7", asked.name, "reply", NOW + 600)
    [plain] = lifecycle_events(session, asked, entered=True, now=NOW)
    assert "links" not in plain.payload()["data"]
    done = session.model_copy(update={"state": "COMPLETED"})
    assert all(
        "links" not in e.payload()["data"]
        for e in lifecycle_events(done, None, entered=True, now=NOW, links=links)
    )
