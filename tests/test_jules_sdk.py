"""The official Jules SDK (``@google/jules-sdk``, run by Node) against the emulator on a
loopback port: ``archive()``, ``unarchive()`` and the session list with the ``archived``
filter, as the SDK itself sends them (tests/support/jules_sdk.py; ``make jules-sdk``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sessionhook.emulator.app import create_app
from tests.support.jules_sdk import run_sdk
from tests.support.loopback import LoopbackServer

pytestmark = pytest.mark.process

KEY = "sdk-key"


@pytest.fixture
def emulator() -> Iterator[str]:
    # A step delay of an hour: the sessions stay where they are while the SDK runs.
    server = LoopbackServer(create_app(api_keys=(KEY,), step_delay=3600.0, seed=5))
    server.start()
    try:
        yield server.url + "/v1alpha"
    finally:
        server.stop()


def test_archive_unarchive_and_the_archived_list(emulator: str, tmp_path: Path) -> None:
    with httpx.Client(base_url=emulator, headers={"x-vendor-api-key": KEY}) as http:
        ids = [
            http.post("/sessions", json={"prompt": f"Task {n}"}).raise_for_status().json()["id"]
            for n in range(2)
        ]
    script = f"""
const ids = {ids!r};
const names = (list) => list.map((s) => [s.id, s.archived]);
await jules.session(ids[0]).archive();
const archived = await jules.sessions({{ filter: "archived = true", persist: false }}).all();
const listed = await jules.sessions({{ persist: false }}).all();
await jules.session(ids[0]).unarchive();
const after = await jules.sessions({{ filter: "archived = false", persist: false }}).all();
console.log(JSON.stringify({{
  archived: names(archived), listed: names(listed), after: names(after).sort(),
}}));
"""
    seen = run_sdk(script, tmp_path, base_url=emulator, api_key=KEY)
    assert seen["archived"] == [[ids[0], True]]
    assert seen["listed"] == [[ids[1], False]]
    assert seen["after"] == sorted([[ids[0], False], [ids[1], False]])
