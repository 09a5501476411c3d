"""The emulator through httpx.ASGITransport with a fake clock: every endpoint and error."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette

from sessionhook.api.models import EVENT_MEMBERS, Activity, Session, Source
from sessionhook.emulator.app import create_app
from sessionhook.emulator.world import World
from tests.support.clock import Clock

pytestmark = pytest.mark.app

KEY = "key-a"
OTHER = "key-b"
START = 1_750_000_000.0
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
HEX32 = re.compile(r"^[0-9a-f]{32}$")
SOURCE = "sources/github/acme/webapp"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"


def make_app(clock: Clock, **options: Any) -> Starlette:
    options.setdefault("api_keys", [KEY, OTHER])
    options.setdefault("seed", 1)
    options.setdefault("step_delay", 1.0)
    return create_app(clock=clock, **options)


def connect(app: Starlette, key: str | None = KEY) -> httpx.AsyncClient:
    headers = {"x-vendor-api-key": key} if key is not None else {}
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://emulator", headers=headers)


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def app(clock: Clock) -> Starlette:
    return make_app(clock)


@pytest.fixture
async def api(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with connect(app) as client:
        yield client


@pytest.fixture
async def other(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with connect(app, OTHER) as client:
        yield client


def error_of(response: httpx.Response, code: int, status: str) -> dict[str, Any]:
    """Assert the status and the error body shape; return the ``error`` object."""
    assert response.status_code == code, response.text
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert error["code"] == code
    assert error["status"] == status
    assert isinstance(error["message"], str) and error["message"]
    return error


def violations(response: httpx.Response) -> list[dict[str, str]]:
    error = error_of(response, 400, "INVALID_ARGUMENT")
    (detail,) = error["details"]
    assert detail["@type"] == BAD_REQUEST
    found: list[dict[str, str]] = detail["fieldViolations"]
    return found


async def create(api: httpx.AsyncClient, prompt: str = "Fix the login timeout", **body: Any) -> str:
    response = await api.post("/v1alpha/sessions", json={"prompt": prompt, **body})
    assert response.status_code == 200, response.text
    session_id: str = response.json()["id"]
    return session_id


async def state_of(api: httpx.AsyncClient, session_id: str) -> str:
    response = await api.get(f"/v1alpha/sessions/{session_id}")
    assert response.status_code == 200
    state: str = response.json()["state"]
    return state


async def run_until(
    api: httpx.AsyncClient, clock: Clock, session_id: str, *states: str
) -> list[str]:
    """Step the clock one step delay at a time until a state in ``states``; the states seen."""
    seen = [await state_of(api, session_id)]
    for _ in range(40):
        if seen[-1] in states:
            return seen
        clock.advance(1.0)
        state = await state_of(api, session_id)
        if state != seen[-1]:
            seen.append(state)
    raise AssertionError(f"never reached {states}: {seen}")


async def activities(
    api: httpx.AsyncClient, session_id: str, **params: Any
) -> list[dict[str, Any]]:
    """Every activity of the session, walking all pages."""
    found: list[dict[str, Any]] = []
    token = None
    while True:
        query = dict(params, **({"pageToken": token} if token else {}))
        response = await api.get(f"/v1alpha/sessions/{session_id}/activities", params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        found += body.get("activities", [])
        token = body.get("nextPageToken")
        if token is None:
            return found


def event_of(activity: dict[str, Any]) -> str | None:
    members = [key for key in EVENT_MEMBERS if key in activity]
    assert len(members) <= 1, activity
    return members[0] if members else None


# --------------------------------------------------------------------------- sessions


@pytest.mark.anyio
async def test_create_returns_a_queued_session(api: httpx.AsyncClient) -> None:
    context = {"source": SOURCE, "hostRepoContext": {"startingBranch": "develop"}}
    response = await api.post(
        "/v1alpha/sessions",
        json={"prompt": "add retries to the uploader\nmore text", "sourceContext": context},
    )
    assert response.status_code == 200
    body = response.json()
    assert re.fullmatch(r"\d{20}", body["id"])
    assert body["name"] == f"sessions/{body['id']}"
    assert body["state"] == "QUEUED"
    assert body["title"] == "Add retries to the uploader"
    assert body["prompt"] == "add retries to the uploader\nmore text"
    assert body["sourceContext"] == context
    assert body["url"].endswith(body["id"])
    assert TIMESTAMP.match(body["createTime"]) and body["updateTime"] == body["createTime"]
    assert body["createTime"] == "2025-06-15T15:06:40.000000Z"
    assert "outputs" not in body and "requirePlanApproval" not in body
    Session.model_validate(body)


@pytest.mark.anyio
async def test_create_keeps_a_given_title_and_ignores_unknown_fields(
    api: httpx.AsyncClient,
) -> None:
    response = await api.post(
        "/v1alpha/sessions", json={"prompt": "p", "title": "Mine", "someFutureField": [1]}
    )
    assert response.status_code == 200
    assert response.json()["title"] == "Mine"
    assert "someFutureField" not in response.json()


@pytest.mark.anyio
async def test_get_is_full_and_list_items_are_reduced(api: httpx.AsyncClient) -> None:
    session_id = await create(api, sourceContext={"source": SOURCE})
    full = (await api.get(f"/v1alpha/sessions/{session_id}")).json()
    assert {"prompt", "url", "sourceContext"} <= set(full)
    listed = (await api.get("/v1alpha/sessions")).json()
    assert list(listed) == ["sessions"]
    (item,) = listed["sessions"]
    assert set(item) == {"name", "id", "title", "state", "createTime", "updateTime"}
    assert {k: full[k] for k in item} == item


@pytest.mark.anyio
async def test_delete_then_everything_is_404(api: httpx.AsyncClient) -> None:
    session_id = await create(api)
    response = await api.delete(f"/v1alpha/sessions/{session_id}")
    assert response.status_code == 200 and response.json() == {}
    base = f"/v1alpha/sessions/{session_id}"
    error_of(await api.get(base), 404, "NOT_FOUND")
    error_of(await api.delete(base), 404, "NOT_FOUND")
    error_of(await api.get(base + "/activities"), 404, "NOT_FOUND")
    error_of(await api.post(base + ":sendMessage", json={"prompt": "hi"}), 404, "NOT_FOUND")
    error_of(await api.post(base + ":approvePlan", json={}), 404, "NOT_FOUND")
    assert (await api.get("/v1alpha/sessions")).json() == {}  # an empty page omits its list


@pytest.mark.anyio
async def test_unknown_session_activity_and_source_are_404(api: httpx.AsyncClient) -> None:
    error_of(await api.get("/v1alpha/sessions/12345678901234567890"), 404, "NOT_FOUND")
    session_id = await create(api)
    missing = f"/v1alpha/sessions/{session_id}/activities/{'0' * 32}"
    error_of(await api.get(missing), 404, "NOT_FOUND")
    error_of(await api.get("/v1alpha/sources/github/nobody/nothing"), 404, "NOT_FOUND")


# --------------------------------------------------------------------------- auth


@pytest.mark.anyio
async def test_missing_and_unknown_keys_are_401(app: Starlette) -> None:
    for key in (None, "", "wrong-key"):
        async with connect(app, key) as client:
            for response in (
                await client.get("/v1alpha/sessions"),
                await client.post("/v1alpha/sessions", json={"prompt": "x"}),
                await client.get("/v1alpha/sources"),
            ):
                error = error_of(response, 401, "UNAUTHENTICATED")
                assert "API key not valid" in error["message"]
    async with connect(app) as client:  # none of the refused creates happened
        assert (await client.get("/v1alpha/sessions")).json() == {}  # an empty page omits its list


@pytest.mark.anyio
async def test_header_name_is_case_insensitive(app: Starlette) -> None:
    async with connect(app, None) as client:
        response = await client.get("/v1alpha/sources", headers={"X-Vendor-Api-Key": KEY})
    assert response.status_code == 200


@pytest.mark.anyio
async def test_keys_of_one_account_share_its_sessions(clock: Clock) -> None:
    app = make_app(clock, api_keys=[("k1", "k2", "k3"), "solo"])
    async with connect(app, "k1") as first, connect(app, "k3") as third:
        session_id = await create(first)
        assert (await third.get(f"/v1alpha/sessions/{session_id}")).status_code == 200
    assert len(app.state.world.accounts) == 2


def test_create_app_validates_its_options() -> None:
    with pytest.raises(ValueError, match="1 to 3"):
        create_app(api_keys=[("a", "b", "c", "d")])
    with pytest.raises(ValueError, match="create_time_filter"):
        create_app(create_time_filter="sometimes")
    with pytest.raises(ValueError, match="one account only"):
        create_app(api_keys=["a", ("b", "a")])
    with pytest.raises(ValueError, match="probability"):
        create_app(fault_error=1.5)
    assert isinstance(create_app().state.world, World)


@pytest.mark.anyio
async def test_accounts_are_isolated(api: httpx.AsyncClient, other: httpx.AsyncClient) -> None:
    session_id = await create(api)
    assert (await other.get("/v1alpha/sessions")).json() == {}  # an empty page omits its list
    base = f"/v1alpha/sessions/{session_id}"
    error_of(await other.get(base), 403, "PERMISSION_DENIED")
    error_of(await other.get(base + "/activities"), 403, "PERMISSION_DENIED")
    error_of(await other.get(base + f"/activities/{'a' * 32}"), 403, "PERMISSION_DENIED")
    error_of(
        await other.post(base + ":sendMessage", json={"prompt": "x"}), 403, "PERMISSION_DENIED"
    )
    error_of(await other.post(base + ":approvePlan", json={}), 403, "PERMISSION_DENIED")
    error_of(await other.delete(base), 403, "PERMISSION_DENIED")
    assert (await api.get(base)).status_code == 200
    # The other account has the same sources and can work on them.
    await create(other, sourceContext={"source": SOURCE})


# --------------------------------------------------------------------------- routing and bodies


@pytest.mark.anyio
async def test_unknown_routes_are_404_and_wrong_methods_405(api: httpx.AsyncClient) -> None:
    error_of(await api.get("/v1alpha/nothing"), 404, "NOT_FOUND")
    error_of(await api.get("/v1alpha/sessions/"), 404, "NOT_FOUND")
    error_of(await api.post("/v1alpha/sessions/1:explode", json={}), 404, "NOT_FOUND")
    response = await api.put("/v1alpha/sessions")
    error_of(response, 405, "METHOD_NOT_ALLOWED")
    assert {"GET", "POST"} <= set(response.headers["allow"].replace(" ", "").split(","))
    error_of(await api.get("/v1alpha/sessions/1:sendMessage"), 405, "METHOD_NOT_ALLOWED")
    error_of(await api.delete("/v1alpha/sources"), 405, "METHOD_NOT_ALLOWED")
    error_of(await api.post("/v1alpha/sessions/1"), 405, "METHOD_NOT_ALLOWED")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "field"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"{}", "prompt"),
        (b'{"title": "no prompt"}', "prompt"),
        (b'{"prompt": 5}', "prompt"),
        (b'{"prompt": "   "}', "prompt"),
        (b'{"prompt": "p", "sourceContext": {"source": 3}}', "source_context.source"),
        (
            b'{"prompt": "p", "sourceContext": {"source": "sources/github/x/y"}}',
            "source_context.source",
        ),
        (
            b'{"prompt": "p", "sourceContext": {"source": "github/acme/webapp"}}',
            "source_context.source",
        ),
        (
            b'{"prompt": "p", "sourceContext": {"source": "sources/github/acme/webapp",'
            b' "hostRepoContext": {"startingBranch": "nope"}}}',
            "source_context.host_repo_context.starting_branch",
        ),
        (b'{"prompt": "p", "automationMode": "SOMETIMES"}', "automation_mode"),
    ],
)
async def test_bad_create_bodies_are_400(
    api: httpx.AsyncClient, content: bytes, field: str | None
) -> None:
    response = await api.post(
        "/v1alpha/sessions", content=content, headers={"content-type": "application/json"}
    )
    (violation,) = violations(response)
    assert violation.get("field") == field
    assert violation["description"]


@pytest.mark.anyio
async def test_bad_message_bodies_are_400(api: httpx.AsyncClient) -> None:
    session_id = await create(api)
    path = f"/v1alpha/sessions/{session_id}:sendMessage"
    assert violations(await api.post(path, json={}))[0]["field"] == "prompt"
    assert violations(await api.post(path, content=b"nope"))[0].get("field") is None
    assert violations(await api.post(f"/v1alpha/sessions/{session_id}:approvePlan", content=b"{"))


# --------------------------------------------------------------------------- paging


@pytest.mark.anyio
@pytest.mark.parametrize("size", ["0", "101", "-1", "abc", "1.5", "1e2"])
async def test_page_size_out_of_range_is_400(api: httpx.AsyncClient, size: str) -> None:
    session_id = await create(api)
    for path in (
        "/v1alpha/sessions",
        "/v1alpha/sources",
        f"/v1alpha/sessions/{session_id}/activities",
    ):
        (violation,) = violations(await api.get(path, params={"pageSize": size}))
        assert violation["field"] == "page_size"


@pytest.mark.anyio
async def test_page_size_bounds_and_snake_case_parameters(api: httpx.AsyncClient) -> None:
    for size in ("1", "100"):
        assert (await api.get("/v1alpha/sessions", params={"pageSize": size})).status_code == 200
    first = (await api.get("/v1alpha/sources", params={"page_size": "2"})).json()
    assert len(first["sources"]) == 2
    rest = await api.get("/v1alpha/sources", params={"page_token": first["nextPageToken"]})
    assert len(rest.json()["sources"]) == 2 and "nextPageToken" not in rest.json()


@pytest.mark.anyio
async def test_session_pages_default_to_30_newest_first(
    api: httpx.AsyncClient, clock: Clock
) -> None:
    created = []
    for number in range(31):
        created.append(await create(api, f"task number {number}"))
        clock.advance(0.001)
    first = (await api.get("/v1alpha/sessions")).json()
    assert [s["id"] for s in first["sessions"]] == created[::-1][:30]
    second = (
        await api.get("/v1alpha/sessions", params={"pageToken": first["nextPageToken"]})
    ).json()
    assert [s["id"] for s in second["sessions"]] == [created[0]]
    assert "nextPageToken" not in second


@pytest.mark.anyio
async def test_activity_pages_default_to_50_oldest_first(
    api: httpx.AsyncClient, clock: Clock
) -> None:
    session_id = await create(api)
    for number in range(30):
        await api.post(f"/v1alpha/sessions/{session_id}:sendMessage", json={"prompt": f"m{number}"})
    clock.advance(100)
    path = f"/v1alpha/sessions/{session_id}/activities"
    first = (await api.get(path)).json()
    assert len(first["activities"]) == 50
    rest = await activities(api, session_id, pageSize=100)
    assert [a["name"] for a in rest[:50]] == [a["name"] for a in first["activities"]]
    times = [a["createTime"] for a in rest]
    assert times == sorted(times) and len(set(times)) == len(times)
    second = (await api.get(path, params={"pageToken": first["nextPageToken"]})).json()
    assert second["activities"] == rest[50:]
    assert "nextPageToken" not in second


@pytest.mark.anyio
async def test_sources_page_and_filter(api: httpx.AsyncClient) -> None:
    everything = (await api.get("/v1alpha/sources")).json()
    names = [s["name"] for s in everything["sources"]]
    assert names == sorted(names) and len(names) == 4 and "nextPageToken" not in everything
    for source in everything["sources"]:
        assert source["id"] == source["name"].removeprefix("sources/")
        assert re.fullmatch(r"github/[^/]+/[^/]+", source["id"])
        assert "branches" not in source["hostRepo"]
    first = (await api.get("/v1alpha/sources", params={"pageSize": 3})).json()
    second = (
        await api.get(
            "/v1alpha/sources", params={"pageSize": 3, "pageToken": first["nextPageToken"]}
        )
    ).json()
    assert [s["name"] for s in first["sources"] + second["sources"]] == names
    assert "nextPageToken" not in second
    expression = f'name="{names[1]}" OR name = "{names[3]}" OR name="sources/github/no/such"'
    picked = (await api.get("/v1alpha/sources", params={"filter": expression})).json()
    assert [s["name"] for s in picked["sources"]] == [names[1], names[3]]
    none = (await api.get("/v1alpha/sources", params={"filter": 'name="sources/x"'})).json()
    assert none == {}  # an empty page omits its list
    for bad in ('name="a" AND name="b"', "name=unquoted", 'id="x"', 'name="a" OR'):
        (violation,) = violations(await api.get("/v1alpha/sources", params={"filter": bad}))
        assert violation["field"] == "filter"


@pytest.mark.anyio
async def test_get_source_has_branches(api: httpx.AsyncClient) -> None:
    response = await api.get("/v1alpha/sources/github/acme/webapp")
    body = response.json()
    assert body["name"] == SOURCE and body["id"] == "github/acme/webapp"
    host = body["hostRepo"]
    assert host["owner"] == "acme" and host["repo"] == "webapp" and host["isPrivate"] is True
    assert host["defaultBranch"] == {"displayName": "main"}
    assert {"displayName": "develop"} in host["branches"]
    assert Source.model_validate(body).host_repo is not None


@pytest.mark.anyio
async def test_bad_page_tokens_are_400(api: httpx.AsyncClient, other: httpx.AsyncClient) -> None:
    for number in range(3):
        await create(api, f"p{number}")
        await create(other, f"q{number}")
    token = (await api.get("/v1alpha/sessions", params={"pageSize": 1})).json()["nextPageToken"]
    source_token = (await api.get("/v1alpha/sources", params={"pageSize": 1})).json()[
        "nextPageToken"
    ]
    tampered = base64.urlsafe_b64encode(b'[1,"0000"]').decode().rstrip("=")
    session_id = await create(api)
    cases = [
        ("/v1alpha/sessions", api, "garbage!!"),
        ("/v1alpha/sessions", api, tampered),
        ("/v1alpha/sessions", api, source_token),
        ("/v1alpha/sessions", other, token),
        ("/v1alpha/sources", api, token),
        (f"/v1alpha/sessions/{session_id}/activities", api, token),
    ]
    for path, client, bad in cases:
        (violation,) = violations(await client.get(path, params={"pageToken": bad}))
        assert violation["field"] == "page_token"
    assert (await api.get("/v1alpha/sessions", params={"pageToken": token})).status_code == 200


@pytest.mark.anyio
async def test_session_pages_are_stable_while_sessions_come_and_go(api: httpx.AsyncClient) -> None:
    older = [await create(api, f"old {n}") for n in range(6)]
    first = (await api.get("/v1alpha/sessions", params={"pageSize": 2})).json()
    assert [s["id"] for s in first["sessions"]] == [older[5], older[4]]
    newer = [await create(api, f"new {n}") for n in range(3)]
    await api.delete(f"/v1alpha/sessions/{older[3]}")
    seen, token = [], first["nextPageToken"]
    while token:
        page = (
            await api.get("/v1alpha/sessions", params={"pageSize": 2, "pageToken": token})
        ).json()
        seen += [s["id"] for s in page.get("sessions", [])]
        token = page.get("nextPageToken")
    assert seen == [older[2], older[1], older[0]]
    assert not set(seen) & set(newer)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions=st.integers(0, 12), size=st.integers(1, 100))
def test_any_page_size_walks_every_session_once(sessions: int, size: int) -> None:
    async def walk() -> None:
        app = make_app(Clock(START))
        async with connect(app) as api:
            created = [await create(api, f"s{n}") for n in range(sessions)]
            seen, token = [], None
            while True:
                params = {"pageSize": size, **({"pageToken": token} if token else {})}
                page = (await api.get("/v1alpha/sessions", params=params)).json()
                assert len(page.get("sessions", [])) <= size
                seen += [s["id"] for s in page.get("sessions", [])]
                token = page.get("nextPageToken")
                if not token:
                    break
        assert seen == created[::-1]

    anyio.run(walk)


# --------------------------------------------------------------------------- createTime


async def _finished_session(
    api: httpx.AsyncClient, clock: Clock
) -> tuple[str, list[dict[str, Any]]]:
    session_id = await create(api)
    await run_until(api, clock, session_id, "COMPLETED")
    return session_id, await activities(api, session_id)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mode", "expected_from"), [("exclusive", 3), ("inclusive", 2), ("ignore", 0)]
)
async def test_create_time_parameter_modes(clock: Clock, mode: str, expected_from: int) -> None:
    async with connect(make_app(clock, create_time_filter=mode)) as api:
        session_id, every = await _finished_session(api, clock)
        pivot = every[2]["createTime"]
        got = await activities(api, session_id, createTime=pivot)
        assert got == every[expected_from:]
        # The AIP-160 form means what its operator says, unless the server ignores filters.
        after = await activities(api, session_id, filter=f'create_time>"{pivot}"')
        at_or_after = await activities(api, session_id, filter=f'create_time >= "{pivot}"')
        if mode == "ignore":
            assert after == at_or_after == every
        else:
            assert after == every[3:] and at_or_after == every[2:]


@pytest.mark.anyio
async def test_create_time_accepts_offsets_and_rejects_garbage(
    api: httpx.AsyncClient, clock: Clock
) -> None:
    session_id, every = await _finished_session(api, clock)
    assert await activities(api, session_id, createTime="2000-01-01T00:00:00+00:00") == every
    assert await activities(api, session_id, createTime="2999-01-01T00:00:00Z") == []
    path = f"/v1alpha/sessions/{session_id}/activities"
    for params, field in (
        ({"createTime": "yesterday"}, "create_time"),
        ({"createTime": "2025-01-01"}, "create_time"),
        ({"filter": 'create_time>"nope"'}, "filter"),
        ({"filter": 'create_time<"2025-01-01T00:00:00Z"'}, "filter"),
        ({"filter": "state=COMPLETED"}, "filter"),
    ):
        (violation,) = violations(await api.get(path, params=params))
        assert violation["field"] == field


# --------------------------------------------------------------------------- the agent


@pytest.mark.anyio
async def test_full_script_with_auto_approval_and_pull_request(
    api: httpx.AsyncClient, clock: Clock
) -> None:
    session_id = await create(
        api, sourceContext={"source": SOURCE}, automationMode="AUTO_CREATE_PR"
    )
    states = await run_until(api, clock, session_id, "COMPLETED")
    assert states == ["QUEUED", "PLANNING", "IN_PROGRESS", "COMPLETED"]
    every = await activities(api, session_id)
    kinds = [event_of(a) for a in every]
    assert kinds[:3] == [None, "planGenerated", "planApproved"]
    assert kinds[-1] == "sessionCompleted"
    assert set(kinds[3:-1]) == {"progressUpdated"}

    started = every[0]
    assert (
        started["originator"] == "system" and Activity.model_validate(started).event_member is None
    )
    plan = every[1]["planGenerated"]["plan"]
    assert 2 <= len(plan["steps"]) <= 4 and HEX32.match(plan["id"])
    assert "index" not in plan["steps"][0]
    assert [s.get("index", 0) for s in plan["steps"]] == list(range(len(plan["steps"])))
    assert plan["createTime"] == every[1]["createTime"]
    assert every[2]["planApproved"] == {"planId": plan["id"]}
    assert every[2]["originator"] == "user"

    for activity in every:
        assert HEX32.match(activity["id"]) and TIMESTAMP.match(activity["createTime"])
        assert activity["name"] == f"sessions/{session_id}/activities/{activity['id']}"
        Activity.model_validate(activity)
    artifacts = [art for a in every for art in a.get("artifacts", [])]
    bash = [art["bashOutput"] for art in artifacts if "bashOutput" in art]
    assert bash and any("exitCode" not in b for b in bash)
    assert all(b.get("exitCode", 0) != 0 for b in bash if "exitCode" in b)
    changes = [art["changeSet"] for art in artifacts if "changeSet" in art]
    assert all(
        c["source"] == SOURCE and re.fullmatch(r"[0-9a-f]{40}", c["gitPatch"]["baseCommitId"])
        for c in changes
    )

    final = every[-1]["artifacts"][0]["changeSet"]["gitPatch"]
    assert final["suggestedCommitMessage"]
    patch = final["unidiffPatch"]
    assert patch.startswith("diff --git a/") and "\n--- " in patch and "\n+++ b/" in patch
    assert re.search(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", patch, re.MULTILINE)

    session = (await api.get(f"/v1alpha/sessions/{session_id}")).json()
    # Field notes: a pull request when one was opened, then the final change set (no type
    # discriminator: only which member is present).
    output, final_output = session["outputs"]
    assert set(output) == {"pullRequest"} and set(final_output) == {"changeSet"}
    assert final_output["changeSet"] == every[-1]["artifacts"][0]["changeSet"]
    pull = output["pullRequest"]
    assert pull["url"].startswith("https://github.com/acme/webapp/pull/") and pull["title"]
    assert session["updateTime"] == every[-1]["createTime"]
    one = await api.get(f"/v1alpha/sessions/{session_id}/activities/{every[3]['id']}")
    assert one.json() == every[3]


@pytest.mark.anyio
async def test_steps_carry_their_scheduled_time(api: httpx.AsyncClient, clock: Clock) -> None:
    session_id = await create(api)
    clock.advance(1000)  # the agent catches up lazily; times are the schedule, not the request
    every = await activities(api, session_id)
    assert [a["createTime"][:19] for a in every[:3]] == [
        "2025-06-15T15:06:41",
        "2025-06-15T15:06:42",
        "2025-06-15T15:06:43",
    ]
    assert await state_of(api, session_id) == "COMPLETED"


@pytest.mark.anyio
async def test_plan_approval_when_required(api: httpx.AsyncClient, clock: Clock) -> None:
    session_id = await create(api, requirePlanApproval=True)
    approve = f"/v1alpha/sessions/{session_id}:approvePlan"
    error_of(await api.post(approve, json={}), 400, "INVALID_ARGUMENT")  # no plan yet
    await run_until(api, clock, session_id, "AWAITING_PLAN_APPROVAL")
    clock.advance(60)
    assert await state_of(api, session_id) == "AWAITING_PLAN_APPROVAL"
    assert [event_of(a) for a in await activities(api, session_id)] == [None, "planGenerated"]
    response = await api.post(approve, json={})
    assert response.status_code == 200 and response.json() == {}
    assert await state_of(api, session_id) == "IN_PROGRESS"
    approved = (await activities(api, session_id))[-1]
    assert event_of(approved) == "planApproved" and approved["originator"] == "user"
    error_of(await api.post(approve), 400, "INVALID_ARGUMENT")  # nothing waits any more
    await run_until(api, clock, session_id, "COMPLETED")


@pytest.mark.anyio
async def test_auto_approved_session_refuses_approve_plan(
    api: httpx.AsyncClient, clock: Clock
) -> None:
    session_id = await create(api)
    await run_until(api, clock, session_id, "IN_PROGRESS")
    response = await api.post(f"/v1alpha/sessions/{session_id}:approvePlan", json={})
    assert violations(response)


@pytest.mark.anyio
async def test_ask_waits_for_an_answer(api: httpx.AsyncClient, clock: Clock) -> None:
    session_id = await create(api, "Rename the config loader [ask]")
    assert (await api.get(f"/v1alpha/sessions/{session_id}")).json()["title"] == (
        "Rename the config loader"
    )
    await run_until(api, clock, session_id, "AWAITING_USER_FEEDBACK")
    question = (await activities(api, session_id))[-1]
    assert event_of(question) == "agentMessaged" and question["originator"] == "agent"
    clock.advance(60)
    assert await state_of(api, session_id) == "AWAITING_USER_FEEDBACK"
    response = await api.post(f"/v1alpha/sessions/{session_id}:sendMessage", json={"prompt": "yes"})
    assert response.status_code == 200 and response.json() == {}
    assert await state_of(api, session_id) == "IN_PROGRESS"
    latest = (await activities(api, session_id))[-1]
    assert latest["userMessaged"] == {"userMessage": "yes"} and latest["originator"] == "user"
    clock.advance(1.0)
    assert event_of((await activities(api, session_id))[-1]) == "agentMessaged"
    await run_until(api, clock, session_id, "COMPLETED")


@pytest.mark.anyio
async def test_fail_ends_in_failed(api: httpx.AsyncClient, clock: Clock) -> None:
    session_id = await create(api, "Upgrade the database driver [fail]")
    states = await run_until(api, clock, session_id, "FAILED")
    assert states[-2:] == ["IN_PROGRESS", "FAILED"]
    every = await activities(api, session_id)
    assert every[-1]["sessionFailed"]["reason"]
    clock.advance(60)
    assert await state_of(api, session_id) == "FAILED"
    assert "sessionCompleted" not in {event_of(a) for a in await activities(api, session_id)}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("prompt", "end"), [("Tidy the logging", "COMPLETED"), ("Tidy [fail]", "FAILED")]
)
async def test_a_message_resumes_a_finished_session(
    api: httpx.AsyncClient, clock: Clock, prompt: str, end: str
) -> None:
    session_id = await create(api, prompt)
    await run_until(api, clock, session_id, end)
    before = (await api.get(f"/v1alpha/sessions/{session_id}")).json()
    count = len(await activities(api, session_id))
    clock.advance(30)
    await api.post(f"/v1alpha/sessions/{session_id}:sendMessage", json={"prompt": "one more thing"})
    resumed = (await api.get(f"/v1alpha/sessions/{session_id}")).json()
    assert resumed["state"] == "IN_PROGRESS" and resumed["updateTime"] > before["updateTime"]
    await run_until(api, clock, session_id, "COMPLETED")
    new = [event_of(a) for a in (await activities(api, session_id))[count:]]
    assert new[:2] == ["userMessaged", "agentMessaged"] and new[-1] == "sessionCompleted"
    assert "progressUpdated" in new


@pytest.mark.anyio
async def test_a_message_while_running_gets_a_reply_one_step_later(
    api: httpx.AsyncClient, clock: Clock
) -> None:
    session_id = await create(api, requirePlanApproval=True)
    await run_until(api, clock, session_id, "AWAITING_PLAN_APPROVAL")
    for text in ("first", "second"):
        await api.post(f"/v1alpha/sessions/{session_id}:sendMessage", json={"prompt": text})
    clock.advance(1.0)
    tail = (await activities(api, session_id))[-3:]
    assert [event_of(a) for a in tail] == ["userMessaged", "userMessaged", "agentMessaged"]
    clock.advance(1.0)  # replies keep the order of the messages, one step apart
    tail = (await activities(api, session_id))[-2:]
    assert [event_of(a) for a in tail] == ["agentMessaged", "agentMessaged"]
    assert await state_of(api, session_id) == "AWAITING_PLAN_APPROVAL"
    clock.advance(30)
    assert len(await activities(api, session_id)) == 2 + 2 + 2


@pytest.mark.anyio
async def test_repoless_session_completes_without_pull_request(
    api: httpx.AsyncClient, clock: Clock
) -> None:
    session_id = await create(api, "Write a haiku generator", automationMode="AUTO_CREATE_PR")
    await run_until(api, clock, session_id, "COMPLETED")
    session = (await api.get(f"/v1alpha/sessions/{session_id}")).json()
    final = (await activities(api, session_id))[-1]["artifacts"][0]["changeSet"]
    assert "source" not in final and final["gitPatch"]["unidiffPatch"]
    # No pull request, but the final change set is an output (what public clients read
    # generated files from, repoless sessions included).
    assert session["outputs"] == [{"changeSet": final}]


@pytest.mark.anyio
async def test_update_time_follows_every_change(api: httpx.AsyncClient, clock: Clock) -> None:
    session_id = await create(api)
    for _ in range(12):
        clock.advance(1.0)
        session = (await api.get(f"/v1alpha/sessions/{session_id}")).json()
        newest = max(
            [a["createTime"] for a in await activities(api, session_id)] or [session["createTime"]]
        )
        assert session["updateTime"] == newest


# --------------------------------------------------------------------------- determinism


async def _transcript(seed: int) -> list[Any]:
    clock = Clock(START)
    app = make_app(clock, seed=seed)
    async with connect(app) as api:
        ids = [
            await create(api, "Fix the cache", sourceContext={"source": SOURCE}) for _ in range(2)
        ]
        clock.advance(30)
        return [ids, [await activities(api, i) for i in ids]]


@pytest.mark.anyio
async def test_same_seed_same_world() -> None:
    first, second, third = await _transcript(5), await _transcript(5), await _transcript(6)
    assert first == second
    assert first[0] != third[0]


# --------------------------------------------------------------------------- faults


@pytest.mark.anyio
async def test_fault_header_forces_errors(app: Starlette, api: httpx.AsyncClient) -> None:
    response = await api.get("/v1alpha/sessions", headers={"x-emulator-fault": "429"})
    error = error_of(response, 429, "RESOURCE_EXHAUSTED")
    assert error["message"] == "Resource has been exhausted (e.g. check quota)."
    assert response.headers["retry-after"] == "1"
    response = await api.post(
        "/v1alpha/sessions", json={"prompt": "x"}, headers={"X-Emulator-Fault": "500"}
    )
    error_of(response, 500, "INTERNAL")
    assert (await api.get("/v1alpha/sessions")).json() == {}  # the create never ran
    assert violations(await api.get("/v1alpha/sources", headers={"x-emulator-fault": "418"}))
    async with connect(app, None) as anonymous:
        response = await anonymous.get("/v1alpha/sources", headers={"x-emulator-fault": "429"})
        error_of(response, 401, "UNAUTHENTICATED")


@pytest.mark.anyio
async def test_certain_faults(clock: Clock) -> None:
    async with connect(make_app(clock, fault_rate_limit=1.0)) as api:
        error_of(await api.get("/v1alpha/sources"), 429, "RESOURCE_EXHAUSTED")
    async with connect(make_app(clock, fault_error=1.0)) as api:
        error_of(await api.get("/v1alpha/sources"), 500, "INTERNAL")


@pytest.mark.anyio
async def test_random_faults_follow_the_seed(clock: Clock) -> None:
    async def codes(seed: int) -> list[int]:
        app = make_app(clock, seed=seed, fault_rate_limit=0.2, fault_error=0.2)
        async with connect(app) as api:
            return [(await api.get("/v1alpha/sources")).status_code for _ in range(100)]

    first = await codes(3)
    assert first == await codes(3)
    assert {200, 429, 500} == set(first)
    assert 20 <= first.count(200) <= 90


@pytest.mark.anyio
async def test_latency_delays_answers(clock: Clock) -> None:
    async with connect(make_app(clock, latency_ms=60)) as api:
        started = anyio.current_time()
        assert (await api.get("/v1alpha/sources")).status_code == 200
        assert anyio.current_time() - started >= 0.06


# --------------------------------------------------------------------------- fidelity (issue 11)


@pytest.mark.anyio
async def test_outputs_appear_only_with_results_and_a_resumed_run_replaces_the_change_set(
    api: httpx.AsyncClient, clock: Clock
) -> None:
    session_id = await create(api, "Add a helper")  # no AUTO_CREATE_PR: no pull request
    await run_until(api, clock, session_id, "IN_PROGRESS")
    assert "outputs" not in (await api.get(f"/v1alpha/sessions/{session_id}")).json()
    await run_until(api, clock, session_id, "COMPLETED")
    (first,) = (await api.get(f"/v1alpha/sessions/{session_id}")).json()["outputs"]
    assert first["changeSet"]["gitPatch"]["unidiffPatch"].startswith("diff --git")
    message = await api.post(
        f"/v1alpha/sessions/{session_id}:sendMessage", json={"prompt": "Also handle None"}
    )
    assert message.status_code == 200
    await run_until(api, clock, session_id, "IN_PROGRESS")
    await run_until(api, clock, session_id, "COMPLETED")
    (second,) = (await api.get(f"/v1alpha/sessions/{session_id}")).json()["outputs"]
    final = (await activities(api, session_id))[-1]
    assert "sessionCompleted" in final
    assert second["changeSet"] == final["artifacts"][0]["changeSet"] != first["changeSet"]


@pytest.mark.anyio
async def test_consistency_delay_answers_404_on_a_new_session_for_a_while(
    clock: Clock,
) -> None:
    app = make_app(clock, consistency_delay=3.0)
    async with connect(app) as api:
        session_id = await create(api)
        base = f"/v1alpha/sessions/{session_id}"
        error_of(await api.get(base), 404, "NOT_FOUND")
        error_of(await api.get(base + "/activities"), 404, "NOT_FOUND")
        clock.advance(2.9)
        error_of(await api.get(base), 404, "NOT_FOUND")
        listed = (await api.get("/v1alpha/sessions")).json()["sessions"]
        assert [s["id"] for s in listed] == [session_id]  # the list already shows it
        clock.advance(0.2)
        assert (await api.get(base)).status_code == 200
        first = (await activities(api, session_id))[0]
        assert (await api.get(f"{base}/activities/{first['id']}")).status_code == 200


@pytest.mark.anyio
async def test_an_empty_page_is_an_empty_object(api: httpx.AsyncClient) -> None:
    session_id = await create(api)
    # Created this instant: no activity yet; the real service omits the empty list.
    response = await api.get(f"/v1alpha/sessions/{session_id}/activities")
    assert response.status_code == 200 and response.json() == {}
