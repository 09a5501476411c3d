"""When a poll reads the session again after its walk: a session's first poll does only
when the walk found activities newer than discovery's own read, and nothing is lost when a
change slips between that read and the walk (the next list read catches it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessionhook.relay.store import Ingest
from tests.support.poller_harness import SETTLED_AFTER, PollerHarness, Rewrite, finish, settled

pytestmark = [pytest.mark.app, pytest.mark.anyio]


class StaleFirstRead(Rewrite):
    """Answers the first GET of each session as if read before it completed: state
    ``IN_PROGRESS``, no outputs, every other field (``updateTime`` included) as it is."""

    def edit(self, request: httpx.Request, body: dict[str, Any]) -> bool:
        parts = request.url.path.strip("/").split("/")
        name = "/".join(parts[1:])
        if len(parts) != 3 or parts[1] != "sessions" or name in self.edited:
            return False
        self.edited.append(name)
        body["state"] = "IN_PROGRESS"
        body.pop("outputs", None)
        return True


class UndatedCompletion(Rewrite):
    """Answers activity pages with the ``createTime`` of the completion left out."""

    def edit(self, request: httpx.Request, body: dict[str, Any]) -> bool:
        if not request.url.path.endswith("/activities"):
            return False
        for activity in body.get("activities", []):
            if "sessionCompleted" in activity:
                del activity["createTime"]
                self.edited.append(activity["name"])
        return True


async def _first_poll_of_settled(h: PollerHarness, prompt: str) -> str:
    """:func:`_settled`, then discovered and polled once."""
    name = await settled(h, prompt)
    await h.poller.discover()
    await h.poller.poll_due()
    return name


def _types(h: PollerHarness, name: str) -> list[str]:
    return [e.type for e in h.store.store.operator.iter_events(session=name)]


async def test_a_session_discovered_settled_is_read_once(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path) as h:
        name = await settled(h, "Add a health check")
        await finish(h, name)
        await h.round(10)  # and nothing more is asked later
        # Discovery's GET is the only one: every activity predates what it read.
        assert h.count("get_session") == 1
        types = _types(h, name)
        for wanted in ("session.discovered", "session.pull_request_opened", "session.completed"):
            assert types.count(wanted) == 1, wanted
        assert "session.state_changed" not in types  # it was COMPLETED when first seen
        # The pull request before the completion, both after the activities.
        assert types.index("session.pull_request_opened") < types.index("session.completed")
        assert types.index("activity.session_completed") < types.index(
            "session.pull_request_opened"
        )


async def test_a_first_walk_past_discoverys_read_reads_the_session_again(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path) as h:
        source = (await h.api.list_sources()).sources[0].name
        session = await h.api.create_session(
            "Fix the flaky test", source=source, automation_mode="AUTO_CREATE_PR"
        )
        await h.poller.discover()  # read while it works
        assert h.count("get_session") == 1
        row = await h.store.run(Ingest.get_session, session.name)
        assert row is not None and row.state != "COMPLETED"
        h.clock.now += SETTLED_AFTER  # it completes before its first poll walks
        await h.poller.poll_due()
        # The walk found activities newer than discovery's read: the session is read again
        # at once, and its completion is told by this very poll.
        assert h.count("get_session") == 2
        types = _types(h, session.name)
        assert "session.state_changed" in types
        assert "session.pull_request_opened" in types
        assert "session.completed" in types


async def test_a_change_discoverys_read_missed_is_told_after_the_next_list_read(
    tmp_path: Path,
) -> None:
    stale = StaleFirstRead()
    async with stale.harness(tmp_path) as h:
        # Discovery reads it "still working" (the change slipped between that read and
        # the walk), and its activities all predate the read: no second GET now...
        name = await _first_poll_of_settled(h, "Rename the config key")
        assert stale.edited == [name]
        assert h.count("get_session") == 1
        types = _types(h, name)
        assert "session.state_changed" not in types
        assert "session.pull_request_opened" not in types
        # ...the next list read shows the state it missed, and the refresh tells it all.
        await h.round()
        assert h.count("get_session") == 2
        events = list(h.store.store.operator.iter_events(session=name))
        changed = [json.loads(e.body) for e in events if e.type == "session.state_changed"]
        assert [(c["data"]["previous_state"], c["data"]["session"]["state"]) for c in changed] == [
            ("IN_PROGRESS", "COMPLETED")
        ]
        types = [e.type for e in events]
        assert types.count("session.pull_request_opened") == 1
        assert types.count("session.completed") == 1
        assert sorted(h.archived(name)) == sorted(await h.upstream_activities(name))


async def test_an_undated_activity_is_not_taken_for_one_discovery_read_covered(
    tmp_path: Path,
) -> None:
    undated = UndatedCompletion()
    async with undated.harness(tmp_path) as h:
        name = await _first_poll_of_settled(h, "Drop the unused flag")
        # Every other activity predates discovery's read, but the completion has no
        # time to compare: the first walk reads the session again, as before.
        assert len(undated.edited) == 1
        assert h.count("get_session") == 2
        assert "activity.session_completed" in _types(h, name)
