"""Signed action links end to end: the real daemon (in process, its web server on a loopback
port) polling the emulator, a consumer receiving ``session.action_required`` with
``data.links``, and a person following them over HTTP. Every upstream call the daemon makes
goes through a transport that counts ``:approvePlan`` and ``:sendMessage``: a link that
must not act is checked to have made none."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sessionhook.api.client import SessionsClient
from sessionhook.relay.config.action_keys import ActionKeys
from sessionhook.relay.daemon.daemon import Daemon
from sessionhook.relay.domain.action_links import LinkClaims, sign_link
from sessionhook.relay.store import Ingest
from tests.support.daemon_setup import Setup
from tests.support.loopback import free_port
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.app, pytest.mark.anyio]

WITHIN = 30.0


class CountingTransport(httpx.AsyncBaseTransport):
    """The emulator, with every action the relay asks of it counted."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.acts: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path.endswith((":approvePlan", ":sendMessage")):
            self.acts.append(path)
        return await self.inner.handle_async_request(request)


@dataclass
class Running:
    """The daemon running with ``[actions]`` on, and what a test talks to."""

    setup: Setup
    base: str
    counting: CountingTransport
    daemon: Daemon
    http: httpx.AsyncClient  # a person's browser, on the relay's listener
    client: SessionsClient  # the test's own API client (its calls are not counted)


@asynccontextmanager
async def running(tmp_path: Path, **actions: Any) -> AsyncIterator[Running]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    setup = Setup(
        tmp_path,
        server={"listen": f"127.0.0.1:{port}", "allow_unauthenticated": True},
        actions={"enabled": True, "public_url": base, **actions},
    )
    counting = CountingTransport(httpx.ASGITransport(setup.emulator))
    daemon = setup.daemon(upstream_transport=counting)
    async with (
        setup.api_http() as api_http,
        httpx.AsyncClient(base_url=base, timeout=10) as http,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        try:
            yield Running(setup, base, counting, daemon, http, setup.api(api_http))
        finally:
            daemon.stop()


def _waits(receiver: Receiver, session: str) -> list[dict[str, Any]]:
    return [
        a.body["data"]
        for a in receiver.first_deliveries()
        if a.type == "session.action_required" and a.body["data"]["session"]["name"] == session
    ]


def _form_token(page: str) -> str:
    found = re.search(r'name="form_token" value="([^"]+)"', page)
    assert found, page
    return unescape(found.group(1))


async def _until(check: Callable[[], Awaitable[bool]], within: float = WITHIN) -> None:
    with anyio.fail_after(within):
        for _ in range(int(within / 0.05) + 1):  # bounded in count, and in time above
            if await check():
                return
            await anyio.sleep(0.05)


async def _unfurl(http: httpx.AsyncClient, links: dict[str, str]) -> None:
    """Fetch every link as chat unfurlers and mail scanners do."""
    for url in links.values():
        for method in ("GET", "HEAD", "GET"):
            answer = await http.request(method, url, headers={"user-agent": "Slackbot 1.0"})
            assert answer.status_code in (200, 303), (method, url, answer.status_code)


async def test_a_plan_approved_through_its_link_moves_the_session_on(tmp_path: Path) -> None:
    async with running(tmp_path) as run:
        setup, base, counting = run.setup, run.base, run.counting
        http, client = run.http, run.client
        hostile = "Fix <img src=x onerror=alert(1)> & <script>alert(2)</script>"
        created = await client.create_session(hostile, require_plan_approval=True)
        await setup.receiver.wait_for(lambda r: bool(_waits(r, created.name)), within=WITHIN)
        [data] = _waits(setup.receiver, created.name)
        links = data["links"]
        assert set(links) == {"approve", "open"}
        assert links["approve"].startswith(base + "/actions/")

        # Unfurlers and previews fetch every link: nothing happens.
        await _unfurl(http, links)
        page = await http.get(links["approve"])
        assert "Approve the plan" in page.text and page.headers["cache-control"] == "no-store"
        for step in data["plan"]["steps"]:
            assert step["title"] in unescape(page.text)
        assert "<img" not in page.text and "<script>" not in page.text
        assert counting.acts == []

        token = links["approve"].rsplit("/", 1)[1]
        form = _form_token(page.text)
        # A POST without the page's form token, or with another link's, does nothing.
        assert (await http.post(links["approve"], data={})).status_code in (400, 403)
        assert (
            await http.post(links["approve"], data={"form_token": form[:-2] + "xx"})
        ).status_code == 403
        # One byte changed anywhere in the token: refused, whatever the form says.
        for at in (0, len(token) // 2, len(token) - 1):
            tampered = token[:at] + ("A" if token[at] != "A" else "B") + token[at + 1 :]
            for answer in (
                await http.get(f"{base}/actions/{tampered}"),
                await http.post(f"{base}/actions/{tampered}", data={"form_token": form}),
            ):
                assert answer.status_code in (403, 404), answer.text
        assert counting.acts == []

        done = await http.post(links["approve"], data={"form_token": form})
        assert done.status_code == 200, done.text
        assert "Plan approved" in done.text
        assert counting.acts == [f"/v1alpha/{created.name}:approvePlan"]

        # The session moves on: the next events arrive. The relay reports the states it
        # sees: when the agent finishes between two polls, the state after the wait is
        # COMPLETED, with no IN_PROGRESS seen in between.
        def moved_on(r: Receiver) -> bool:
            return any(
                a.type == "activity.plan_approved"
                and a.body["data"]["session"]["name"] == created.name
                for a in r.first_deliveries()
            ) and any(
                a.type == "session.state_changed"
                and a.body["data"]["session"]["name"] == created.name
                and a.body["data"]["session"]["state"] in ("IN_PROGRESS", "COMPLETED")
                for a in r.first_deliveries()
            )

        await setup.receiver.wait_for(moved_on, within=WITHIN)

        # Used once: the same link again, or its page, gives a clear page and no call.
        again = await http.post(links["approve"], data={"form_token": form})
        assert again.status_code == 409 and "used already" in again.text
        assert (await http.get(links["approve"])).status_code == 409
        assert counting.acts == [f"/v1alpha/{created.name}:approvePlan"]

        # Recorded: the API, the console's timeline, the metrics.
        listed = (await http.get("/v1/actions")).json()["actions"]
        assert [(a["session"], a["action"], a["result"], a["actor_kind"]) for a in listed] == [
            (created.name, "approve_plan", "ok", "link")
        ]
        assert listed[0]["actor_address"] == "127.0.0.1" and listed[0]["taken_at"].endswith("Z")
        assert token not in str(listed)
        timeline = await http.get("/console/timeline", params={"session": created.name})
        assert 'id="actions-taken"' in timeline.text and "approve_plan" in timeline.text
        metrics = (await http.get("/metrics")).text
        assert 'sessionhook_actions_total{action="approve_plan",result="done"} 1.0' in metrics
        assert 'sessionhook_actions_total{action="approve_plan",result="used"} 1.0' in metrics


async def test_a_reply_through_its_link_reaches_the_agent(tmp_path: Path) -> None:
    async with running(tmp_path) as run:
        setup, counting, http, client = run.setup, run.counting, run.http, run.client
        created = await client.create_session("Tidy the parser [ask]")
        await setup.receiver.wait_for(lambda r: bool(_waits(r, created.name)), within=WITHIN)
        [data] = _waits(setup.receiver, created.name)
        links = data["links"]
        assert set(links) == {"reply", "open"} and data["action"] == "answer"
        await _unfurl(http, links)
        page = await http.get(links["reply"])
        assert unescape(page.text).count(data["question"]) == 1 and "<textarea" in page.text
        form = _form_token(page.text)
        # An empty reply or one over the bound: refused, no call, the link still works.
        for text, why in (("   ", "needs some text"), ("x" * 16_001, "at most 16,000")):
            answer = await http.post(links["reply"], data={"form_token": form, "text": text})
            assert answer.status_code == 409 and why in answer.text
        assert counting.acts == []

        said = "Use <b>the new</b> parser & keep </blockquote><script>alert(1)</script>"
        done = await http.post(links["reply"], data={"form_token": form, "text": said})
        assert done.status_code == 200 and "Message sent" in done.text
        assert "<script>" not in done.text and "&lt;script&gt;" in done.text
        assert counting.acts == [f"/v1alpha/{created.name}:sendMessage"]

        async def reached() -> bool:
            told = [
                a.user_messaged.user_message
                async for a in client.iter_activities(created.name)
                if a.user_messaged is not None
            ]
            return said in told

        await _until(reached)
        again = await http.post(links["reply"], data={"form_token": form, "text": "twice"})
        assert again.status_code == 409
        assert len(counting.acts) == 1


async def test_expired_wrong_session_and_answered_links_make_no_call(tmp_path: Path) -> None:
    async with running(tmp_path, link_ttl=3600) as run:
        setup, base, counting, daemon = run.setup, run.base, run.counting, run.daemon
        http, client = run.http, run.client
        first = await client.create_session("First plan", require_plan_approval=True)
        second = await client.create_session("Second plan", require_plan_approval=True)
        for s in (first, second):
            await setup.receiver.wait_for(lambda r, s=s: bool(_waits(r, s.name)), within=WITHIN)
        [one] = _waits(setup.receiver, first.name)
        [two] = _waits(setup.receiver, second.name)
        assert setup.config.actions.key_file is not None
        key = ActionKeys(setup.config.actions.key_file).ring().current
        now = time.time()
        wait = one["activity_name"]

        def link(claims: LinkClaims) -> str:
            return f"{base}/actions/{sign_link(key, claims)}"

        cases = {
            # Signed by the relay's key, each a valid token of what it claims:
            "expired": (
                link(LinkClaims("default", first.name, wait, "approve_plan", now - 1)),
                410,
            ),
            "wrong session": (
                link(LinkClaims("default", second.name, wait, "approve_plan", now + 600)),
                409,
            ),
            "other account": (
                link(LinkClaims("acme", first.name, wait, "approve_plan", now + 600)),
                409,
            ),
            "wrong action": (
                link(LinkClaims("default", first.name, wait, "reply", now + 600)),
                409,
            ),
            "other key": (
                f"{base}/actions/"
                + sign_link(
                    b"k" * 32, LinkClaims("default", first.name, wait, "approve_plan", now + 600)
                ),
                404,
            ),
            "10 KB": (f"{base}/actions/{'a' * 5000}.{'b' * 5000}", 404),
            "non-ASCII": (f"{base}/actions/%C3%A9t%C3%A9.%E2%9C%93", 404),
        }
        real_form = _form_token((await http.get(one["links"]["approve"])).text)
        for name, (url, status) in cases.items():
            shown = await http.get(url)
            assert shown.status_code == status, (name, shown.text)
            posted = await http.post(url, data={"form_token": real_form})
            assert posted.status_code in (403, status), (name, posted.text)
        assert counting.acts == []

        # Answered elsewhere (here: straight through the API): the link no longer acts,
        # even from its page opened before.
        two_form = _form_token((await http.get(two["links"]["approve"])).text)
        await client.approve_plan(second.name)

        async def archived_moved_on() -> bool:
            store = daemon.store
            row = None if store is None else await store.run(Ingest.get_session, second.name)
            return row is not None and row.state != "AWAITING_PLAN_APPROVAL"

        await _until(archived_moved_on)
        page = await http.get(two["links"]["approve"])
        assert page.status_code == 409 and "no longer waits" in page.text
        late = await http.post(two["links"]["approve"], data={"form_token": two_form})
        assert late.status_code == 409 and "no longer waits" in late.text
        assert counting.acts == []


async def test_a_reload_turns_the_links_on(tmp_path: Path) -> None:
    async with running(tmp_path, enabled=False) as run:
        setup, client, http = run.setup, run.client, run.http
        before = await client.create_session("Before the reload", require_plan_approval=True)
        await setup.receiver.wait_for(lambda r: bool(_waits(r, before.name)), within=WITHIN)
        [plain] = _waits(setup.receiver, before.name)
        assert "links" not in plain
        text = setup.config_path.read_text().replace("enabled = false", "enabled = true")
        setup.config_path.write_text(text)
        assert await run.daemon.reload() is True
        after = await client.create_session("After the reload", require_plan_approval=True)
        await setup.receiver.wait_for(lambda r: bool(_waits(r, after.name)), within=WITHIN)
        [linked] = _waits(setup.receiver, after.name)
        page = await http.get(linked["links"]["approve"])
        assert page.status_code == 200 and "Approve the plan" in page.text


async def test_an_approval_from_the_console_is_recorded_and_ends_the_links_wait(
    tmp_path: Path,
) -> None:
    async with running(tmp_path) as run:
        setup, counting, http, client = run.setup, run.counting, run.http, run.client
        created = await client.create_session("From the console", require_plan_approval=True)
        await setup.receiver.wait_for(lambda r: bool(_waits(r, created.name)), within=WITHIN)
        [data] = _waits(setup.receiver, created.name)
        link_form = _form_token((await http.get(data["links"]["approve"])).text)
        timeline = await http.get("/console/timeline", params={"session": created.name})
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', timeline.text)
        assert csrf is not None, timeline.text
        form = {
            "csrf_token": unescape(csrf.group(1)),
            "session": created.name,
            "action": "approve_plan",
            "back": "/console",
        }
        # Through a reverse proxy on this machine (trusted by default): the address it saw.
        proxied = {"x-forwarded-for": "203.0.113.9"}
        done = await http.post("/console/actions/session", data=form, headers=proxied)
        assert done.status_code == 303
        assert counting.acts == [f"/v1alpha/{created.name}:approvePlan"]
        # At once, before the poller saw the session move on: the link says so, no call.
        late = await http.post(data["links"]["approve"], data={"form_token": link_form})
        assert late.status_code == 409 and "no longer waits" in late.text
        assert len(counting.acts) == 1
        [row] = (await http.get("/v1/actions")).json()["actions"]
        assert (row["actor_kind"], row["result"], row["wait"], row["actor_address"]) == (
            "console",
            "ok",
            data["activity_name"],
            "203.0.113.9",
        )
        # Counted like the links' actions: the console's approval and the link refused after.
        metrics = (await http.get("/metrics")).text
        assert 'sessionhook_actions_total{action="approve_plan",result="done"} 1.0' in metrics
        assert 'sessionhook_actions_total{action="approve_plan",result="answered"} 1.0' in metrics
