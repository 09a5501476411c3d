"""Slack interactivity (issue 23 item 4): ``POST /v1/integrations/slack/interactions``, over
HTTP on loopback, with payloads and signatures built as Slack's documentation describes.

The relay's app and a stand-in for Slack's ``response_url`` both listen on 127.0.0.1; the
performing function of the action links is a recording stand-in (what the route hands it is
what these tests check; the links themselves are tested with their module). No console token
is ever sent: Slack's signature is the only way in.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import anyio
import httpx
import pytest
from pydantic import SecretStr
from structlog.testing import capture_logs

from sessionhook.relay.config import Config
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import WebAuth, WebContext, create_app
from sessionhook.relay.web.api.slack import MAX_BODY
from sessionhook.relay.web.api.slack_payload import response_url_refusal
from sessionhook.relay.web.context import PerformLink
from sessionhook.relay.web.server import serve
from tests.support.slack import INTERACTIONS, ResponseUrl, slack_headers

pytestmark = [pytest.mark.app, pytest.mark.anyio]

SECRET = "e3b0c44298fc1c149afbf4c8996fb924"
NOW = 1_767_000_000.0
CONSOLE_TOKEN = "console-token-" + "z" * 30
PATH = INTERACTIONS
LINK_TOKEN = "WzEsImRlZmF1bHQiXQ.bWFj"


# --------------------------------------------------------------------------- stand-ins


@dataclass
class Performer:
    """A recording stand-in of the action links' performing function (what it is handed:
    the token, the Slack user, the reply)."""

    answer: tuple[bool, str] = (True, "plan approved")
    raises: bool = False
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)

    async def __call__(self, token: str, chat_user: str, text: str | None) -> tuple[bool, str]:
        self.calls.append((token, chat_user, text))
        if self.raises:
            raise RuntimeError("the store is gone")
        return self.answer


def payload(
    slack: ResponseUrl,
    action_id: str = "sessionhook_approve",
    *,
    value: Any = LINK_TOKEN,
    reply: str | None = None,
    user: Any = None,
    response_url: Any = None,
) -> dict[str, Any]:
    """A ``block_actions`` payload as Slack sends it for a click on the preset's button."""
    body: dict[str, Any] = {
        "type": "block_actions",
        "user": user or {"id": "U0123ABCD", "username": "alice", "team_id": "T1"},
        "api_app_id": "A1",
        "container": {"type": "message", "message_ts": "1767000000.000100"},
        "trigger_id": "1.2.abc",
        "team": {"id": "T1", "domain": "acme"},
        "channel": {"id": "C1", "name": "agents"},
        "message": {
            "type": "message",
            "text": "Plan waiting for your approval: Fix it",
            "blocks": [
                {"type": "section", "block_id": "a", "text": {"type": "mrkdwn", "text": "*Plan*"}},
                {"type": "actions", "block_id": "sessionhook_actions", "elements": []},
            ],
        },
        "response_url": slack.url if response_url is None else response_url,
        "actions": [
            {
                "type": "button",
                "block_id": "sessionhook_actions",
                "action_id": action_id,
                "text": {"type": "plain_text", "text": "Approve plan"},
                "value": value,
                "action_ts": "1767000001.000200",
            }
        ],
    }
    if reply is not None:
        body["state"] = {
            "values": {
                "sessionhook_reply": {
                    "sessionhook_reply_text": {"type": "plain_text_input", "value": reply}
                }
            }
        }
    return body


def form(body: dict[str, Any]) -> bytes:
    return urlencode({"payload": json.dumps(body)}).encode()


def signed(body: bytes, *, secret: str = SECRET, at: float = NOW) -> dict[str, str]:
    return slack_headers(body, secret=secret, at=at)


@dataclass
class Relay:
    http: httpx.AsyncClient
    slack: ResponseUrl
    performer: Performer
    logs: list[dict[str, Any]]

    async def click(self, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        return await self.http.post(
            PATH, content=body, headers=signed(body) if headers is None else headers
        )

    async def until(self, check: Callable[[], bool], within: float = 10.0) -> None:
        """Wait (bounded: 500 looks in at most ``within`` seconds) until ``check()``."""
        with anyio.fail_after(within):
            for _ in range(500):
                if check():
                    return
                await anyio.sleep(within / 500)
        raise AssertionError("never happened")

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.logs if line.get("event") == event]


@asynccontextmanager
async def relay(
    *,
    slack_on: bool = True,
    perform: bool = True,
    console: bool = True,
    hosts: tuple[str, ...] = ("127.0.0.1",),
) -> AsyncIterator[Relay]:
    """The relay's web app with ``[slack]`` and a Slack stand-in, both on loopback."""
    slack = ResponseUrl()
    performer = Performer()
    section = {"signing_secret_env": "SLACK_SECRET", "response_url_hosts": list(hosts)}
    config = Config.model_validate(
        {
            "server": {
                "listen": "127.0.0.1:9187",
                **({"token_env": "WEB_TOKEN"} if console else {}),
            },
            "actions": {"enabled": True, "public_url": "https://relay.example.com"},
            **({"slack": section} if slack_on else {}),
        }
    )
    if config.slack is not None:
        resolved = config.slack.with_signing_secret(SecretStr(SECRET))
        config = config.model_copy(update={"slack": resolved})
    perform_link: PerformLink | None = performer if perform else None
    ctx = WebContext(
        config=lambda: config,
        store=lambda: None,
        metrics=Metrics(),
        auth=WebAuth(CONSOLE_TOKEN),
        clock=lambda: NOW,
        perform_link=perform_link,
    )
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            _, slack.port = await tg.start(
                lambda task_status: serve("127.0.0.1:0", slack.app, task_status=task_status)
            )
            _, port = await tg.start(
                lambda task_status: serve("127.0.0.1:0", create_app(ctx), task_status=task_status)
            )
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                yield Relay(http, slack, performer, logs)
            tg.cancel_scope.cancel()


# --------------------------------------------------------------------------- clicks


async def test_an_approve_click_acts_once_and_updates_the_message_through_response_url() -> None:
    async with relay() as r:
        answer = await r.click(form(payload(r.slack)))
        assert answer.status_code == 200
        await r.until(lambda: len(r.slack.updates) == 1)
    assert r.performer.calls == [(LINK_TOKEN, "alice", None)]
    update = r.slack.updates[0]
    assert update["replace_original"] is True
    assert update["text"] == "Plan approved by alice"
    # The message keeps its text, loses its buttons, and says who acted.
    assert [b.get("block_id") for b in update["blocks"]] == ["a", None]
    assert update["blocks"][-1]["elements"][0]["text"] == "Plan approved by alice"


async def test_a_reply_click_sends_the_text_of_the_reply_box() -> None:
    async with relay() as r:
        body = form(payload(r.slack, "sessionhook_reply", reply="  Yes, keep empty values.  "))
        assert (await r.click(body)).status_code == 200
        await r.until(lambda: len(r.slack.updates) == 1)
    assert r.performer.calls == [(LINK_TOKEN, "alice", "Yes, keep empty values.")]
    assert r.slack.updates[0]["text"] == "Answer sent by alice"


async def test_a_reply_with_an_empty_box_makes_no_call_and_tells_the_user_alone() -> None:
    async with relay() as r:
        for reply in ("", "   "):
            assert (
                await r.click(form(payload(r.slack, "sessionhook_reply", reply=reply)))
            ).status_code == 200
        assert (await r.click(form(payload(r.slack, "sessionhook_reply")))).status_code == 200
        await r.until(lambda: len(r.slack.updates) == 3)
    assert r.performer.calls == []
    for update in r.slack.updates:
        assert update["response_type"] == "ephemeral" and update["replace_original"] is False
        assert update["text"].startswith("Not done: type your answer")


@pytest.mark.parametrize(
    ("performed", "said"),
    [
        ((False, "This link was used already."), "Not done: This link was used already."),
        ((False, "no plan <b>waits</b>"), "Not done: no plan &lt;b&gt;waits&lt;/b&gt;"),
    ],
)
async def test_an_action_not_done_says_why_to_the_user_alone(
    performed: tuple[bool, str], said: str
) -> None:
    async with relay() as r:
        r.performer.answer = performed
        assert (await r.click(form(payload(r.slack)))).status_code == 200
        await r.until(lambda: len(r.slack.updates) == 1)
    assert r.slack.updates == [
        {"response_type": "ephemeral", "replace_original": False, "text": said}
    ]


async def test_a_failing_performer_is_a_note_and_a_log_line_never_a_500() -> None:
    async with relay() as r:
        r.performer.raises = True
        assert (await r.click(form(payload(r.slack)))).status_code == 200
        await r.until(lambda: len(r.slack.updates) == 1)
        assert r.logged("web.slack_action_failed")
    assert r.slack.updates[0]["text"] == "Not done: the relay failed to act; see its log"


async def test_the_open_button_and_other_apps_buttons_do_nothing() -> None:
    async with relay() as r:
        for action_id in ("sessionhook_open", "someone_elses_button", "sessionhook_reply_text"):
            assert (await r.click(form(payload(r.slack, action_id, value=None)))).status_code == 200
        await anyio.sleep(0.2)
    assert r.performer.calls == [] and r.slack.updates == []


async def test_who_acted_is_escaped_as_mrkdwn() -> None:
    user = {"id": "U1", "username": "<!channel> *bold* <https://evil.example|x> & co"}
    async with relay() as r:
        assert (await r.click(form(payload(r.slack, user=user)))).status_code == 200
        await r.until(lambda: len(r.slack.updates) == 1)
    text = r.slack.updates[0]["text"]
    assert text == (
        "Plan approved by &lt;!channel&gt; *bold* &lt;https://evil.example|x&gt; &amp; co"
    )
    assert r.performer.calls[0][1] == user["username"]  # the actor is recorded as Slack named it


# --------------------------------------------------------------------------- signatures


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(lambda body: signed(body, secret="not the app's secret"), id="forged"),
        pytest.param(lambda body: signed(body, at=NOW - 301), id="replayed"),
        pytest.param(lambda body: signed(body, at=NOW + 301), id="future"),
        pytest.param(
            lambda body: {"content-type": "application/x-www-form-urlencoded"}, id="unsigned"
        ),
        pytest.param(
            lambda body: {
                **signed(body),
                "x-slack-signature": signed(body)["x-slack-signature"].replace("v0=", "v1="),
            },
            id="wrong-version",
        ),
        pytest.param(lambda body: signed(body + b"&x=1"), id="other-body"),
    ],
)
async def test_a_request_slack_did_not_sign_now_is_401_and_makes_no_call(
    headers: Callable[[bytes], dict[str, str]],
) -> None:
    async with relay() as r:
        body = form(payload(r.slack))
        answer = await r.click(body, headers(body))
        assert answer.status_code == 401
        assert answer.json()["error"]["status"] == "UNAUTHENTICATED"
        assert r.logged("web.slack_refused")
        await anyio.sleep(0.2)
    assert r.performer.calls == [] and r.slack.updates == []
    assert SECRET not in answer.text


async def test_with_the_console_off_slacks_route_is_still_served_and_still_signed() -> None:
    async with relay(console=False) as r:
        assert (await r.http.get("/console")).status_code == 404  # the console is off
        body = form(payload(r.slack))
        unsigned = {"content-type": "application/x-www-form-urlencoded"}
        assert (await r.click(body, unsigned)).status_code == 401
        assert (await r.click(body)).status_code == 200
        await r.until(lambda: len(r.slack.updates) == 1)
    assert r.performer.calls == [(LINK_TOKEN, "alice", None)]


async def test_the_console_token_does_not_stand_in_for_slacks_signature() -> None:
    async with relay() as r:
        body = form(payload(r.slack))
        headers = {
            "authorization": f"Bearer {CONSOLE_TOKEN}",
            "content-type": "application/x-www-form-urlencoded",
        }
        assert (await r.click(body, headers)).status_code == 401
    assert r.performer.calls == []


# --------------------------------------------------------------------------- response_url


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:{port}/actions/x",  # loopback, but not the listed name
        "https://127.0.0.1.evil.example:{port}/actions/x",
        "http://127.0.0.1@evil.example:{port}/actions/x",
        "http://evil.example@127.0.0.1:{port}/actions/x",  # user info
        "ftp://127.0.0.1:{port}/actions/x",
        "http://127.0.0.1:{port}/actions/x y",
        "//127.0.0.1:{port}/actions/x",
    ],
)
async def test_a_response_url_off_the_allow_list_is_never_called(url: str) -> None:
    async with relay() as r:
        target = url.format(port=r.slack.port)
        assert (await r.click(form(payload(r.slack, response_url=target)))).status_code == 200
        await r.until(lambda: bool(r.logged("web.slack_update_skipped")))
    assert r.performer.calls == [(LINK_TOKEN, "alice", None)]  # the action itself happened
    assert r.slack.updates == []


async def test_plain_http_is_refused_even_for_slacks_own_host() -> None:
    async with relay(hosts=("hooks.slack.com",)) as r:
        # The stand-in listens on 127.0.0.1, which this allow-list does not name.
        assert (await r.click(form(payload(r.slack)))).status_code == 200
        await r.until(lambda: bool(r.logged("web.slack_update_skipped")))
    assert r.slack.updates == []


def test_the_response_url_rule() -> None:
    slack = ("hooks.slack.com",)
    assert response_url_refusal("https://hooks.slack.com/actions/T1/1/x", slack) is None
    assert response_url_refusal("https://hooks.slack.com:443/actions/T1/1/x", slack) is None
    for bad in (
        "http://hooks.slack.com/actions/T1/1/x",
        "https://hooks.slack.com:8443/actions/T1/1/x",
        "https://hooks.slack.com.evil.example/actions",
        "https://evil.example/hooks.slack.com",
        "https://user@hooks.slack.com/actions",
        "https://hooks.slack.com/\u202eactions",
        "https://hooks.slack.com:99999/",
        "http://127.0.0.1/actions",
    ):
        assert response_url_refusal(bad, slack) is not None, bad


# --------------------------------------------------------------------------- hostile bodies


def hostile(slack: ResponseUrl) -> list[tuple[str, bytes, str]]:
    """(name, signed body, words the 400 must say)."""
    good = payload(slack)

    def with_(**changes: Any) -> bytes:
        return form({**good, **changes})

    return [
        ("not a form", b"\xff\xfe not utf-8", "url-encoded"),
        ("no payload", urlencode({"other": "1"}).encode(), "payload field"),
        (
            "two payloads",
            urlencode([("payload", "{}"), ("payload", "{}")]).encode(),
            "payload field",
        ),
        ("not json", urlencode({"payload": "{not json"}).encode(), "not JSON"),
        ("deep json", urlencode({"payload": "[" * 20_000}).encode(), "not JSON"),
        ("a list", urlencode({"payload": "[1, 2]"}).encode(), "JSON object"),
        ("another type", with_(type="view_submission"), "block_actions"),
        ("no type", form({k: v for k, v in good.items() if k != "type"}), "block_actions"),
        ("no user", form({k: v for k, v in good.items() if k != "user"}), "payload.user"),
        ("user a string", with_(user="alice"), "payload.user"),
        ("user without name", with_(user={"team_id": "T1"}), "payload.user"),
        ("no actions", with_(actions=[]), "payload.actions"),
        ("actions an object", with_(actions={"action_id": "x"}), "payload.actions"),
        ("action a string", with_(actions=["sessionhook_approve"]), "payload.actions"),
        ("action_id a number", with_(actions=[{"action_id": 7}]), "action_id"),
        ("value missing", with_(actions=[{"action_id": "sessionhook_approve"}]), "value"),
        (
            "value a list",
            with_(actions=[{"action_id": "sessionhook_approve", "value": ["t"]}]),
            "value",
        ),
        (
            "value too long",
            with_(actions=[{"action_id": "sessionhook_approve", "value": "t" * 5000}]),
            "value",
        ),
        ("response_url a number", with_(response_url=42), "response_url"),
        (
            "state not an object",
            form({**payload(slack, "sessionhook_reply"), "state": {"values": []}}),
            "state.values",
        ),
        (
            "reply not a string",
            form(
                {
                    **payload(slack, "sessionhook_reply"),
                    "state": {"values": {"b": {"sessionhook_reply_text": {"value": 5}}}},
                }
            ),
            "reply",
        ),
        ("reply too long", form(payload(slack, "sessionhook_reply", reply="x" * 20_000)), "reply"),
    ]


async def test_hostile_payloads_are_400_by_name_never_500_and_make_no_call() -> None:
    async with relay() as r:
        for name, body, words in hostile(r.slack):
            answer = await r.click(body)
            assert answer.status_code == 400, (name, answer.text)
            assert words in answer.json()["error"]["message"], (name, answer.text)
        big = form(payload(r.slack, value="t" * (1024 * 1024)))
        answer = await r.click(big)
        assert answer.status_code == 413 and str(MAX_BODY) in answer.json()["error"]["message"]
        await anyio.sleep(0.2)
    assert r.performer.calls == [] and r.slack.updates == []


async def test_without_slack_config_404_and_a_relay_not_ready_tells_the_user() -> None:
    async with relay(slack_on=False) as r:
        answer = await r.click(form(payload(r.slack)))
        assert answer.status_code == 404 and "[slack]" in answer.json()["error"]["message"]
    # No stand-in: the real performing function, over a relay whose store is not open yet.
    async with relay(perform=False) as r:
        assert (await r.click(form(payload(r.slack)))).status_code == 200
        await r.until(lambda: len(r.slack.updates) == 1)
    assert r.slack.updates[0]["response_type"] == "ephemeral"
    assert r.slack.updates[0]["text"].startswith("Not done: the relay is starting")
