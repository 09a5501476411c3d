"""The head of the list, read every second in every mode: a new session is found there
while nothing works, and out of list mode one page is read. What a working session costs in
list mode: a walk when the list shows it moved, a read of the session when the list shows
its state changed (or a walk finds the end of its run), nothing else; and nothing is lost or
told out of order for it."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sessionhook.api.models import Session
from sessionhook.relay.polling.learning import LEARN_AFTER
from tests.support import virtual_time
from tests.support.poller_harness import PollerHarness, Rewrite

pytestmark = [pytest.mark.app, pytest.mark.anyio]

ROUNDS = 40  # seconds of the emulator's clock, one agent step each: a session finishes


def _made(h: PollerHarness, before: int) -> Counter[str]:
    return Counter(label for label, _ in h.requests[before:])


async def _seen(h: PollerHarness, name: str) -> Session:
    """The session as the list shows it now (the uncounted client; the same clock)."""
    page = await h.api.list_sessions()
    return next(s for s in page.sessions if s.name == name)


async def test_a_session_is_read_when_the_list_shows_its_state_change_not_after_walks(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, mode="list") as h:
        source = (await h.api.list_sources()).sources[0].name
        session = await h.api.create_session(
            "Fix the flaky test", source=source, automation_mode="AUTO_CREATE_PR"
        )
        name = session.name
        await h.poller.discover()  # discovery's read
        await h.poller.poll_due()  # the first walk
        assert h.count("get_session") == 1
        previous = await _seen(h, name)
        changes = 0
        for _ in range(ROUNDS):
            h.clock.now += 1.0
            listed = await _seen(h, name)
            before = len(h.requests)
            await h.poller.read_head()
            await h.poller.poll_due()
            made = _made(h, before)
            moved = listed.update_time != previous.update_time
            changed = listed.state != previous.state
            changes += changed
            # A walk when (and only when) the list showed the session move; a read of the
            # session when it showed a new state, not after the walks that found plans,
            # approvals or messages. A settling session's sweep is that same walk.
            assert made["list_activities"] == int(moved), (listed.state, made)
            assert made["get_session"] == int(changed), (listed.state, made)
            previous = listed
            if listed.state == "COMPLETED":
                break
        assert previous.state == "COMPLETED"
        assert changes >= 3  # QUEUED -> PLANNING -> IN_PROGRESS -> COMPLETED
        assert sorted(h.archived(name)) == sorted(await h.upstream_activities(name))
        events = list(h.store.store.operator.iter_events(session=name))
        types = [e.type for e in events]
        # Every state change told, the pull request before the completion, the completion
        # after its activity and carrying it.
        assert types.count("session.state_changed") == changes
        assert types.count("session.pull_request_opened") == 1
        assert types.count("session.completed") == 1
        done = types.index("session.completed")
        assert types.index("session.pull_request_opened") < done
        assert types.index("activity.session_completed") < done
        body = json.loads(events[done].body)
        completion = [e for e in events if e.type == "activity.session_completed"]
        assert body["data"]["activity_name"] == completion[0].activity_name


async def test_when_the_list_stops_being_read_a_change_it_was_to_show_is_read(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, mode="auto") as h:
        session = await h.api.create_session("Add a health check", require_plan_approval=True)
        name = session.name
        await h.poller.discover()
        await h.poller.poll_due()
        # Learning (auto, no verdict yet): the head is read while the session works.
        for _ in range(ROUNDS):
            h.clock.now += 1.0
            await h.poller.read_head()
            await h.poller.poll_due()
            if (await _seen(h, name)).state == "PLANNING":
                break
        # The plan is generated and the session waits for its approval; the walk that
        # finds the plan does not read the session (the list is to show the new state)...
        h.clock.now += 1.0
        assert (await _seen(h, name)).state == "AWAITING_PLAN_APPROVAL"
        before = len(h.requests)
        await h.poller.poll_due()  # (its timer) before the list is read
        assert _made(h, before)["get_session"] == 0
        found = [e.type for e in h.store.store.operator.iter_events(session=name)]
        assert "activity.plan_generated" in found
        # ...and when the learning ends on "still" (the head is no longer read), it is.
        await h.poller.scheduler.observe(False, name)
        before = len(h.requests)
        await h.poller.poll_due()
        assert _made(h, before)["get_session"] == 1
        told = [e.type for e in h.store.store.operator.iter_events(session=name)]
        assert "session.action_required" in told


class LaggingListState(Rewrite):
    """The session list shows a finished session still ``IN_PROGRESS`` (its ``updateTime``
    as it is): a list read that falls between the end of a run and its state."""

    def edit(self, request: httpx.Request, body: dict[str, Any]) -> bool:
        if not request.url.path.endswith("/sessions"):
            return False
        for listed in body.get("sessions", []):
            if listed.get("state") == "COMPLETED":
                listed["state"] = "IN_PROGRESS"
                self.edited.append(listed["name"])
        return True


async def test_a_walk_that_finds_the_end_of_the_run_reads_the_session_at_once(
    tmp_path: Path,
) -> None:
    lagging = LaggingListState()
    async with lagging.harness(tmp_path, mode="list") as h:
        session = await h.api.create_session("Fix the flaky test")
        name = session.name
        await h.poller.discover()
        await h.poller.poll_due()
        for _ in range(ROUNDS):
            h.clock.now += 1.0
            before = len(h.requests)
            await h.poller.read_head()
            await h.poller.poll_due()
            if lagging.edited:
                break
        # The list showed it move, not its new state: the walk found the completion, and
        # the session was read at once (a session resumed before the next list read would
        # otherwise hide its completion).
        assert lagging.edited
        assert _made(h, before)["get_session"] == 1
        types = [e.type for e in h.store.store.operator.iter_events(session=name)]
        assert types.count("session.completed") == 1
        assert types.index("activity.session_completed") < types.index("session.completed")


async def test_once_list_mode_is_learned_the_learnings_timer_polls_wait_for_the_safety_poll(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, mode="auto", safety_interval=30.0) as h:
        session = await h.api.create_session("Fix the flaky test")
        await h.poller.discover()
        await h.poller.poll_due()
        h.clock.now += 0.5
        await h.poller.read_head()  # learning: the head is read, and shows the session
        tracked = h.poller.state.tracked[session.name]
        assert tracked.due_at is not None and tracked.last_polled is not None
        assert tracked.due_at == tracked.last_polled + 1.0  # the learning's timer
        for _ in range(LEARN_AFTER):  # the server moves updateTime: list mode
            await h.poller.scheduler.observe(True, session.name)
        assert h.poller.list_driven
        # The session is polled when the list shows it move, else at its safety poll: the
        # timer set while learning does not walk it a second later.
        assert tracked.due_at == tracked.last_polled + 30.0
        h.clock.now += 1.0
        before = len(h.requests)
        await h.poller.poll_due()
        assert _made(h, before)["list_activities"] == 0
        await h.poller.read_head()  # the list shows it moved: walked now
        await h.poller.poll_due()
        assert _made(h, before)["list_activities"] == 1


@pytest.mark.parametrize("mode", ["auto", "timer"])
async def test_a_new_session_is_found_by_the_head_while_nothing_works(
    tmp_path: Path, mode: str
) -> None:
    # Full passes an hour apart: only the head's reads can find the session.
    async with PollerHarness(
        tmp_path, mode=mode, discovery_interval=3600.0, list_interval=0.01
    ) as h:
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.poller.run)
            await h.poller.first_pass_done.wait()
            assert not h.poller.state.tracked  # an empty account: nothing works
            h.clock.now += 1.0  # the head's next read is due (the pass was a second ago)
            session = await h.api.create_session("Add a health check")
            with anyio.fail_after(30):  # a guard against a hang, not a measure
                await h.enqueued_event.wait()  # its session.discovered
            tg.cancel_scope.cancel()
        assert session.name in h.poller.state.tracked
        types = [e.type for e in h.store.store.operator.iter_events(session=session.name)]
        assert types == ["session.discovered"]
        assert h.count("list_sessions") >= 3  # the pass's two lists, then the head


class HoldLaterPages(httpx.AsyncBaseTransport):
    """Holds every request for a later page of the session list until ``release``."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.held = anyio.Event()
        self.release = anyio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/sessions") and "pageToken" in request.url.params:
            self.held.set()
            await self.release.wait()
        return await self._inner.handle_async_request(request)


async def test_a_new_session_is_found_by_the_head_while_the_first_pass_goes_on(
    tmp_path: Path,
) -> None:
    """A restart over a large archive makes a long first pass: the head is read once the
    pass has read its first page, not once it ends."""
    async with PollerHarness(
        tmp_path, wrap=HoldLaterPages, page_size=1, discovery_interval=3600.0, list_interval=0.01
    ) as h:
        hold = h.transport(HoldLaterPages)
        for i in range(2):
            await h.api.create_session(f"Task {i}")  # two pages of one
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.poller.run)
            with anyio.fail_after(30):  # guards against a hang, not measures
                await hold.held.wait()  # the first pass waits for its second page
                h.clock.now += 1.0  # the head's next read is due
                session = await h.api.create_session("Add a health check")
                # Tracked in the same step as its session.discovered wakes the dispatcher.
                while session.name not in h.poller.state.tracked:
                    h.enqueued_event = anyio.Event()
                    await h.enqueued_event.wait()
            assert not h.poller.first_pass_done.is_set()
            hold.release.set()
            with anyio.fail_after(30):
                await h.poller.first_pass_done.wait()
            tg.cancel_scope.cancel()
        types = [e.type for e in h.store.store.operator.iter_events(session=session.name)]
        assert types == ["session.discovered"]


async def test_out_of_list_mode_the_head_read_is_its_first_page(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path, mode="timer", page_size=10) as h:
        for i in range(11):  # the oldest working session is on the second page
            await h.api.create_session(f"Task {i}")
        await h.poller.discover()
        assert len(h.poller.state.tracked) == 11
        before = h.count("list_sessions")
        # Working sessions are polled on their timer: the head is read for new sessions.
        assert await h.poller.read_head() == 1
        assert h.count("list_sessions") == before + 1


class ArchivedListTimes(httpx.AsyncBaseTransport):
    """Notes when (``clock``) the archived sessions' list is read: once a full pass."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.clock: Callable[[], float] = lambda: 0.0
        self.times: list[float] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/sessions") and "filter" in request.url.params:
            self.times.append(self.clock())
        return await self._inner.handle_async_request(request)


def test_full_passes_over_a_long_list_keep_within_list_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """17 sessions in pages of 2 and the archived list's page: 10 pages a pass. At 60
    requests a minute, half of them for the passes, a pass every 20 s, not every
    ``discovery_interval`` (2 s). On a fake clock (tests/support/virtual_time.py), which
    stands still while the store's thread works."""
    busy = virtual_time.store_busy(monkeypatch)

    async def main(loop: virtual_time.VirtualTimeLoop) -> list[float]:
        async with PollerHarness(
            tmp_path,
            wrap=ArchivedListTimes,
            monotonic=loop.time,
            mode="timer",
            page_size=2,
            list_interval=3600.0,
            requests_per_minute=60,
            list_share=0.5,
        ) as h:
            passes = h.transport(ArchivedListTimes)
            passes.clock = loop.time
            for i in range(17):
                await h.api.create_session(f"Task {i}")
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.poller.run)
                await anyio.sleep(65.0)
                tg.cancel_scope.cancel()
            return passes.times

    times = virtual_time.run(main, busy=busy)
    assert len(times) == 4, times
    assert all(
        later - earlier == pytest.approx(20.0, abs=0.01) for earlier, later in pairwise(times)
    )
