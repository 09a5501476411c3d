"""Archived sessions, as the real service and its official SDK have them (beyond the interface
spec): the default session list leaves them out. The real daemon runs in process against
the emulator, whose clock the test moves, and delivers to a verifying receiver.

A session archived while it works is paused; a message resumes it: the relay follows it to
its completion (through the list of archived sessions, ``filter=archived = true``). A session
that was archived before the relay first saw it is discovered all the same."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.clock import Clock
from tests.support.daemon_setup import Setup
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.app, pytest.mark.anyio]

WITHIN = 30.0
STEP = 0.05  # the emulator's step delay (Setup's)


def types_of(receiver: Receiver, session: str) -> list[str]:
    return [a.type for a in receiver.first_deliveries() if a.session == session]


def states_of(receiver: Receiver, session: str) -> list[str]:
    return [
        a.body["data"]["session"]["state"]
        for a in receiver.first_deliveries()
        if a.session == session and a.type == "session.state_changed"
    ]


async def test_a_session_archived_mid_work_is_followed_to_its_completion(tmp_path: Path) -> None:
    clock = Clock(1_750_000_000.0)
    setup = Setup(tmp_path, clock=clock)
    daemon = setup.daemon()
    receiver = setup.receiver
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        api = setup.api(http)
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        clock.now = time.time() + 1  # a session newer than the relay's start: no history
        created = await api.create_session("Add a changelog")
        clock.advance(3 * STEP)  # started, planned, approved: at work
        await receiver.wait_for(
            lambda r: "activity.plan_approved" in types_of(r, created.name), within=WITHIN
        )
        archived = await api.archive(created.name)
        assert (archived.state, archived.archived) == ("PAUSED", True)
        assert [s.name async for s in api.iter_sessions()] == []  # out of the default list
        await receiver.wait_for(lambda r: "PAUSED" in states_of(r, created.name), within=WITHIN)
        await api.send_message(created.name, "Go on, please")
        clock.advance(60 * STEP)  # the reply, the rest of the plan, the completion
        await receiver.wait_for(
            lambda r: "session.completed" in types_of(r, created.name), within=WITHIN
        )
        await api.unarchive(created.name)
        await receiver.wait_for(
            lambda r: "session.unarchived" in types_of(r, created.name), within=WITHIN
        )
        daemon.stop()
    seen = types_of(receiver, created.name)
    assert seen.count("session.completed") == 1
    assert seen.count("session.archived") == 1 and seen.count("session.unarchived") == 1
    assert seen.index("session.archived") < seen.index("session.completed")
    assert "activity.user_messaged" in seen and "activity.agent_messaged" in seen
    assert states_of(receiver, created.name)[-1] == "COMPLETED"
    assert receiver.rejected == []


async def test_a_session_archived_before_it_was_seen_is_discovered(tmp_path: Path) -> None:
    clock = Clock(1_750_000_000.0)
    setup = Setup(tmp_path, clock=clock)
    daemon = setup.daemon()
    receiver = setup.receiver
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        api = setup.api(http)
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        clock.now = time.time() + 1  # a session newer than the relay's start: no history
        created = await api.create_session("Tidy the README")
        await api.archive(created.name)  # before any discovery pass could list it
        await receiver.wait_for(
            lambda r: "session.discovered" in types_of(r, created.name), within=WITHIN
        )
        daemon.stop()
    (discovered,) = [a for a in receiver.first_deliveries() if a.type == "session.discovered"]
    assert discovered.body["data"]["session"]["name"] == created.name


class FilterBlind(httpx.AsyncBaseTransport):
    """The emulator behind a server that refuses (400) or ignores the list's ``filter``;
    it counts the filtered list requests."""

    def __init__(self, inner: httpx.AsyncBaseTransport, *, refuse: bool) -> None:
        self.inner = inner
        self.refuse = refuse
        self.filtered = 0
        self.lists = 0  # the default list's requests: one a discovery pass (or the head)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        listing = request.method == "GET" and request.url.path.endswith("/sessions")
        if listing and "filter" not in request.url.params:
            self.lists += 1
        if listing and "filter" in request.url.params:
            self.filtered += 1
            if self.refuse:
                body = {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "no"}}
                return httpx.Response(400, json=body)
            params = request.url.params.remove("filter")
            request = httpx.Request(
                request.method, request.url.copy_with(params=params), headers=request.headers
            )
        return await self.inner.handle_async_request(request)


@pytest.mark.parametrize("refuse", [True, False], ids=["refused", "ignored"])
async def test_a_server_without_the_archived_list_is_asked_no_more(
    tmp_path: Path, refuse: bool
) -> None:
    """A 400 says it at once; a server that ignores the filter shows it with its first
    session (an item not marked archived): asked no more from then on."""
    setup = Setup(tmp_path)
    blind = FilterBlind(httpx.ASGITransport(setup.emulator), refuse=refuse)
    daemon = setup.daemon(upstream_transport=blind)
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        api = setup.api(http)
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        created = await api.create_session("Add a health endpoint")
        await setup.receiver.wait_for(
            lambda r: "session.completed" in types_of(r, created.name), within=WITHIN
        )
        asked, lists = blind.filtered, blind.lists
        with anyio.fail_after(WITHIN):  # three more passes of the default list
            while blind.lists < lists + 3:  # noqa: ASYNC110 (the transport has no event)
                await anyio.sleep(0.05)
        daemon.stop()
    assert blind.filtered == asked
    assert asked == 1 if refuse else asked >= 1  # ignored: seen with the first session
