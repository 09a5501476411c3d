"""The archive surface beyond the interface spec, as the official SDK calls it: the emulator's
``:archive`` / ``:unarchive`` and the session list's ``archived`` filter, the client's
``archive()``, ``unarchive()`` and ``list_sessions(filter=...)``, and the CLI's ``sessions
archive|unarchive`` and ``sessions list --archived``. All in process with a fake clock."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette

from sessionhook.api import SessionsClient
from sessionhook.api.client import ARCHIVED_FILTER
from sessionhook.api.errors import InvalidArgumentError
from sessionhook.cli import cli
from sessionhook.cli._output import Runtime
from sessionhook.emulator.app import create_app
from tests.support.clock import Clock

pytestmark = [pytest.mark.app, pytest.mark.anyio]

KEY = "key-a"
OTHER = "key-b"
BASE = "http://emulator.test"
SOURCE = "sources/github/acme/webapp"


@pytest.fixture
def clock() -> Clock:
    return Clock(1_750_000_000.0)


@pytest.fixture
def app(clock: Clock) -> Starlette:
    return create_app(api_keys=[KEY, OTHER], seed=3, step_delay=1.0, clock=clock)


def connect(app: Starlette, key: str = KEY, header: str = "x-vendor-api-key") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url=BASE, headers={header: key})


@pytest.fixture
async def api(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with connect(app) as client:
        yield client


async def create(api: httpx.AsyncClient, prompt: str = "Fix the login timeout") -> str:
    response = await api.post("/v1alpha/sessions", json={"prompt": prompt})
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def listed(api: httpx.AsyncClient, **params: str) -> list[dict[str, Any]]:
    response = await api.get("/v1alpha/sessions", params=params)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json().get("sessions", [])
    return found


async def session(api: httpx.AsyncClient, session_id: str) -> dict[str, Any]:
    response = await api.get(f"/v1alpha/sessions/{session_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# --------------------------------------------------------------------------- the emulator


async def test_archive_leaves_the_default_list_and_the_filter_finds_it(
    api: httpx.AsyncClient,
) -> None:
    kept, archived = await create(api, "Keep me"), await create(api, "Archive me")
    answer = await api.post(f"/v1alpha/sessions/{archived}:archive")
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == archived and answer.json()["archived"] is True
    assert [s["id"] for s in await listed(api)] == [kept]
    assert "archived" not in (await listed(api))[0]  # false is omitted, as the service does
    found = await listed(api, filter="archived = true")
    assert [(s["id"], s["archived"]) for s in found] == [(archived, True)]
    assert [s["id"] for s in await listed(api, filter="archived=false")] == [kept]
    assert (await session(api, archived))["archived"] is True
    # Archiving twice is archiving once; unarchiving brings it back.
    assert (await api.post(f"/v1alpha/sessions/{archived}:archive", json={})).status_code == 200
    back = await api.post(f"/v1alpha/sessions/{archived}:unarchive", content=b"")
    assert back.status_code == 200 and "archived" not in back.json()
    assert {s["id"] for s in await listed(api)} == {kept, archived}
    assert await listed(api, filter="archived = true") == []


async def test_archiving_a_working_session_pauses_it_and_a_message_resumes_it(
    api: httpx.AsyncClient, clock: Clock
) -> None:
    session_id = await create(api)
    clock.advance(3.0)  # started, planned, approved: at work
    assert (await session(api, session_id))["state"] == "IN_PROGRESS"
    paused = await api.post(f"/v1alpha/sessions/{session_id}:archive")
    assert paused.json()["state"] == "PAUSED"
    count = len((await api.get(f"/v1alpha/sessions/{session_id}/activities")).json()["activities"])
    clock.advance(30.0)
    still = await api.get(f"/v1alpha/sessions/{session_id}/activities")
    assert len(still.json()["activities"]) == count, "a paused session does not work"
    sent = await api.post(f"/v1alpha/sessions/{session_id}:sendMessage", json={"prompt": "go on"})
    assert sent.status_code == 200
    assert (await session(api, session_id))["state"] == "IN_PROGRESS"
    clock.advance(30.0)
    done = await session(api, session_id)
    assert (done["state"], done["archived"]) == ("COMPLETED", True)


async def test_archiving_a_finished_session_keeps_its_state(
    api: httpx.AsyncClient, clock: Clock
) -> None:
    session_id = await create(api)
    clock.advance(30.0)
    answer = await api.post(f"/v1alpha/sessions/{session_id}:archive")
    assert answer.json()["state"] == "COMPLETED"


@pytest.mark.parametrize(
    "expression",
    [
        'state = "COMPLETED"',
        "archived = maybe",
        "archived = true OR archived = false",
        "x" * 10_000,
    ],
)
async def test_an_unsupported_filter_is_400_naming_it(
    api: httpx.AsyncClient, expression: str
) -> None:
    response = await api.get("/v1alpha/sessions", params={"filter": expression})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert repr(expression)[:60] in error["message"]
    assert error["details"][0]["fieldViolations"][0]["field"] == "filter"


async def test_archive_errors(app: Starlette, api: httpx.AsyncClient) -> None:
    session_id = await create(api)
    missing = await api.post("/v1alpha/sessions/123:archive")
    assert missing.status_code == 404
    async with connect(app, OTHER) as other:
        assert (await other.post(f"/v1alpha/sessions/{session_id}:unarchive")).status_code == 403
    bad = await api.post(f"/v1alpha/sessions/{session_id}:archive", content=b"[1")
    assert bad.status_code == 400
    assert (await api.get(f"/v1alpha/sessions/{session_id}:archive")).status_code == 405


async def test_the_sdk_key_header_and_the_source_context_fields(app: Starlette) -> None:
    async with connect(app, header="X-Goog-Api-Key") as sdk:
        body = {
            "prompt": "Add a health endpoint",
            "sourceContext": {
                "source": SOURCE,
                "workingBranch": "sessionhook/health",
                "environmentVariablesEnabled": True,
            },
        }
        created = await sdk.post("/v1alpha/sessions", json=body)
        assert created.status_code == 200, created.text
        context = created.json()["sourceContext"]
        assert context["workingBranch"] == "sessionhook/health"
        assert context["environmentVariablesEnabled"] is True
        again = await session(sdk, created.json()["id"])
        assert again["sourceContext"] == context


async def test_pages_of_the_archived_list_belong_to_that_list(api: httpx.AsyncClient) -> None:
    ids = [await create(api, f"Task {n}") for n in range(3)]
    for session_id in ids:
        await api.post(f"/v1alpha/sessions/{session_id}:archive")
    first = await api.get("/v1alpha/sessions", params={"filter": "archived = true", "pageSize": 2})
    token = first.json()["nextPageToken"]
    rest = await api.get(
        "/v1alpha/sessions", params={"filter": "archived = true", "pageToken": token}
    )
    assert len(rest.json()["sessions"]) == 1
    # The token of the archived list is refused by the default list.
    assert (await api.get("/v1alpha/sessions", params={"pageToken": token})).status_code == 400


# --------------------------------------------------------------------------- the client


async def test_the_client_archives_unarchives_and_filters(app: Starlette) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http:
        client = SessionsClient(http, base_url=BASE, api_key=KEY)
        created = await client.create_session("Tidy the README")
        archived = await client.archive(created.name)
        assert archived.archived is True and archived.name == created.name
        page = await client.list_sessions(filter=ARCHIVED_FILTER)
        assert [s.name for s in page.sessions] == [created.name]
        assert (await client.list_sessions()).sessions == []
        walked = [s.name async for s in client.iter_sessions(filter=ARCHIVED_FILTER)]
        assert walked == [created.name]
        pages = [p async for p in client.walk_sessions(filter=ARCHIVED_FILTER)]
        assert [s.name for p in pages for s in p.sessions] == [created.name]
        back = await client.unarchive(created.id)
        assert not back.archived
        assert [s.name for s in (await client.list_sessions()).sessions] == [created.name]
        with pytest.raises(InvalidArgumentError, match="archived = sometimes"):
            await client.list_sessions(filter="archived = sometimes")


# --------------------------------------------------------------------------- the CLI


def run_cli(app: Starlette, *args: str) -> Any:
    runtime = Runtime(transport=httpx.ASGITransport(app=app))
    env = {"SESSIONHOOK_API_KEY": KEY, "SESSIONHOOK_BASE_URL": BASE}
    return CliRunner().invoke(cli, list(args), obj=runtime, env=env)


def test_the_cli_archives_unarchives_and_lists_archived(app: Starlette) -> None:
    made = run_cli(app, "sessions", "create", "Add a changelog", "--json")
    name = json.loads(made.stdout)["name"]
    archived = run_cli(app, "sessions", "archive", name)
    assert archived.exit_code == 0, archived.output
    assert archived.stdout.startswith(f"archived {name} (")
    default = run_cli(app, "sessions", "list", "--json")
    assert json.loads(default.stdout) == {}
    only = json.loads(run_cli(app, "sessions", "list", "--archived", "--all", "--json").stdout)
    assert [(s["name"], s["archived"]) for s in only["sessions"]] == [(name, True)]
    shown = run_cli(app, "sessions", "get", name).stdout
    assert "archived" in shown and "yes" in shown
    back = run_cli(app, "sessions", "unarchive", name, "--json")
    assert back.exit_code == 0 and "archived" not in json.loads(back.stdout)
    missing = run_cli(app, "sessions", "archive", "sessions/404")
    assert missing.exit_code != 0 and missing.stderr.count("\n") == 1
    assert "Traceback" not in missing.output
