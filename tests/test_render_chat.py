"""Issue 20 item 7: upstream text is data in every chat preset, never markup.

Every sample event is rendered with the issue's strings in every upstream text and URL
(session title and URL, pull request URL, plan steps, question, reason, file paths). Each
service's body is then read the way that service reads it: Slack and Google Chat take
``<...>`` as a control sequence (a link with any label, ``<!channel>``, ``<users/all>``),
Discord and Teams take markdown ``[label](url)`` as a link. No such sequence may be live
unless the relay wrote it around a URL it checked; the bodies keep the services'
documented shapes (``chat_schemas.py``) even when escaping makes the text longer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from sessionhook.relay.domain import render
from sessionhook.relay.domain.chat_markup import http_url, markdown, mrkdwn, mrkdwn_link
from sessionhook.relay.domain.samples import sample_events
from tests.support.chat_schemas import CHAT, CHAT_FORMATS

pytestmark = pytest.mark.unit

#: The issue's strings.
EVIL_URL = "https://agent.example.com/s/1> <!channel> <https://evil.example|label"
EVIL_TEXT = (
    "<users/all> <https://evil.example|Approve plan> [Approve plan](https://evil.example/b) "
    "<!channel> <@U123> & done"
)
GOOD_SESSION_URL = "https://agent.example.com/session/14550388554331055113"
GOOD_PR_URL = "https://github.com/acme/api/pull/7"
#: Keys whose string values come from upstream (and are not ids or enums).
TEXT_KEYS = {"title", "agentMessage", "userMessage", "question", "reason", "description", "path"}


def _poisoned(node: Any, *, urls: bool) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if isinstance(value, str) and key in TEXT_KEYS:
                out[key] = EVIL_TEXT
            elif isinstance(value, str) and key == "url" and urls:
                out[key] = EVIL_URL
            else:
                out[key] = _poisoned(value, urls=urls)
        return out
    if isinstance(node, list):
        return [_poisoned(item, urls=urls) for item in node]
    return node


def hostile_bodies(*, urls: bool) -> Iterator[tuple[str, str, bytes]]:
    """(event id, type, body) of every sample with the issue's strings in its upstream text
    (and URLs, when ``urls``)."""
    for event in sample_events():
        payload = _poisoned(json.loads(event.body), urls=urls)
        yield event.id, event.type, json.dumps(payload).encode()


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def slack_controls(text: str) -> list[str]:
    """What Slack mrkdwn / Google Chat read as control sequences: each ``<...>``."""
    return re.findall(r"<([^<>]*)>", text)


def unescaped(text: str) -> str:
    """The characters of markdown ``text`` that are not escaped by a backslash."""
    out, escaped = [], False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        else:
            out.append(char)
    return "".join(out)


def rendered(fmt: str, event_id: str, body: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(render.render(event_id, body, render.Shape(format=fmt))[0])
    return out


def hostile_messages(name: str, urls: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event type, message) of service ``name`` for every hostile sample, each checked
    against the service's documented shape."""
    for event_id, event_type, body in hostile_bodies(urls=urls):
        message = rendered(CHAT_FORMATS[name], event_id, body)
        jsonschema.validate(message, CHAT[name])
        yield event_type, message


def allowed_links(urls: bool) -> set[str]:
    """The URLs that may be live links: none when every upstream URL is the issue's."""
    return set() if urls else {GOOD_SESSION_URL, GOOD_PR_URL}


URLS = pytest.mark.parametrize("urls", [True, False], ids=["hostile-urls", "good-urls"])


@URLS
@pytest.mark.parametrize("name", ["slack", "gchat"])
def test_slack_and_google_chat_show_upstream_text_without_a_live_control_sequence(
    name: str, urls: bool
) -> None:
    allowed = allowed_links(urls)
    seen_escaped = False
    for event_type, message in hostile_messages(name, urls):
        for text in strings(message):
            for control in slack_controls(text):
                # Only links the relay wrote around a checked URL: <url> or <url|label>.
                target, _, label = control.partition("|")
                assert target in allowed, (event_type, control)
                assert "<" not in label and ">" not in label, (event_type, control)
            assert "<!channel>" not in text and "<users/all>" not in text
            seen_escaped |= "&lt;users/all&gt;" in text and "&lt;!channel&gt;" in text
        if urls:
            assert EVIL_URL not in json.dumps(message)  # shown escaped, never as it came
    assert seen_escaped  # the text is still shown, as text


@URLS
@pytest.mark.parametrize("name", ["discord", "teams"])
def test_discord_and_teams_show_upstream_text_without_a_live_markdown_link(
    name: str, urls: bool
) -> None:
    allowed = allowed_links(urls)
    seen = False
    for event_type, message in hostile_messages(name, urls):
        if name == "discord":
            assert message["allowed_mentions"] == {"parse": []}  # no pings whatever it says
            embed = message["embeds"][0]
            texts = [message["content"], embed["title"], embed.get("description", "")]
            texts += [field["value"] for field in embed["fields"]]
            links = [embed["url"]] if "url" in embed else []
            # A bare URL in a field is auto-linked (its label is itself).
            links += [v for f in embed["fields"] if re.fullmatch(r"https?://\S+", v := f["value"])]
        else:
            card = message["attachments"][0]["content"]
            texts = [block["text"] for block in card["body"]]
            links = [action["url"] for action in card.get("actions", [])]
        for text in texts:
            bare = unescaped(text)
            # No link, autolink or mention syntax is left unescaped.
            assert not set("[]<>") & set(bare), (event_type, text)
            seen |= "[Approve plan](https://evil.example/b)" in text.replace("\\", "")
        assert set(links) <= allowed, (event_type, links)
    assert seen


def test_escaping_keeps_each_field_within_its_service_limit() -> None:
    """Escapes make text longer (``<`` is four characters in Slack): the limits apply to
    the escaped text, and an escape is never cut in half."""
    event = next(e for e in sample_events() if e.type == "session.failed")
    payload = json.loads(event.body)
    payload["data"]["session"]["title"] = "<[&" * 5000
    payload["data"]["reason"] = ">)&" * 5000
    body = json.dumps(payload).encode()
    for name, fmt in CHAT_FORMATS.items():
        message = rendered(fmt, event.id, body)
        jsonschema.validate(message, CHAT[name])
        for text in strings(message):
            if name in ("slack", "gchat"):  # no entity cut short: "&l..."
                assert not re.search(r"&[a-z]{0,3}\.\.\.$", text), text
            else:  # no escaping backslash left alone before the "..."
                assert not re.search(r"(?<!\\)(\\\\)*\\\.\.\.$", text), text


def test_the_filters_templates_can_use() -> None:
    assert mrkdwn("<!here> & <x|y>") == "&lt;!here&gt; &amp; &lt;x|y&gt;"
    assert mrkdwn(None) == ""
    assert markdown("[a](b) <@1> \\") == "\\[a\\]\\(b\\) \\<@1\\> \\\\"
    assert mrkdwn("<<<<", limit=10) == "&lt;..."
    assert markdown("[[[[", limit=6) == "\\[..."
    for good in ("https://github.com/acme/api/pull/7?a=1&b=2", "HTTP://x.example"):
        assert http_url(good) == good
    for bad in (
        EVIL_URL,
        "javascript:alert(1)",
        "https://x.example/a b",
        "https://x.example/a|b",
        "https://x.example/a)b",
        "https://x.example/\u202ecod.exe",
        "ftp://x.example/",
        "https:///path-only",
        "https://" + "a" * 3000,
        42,
        None,
    ):
        assert http_url(bad) == "", bad
    assert mrkdwn_link("https://x.example/?a=1&b=2", "<b>") == (
        "<https://x.example/?a=1&amp;b=2|&lt;b&gt;>"
    )
    assert mrkdwn_link("https://x.example/") == "<https://x.example/>"
    assert mrkdwn_link(EVIL_URL, "Open") == "Open: " + mrkdwn(EVIL_URL)


def test_a_user_template_can_use_the_chat_filters() -> None:
    event_id, _, body = next(hostile_bodies(urls=True))
    template = (
        '{"text": {{ (session.title | mrkdwn ~ " " ~ session.url | mrkdwn_link("open")) '
        '| tojson }}, "md": {{ session.title | markdown | tojson }}, '
        '"ok": {{ (session.url | http_url) | tojson }}}'
    )
    out = json.loads(render.render(event_id, body, render.Shape(template=template))[0])
    assert slack_controls(out["text"]) == []
    assert not set("[]<>") & set(unescaped(out["md"]))
    assert out["ok"] == ""


# --------------------------------------------------------------------------- action buttons

PUBLIC_URL = "https://relay.example.com/hook"
TOKEN = "WzEsImEiXQ.c2lnbmF0dXJl"
ACT_URL = f"{PUBLIC_URL}/actions/{TOKEN}"
OPEN_URL = f"{PUBLIC_URL}/console/timeline?session=sessions%2F14550388554331055113"


def with_links(body: bytes, links: dict[str, Any]) -> bytes:
    """``body`` with ``links`` where a ``session.action_required`` event carries its action
    links (``data.links``)."""
    payload = json.loads(body)
    payload["data"]["links"] = links
    return json.dumps(payload).encode()


def good_links(body: bytes) -> dict[str, str]:
    kind = "approve" if json.loads(body)["data"]["action"] == "approve_plan" else "reply"
    return {kind: ACT_URL, "open": OPEN_URL}


def waits(*, hostile: bool) -> Iterator[tuple[str, bytes, dict[str, str]]]:
    """(event id, body with its links, the links) of both kinds of wait."""
    samples = (
        ((i, b) for i, t, b in hostile_bodies(urls=True) if t == "session.action_required")
        if hostile
        else ((e.id, e.body) for e in sample_events() if e.type == "session.action_required")
    )
    for event_id, body in samples:
        links = good_links(body)
        yield event_id, with_links(body, links), links


def buttons(name: str, message: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, url) of each action button of a service's message, in order."""
    if name == "slack":
        blocks = [b for b in message["blocks"] if b["type"] == "actions"]
        return [(e["text"]["text"], e["url"]) for b in blocks for e in b["elements"]]
    if name == "gchat":
        return [
            (button["text"], button["onClick"]["openLink"]["url"])
            for card in message.get("cardsV2", [])
            for section in card["card"]["sections"]
            for widget in section["widgets"]
            for button in widget["buttonList"]["buttons"]
        ]
    if name == "teams":
        actions = message["attachments"][0]["content"].get("actions", [])
        return [(a["title"], a["url"]) for a in actions if a["title"] != "Open the session"]
    fields = message["embeds"][0]["fields"]
    found = [re.fullmatch(r"\[([^\]]+)\]\((\S+)\)", f["value"]) for f in fields]
    return [(m[1], m[2]) for m in found if m]


def linked(fmt: str, event_id: str, body: bytes, public_url: str | None = PUBLIC_URL) -> Any:
    return json.loads(
        render.render(event_id, body, render.Shape(format=fmt, public_url=public_url))[0]
    )


@pytest.mark.parametrize("name", list(CHAT))
def test_a_wait_with_links_gets_buttons_in_each_services_documented_shape(name: str) -> None:
    for event_id, body, links in waits(hostile=False):
        message = linked(CHAT_FORMATS[name], event_id, body)
        jsonschema.validate(message, CHAT[name])
        act_label = "Approve plan" if "approve" in links else "Reply"
        assert buttons(name, message) == [(act_label, ACT_URL), ("Open session", OPEN_URL)]
        if name != "slack":
            continue
        actions = next(b for b in message["blocks"] if b["type"] == "actions")["elements"]
        kind = "approve" if "approve" in links else "reply"
        assert [(e["action_id"], e.get("value")) for e in actions] == [
            (f"sessionhook_{kind}", TOKEN),
            ("sessionhook_open", None),
        ]
        inputs = [b for b in message["blocks"] if b["type"] == "input"]
        if kind == "reply":  # the box a Slack app's Reply reads from state.values
            assert [b["element"]["action_id"] for b in inputs] == ["sessionhook_reply_text"]
        else:
            assert inputs == []


def test_without_links_or_without_public_url_every_message_is_as_before() -> None:
    for name, fmt in CHAT_FORMATS.items():
        for event in sample_events():
            plain = render.render(event.id, event.body, render.Shape(format=fmt))
            shaped = render.Shape(format=fmt, public_url=PUBLIC_URL)
            assert render.render(event.id, event.body, shaped) == plain
        for event_id, body, _ in waits(hostile=False):
            assert buttons(name, linked(fmt, event_id, body, public_url=None)) == []


@pytest.mark.parametrize(
    "url",
    [
        "https://evil.example/hook/actions/T",
        "https://relay.example.com@evil.example/hook/actions/T",
        "https://relay.example.com.evil.example/hook/actions/T",
        "http://relay.example.com/hook/actions/T",  # the scheme is part of the origin
        "https://relay.example.com/other/actions/T",  # not under public_url's path
        "https://relay.example.com/hookx/actions/T",
        "javascript:alert(1)//relay.example.com/hook/",
        "https://relay.example.com/hook/a) [x](https://evil.example",
        "https://relay.example.com/hook/<!channel>",
        f"{PUBLIC_URL}/" + "a" * 1000,
        42,
        None,
    ],
)
def test_a_link_not_under_the_relays_public_url_is_never_a_button(url: Any) -> None:
    for event_id, body, links in waits(hostile=False):
        bad = with_links(body, {name: url for name in links})
        for name, fmt in CHAT_FORMATS.items():
            message = linked(fmt, event_id, bad)
            assert buttons(name, message) == [], (name, url)
            if isinstance(url, str):
                assert url not in json.dumps(message), (name, url)


def test_the_public_urls_host_is_compared_without_case_and_its_path_exactly() -> None:
    data = {"links": {"approve": "HTTPS://Relay.Example.com/hook/actions/T"}}
    assert render.action_links(data, "https://relay.example.com/hook") == {
        "approve": {"url": "HTTPS://Relay.Example.com/hook/actions/T", "token": "T"}
    }
    assert render.action_links(data, "https://relay.example.com/HOOK") == {}
    assert render.action_links(data, None) == {}
    assert render.action_links({"links": "https://relay.example.com/hook/x"}, PUBLIC_URL) == {}


@pytest.mark.parametrize("name", list(CHAT))
def test_upstream_text_stays_text_next_to_the_buttons(name: str) -> None:
    """The issue's strings in the title, the plan steps and the question, with buttons."""
    seen = False
    for event_id, body, _ in waits(hostile=True):
        message = linked(CHAT_FORMATS[name], event_id, body)
        jsonschema.validate(message, CHAT[name])
        assert set(url for _, url in buttons(name, message)) == {ACT_URL, OPEN_URL}
        if name in ("slack", "gchat"):
            for text in strings(message):
                assert slack_controls(text) == [], text  # every upstream URL is the evil one
                assert "<!channel>" not in text and "<users/all>" not in text
                seen |= "&lt;!channel&gt;" in text
            continue
        if name == "discord":
            embed = message["embeds"][0]
            texts = [message["content"], embed["title"], embed.get("description", "")]
            texts += [f["value"] for f in embed["fields"] if not f["value"].startswith("[")]
        else:
            texts = [b["text"] for b in message["attachments"][0]["content"]["body"]]
        for text in texts:
            assert not set("[]<>") & set(unescaped(text)), text
            seen |= "[Approve plan](https://evil.example/b)" in text.replace("\\", "")
    assert seen


def test_the_issues_strings_around_the_buttons_stay_text_in_every_format() -> None:
    """A title and a question with ``<!channel>``, ``*bold*``, ``](http://evil)`` and HTML:
    no mention, link or tag is live next to the buttons, and the buttons are the relay's."""
    hostile = "<!channel> *bold* ](http://evil.example) <b>html</b> [x](http://evil.example)"
    for event in sample_events():
        if event.type != "session.action_required":
            continue
        payload = json.loads(event.body)
        payload["data"]["session"]["title"] = hostile
        payload["data"]["question"] = hostile
        for step in (payload["data"].get("plan") or {}).get("steps", []):
            step["title"] = hostile
        body = with_links(json.dumps(payload).encode(), good_links(event.body))
        for name, fmt in CHAT_FORMATS.items():
            message = linked(fmt, event.id, body)
            jsonschema.validate(message, CHAT[name])
            assert {url for _, url in buttons(name, message)} == {ACT_URL, OPEN_URL}
            everything = json.dumps(message)
            assert "http://evil.example" not in {url for _, url in buttons(name, message)}
            if name in ("slack", "gchat"):
                assert "<!channel>" not in everything and "<b>" not in everything
                assert (
                    "&lt;!channel&gt; *bold* ](http://evil.example) &lt;b&gt;html&lt;/b&gt;"
                    in everything
                )
            else:
                assert "](http://evil" not in everything.replace("\\\\]\\\\(", "")
                assert "\\\\<b\\\\>html\\\\</b\\\\>" in everything
