"""The relay against an emulator that answers 404 on new sessions for a while (issue 11:
``--consistency-delay``, the real service's eventual consistency right after a create)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from sessionhook.emulator.app import create_app
from tests.support.daemon_setup import API_KEY, Setup

pytestmark = pytest.mark.app


@pytest.mark.anyio
async def test_a_session_that_answers_404_at_first_is_delivered_whole(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    setup.emulator = create_app(
        api_keys=(API_KEY,), step_delay=0.05, seed=11, consistency_delay=1.5
    )
    daemon = setup.daemon()
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        api = setup.api(http)
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        created = await api.create_session("A short task")
        # The emulator really answers 404 right after the create.
        probe = await http.get(
            f"http://emu.test/v1alpha/{created.name}", headers={"x-vendor-api-key": API_KEY}
        )
        assert probe.status_code == 404
        await setup.receiver.wait_for(
            lambda r: any(a.type == "session.completed" for a in r.first_deliveries()),
            within=30,
        )
        names = [a.name async for a in api.iter_activities(created.name)]
        await setup.receiver.wait_for(
            lambda r: (
                {
                    a.body["data"]["activity"]["name"]
                    for a in r.first_deliveries()
                    if a.type.startswith("activity.")
                }
                == set(names)
            ),
            within=30,
        )
        daemon.stop()
    arrivals = setup.receiver.first_deliveries()
    discovered = [a for a in arrivals if a.type == "session.discovered"]
    # Announced from the full session (GET retried past the 404s), not the list item.
    assert len(discovered) == 1 and discovered[0].body["data"]["session"]["url"]
    assert setup.receiver.rejected == []
