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
