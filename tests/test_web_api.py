"""The management API's frame (``/v1/`` on ``[server] listen``): the token, the error bodies
in the Sessions API's shape, JSON bodies and pages, ``GET /v1/status``; and the daemon's
upstream actions (approve a plan, answer the agent) that the API, the console and action
links make with the session's account."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from pydantic import BaseModel, ConfigDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sessionhook.relay.config import Config
from sessionhook.relay.domain.api_models import ApiPage
from sessionhook.relay.store import AsyncStore, Ingest
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import WebAuth, WebContext, create_app
from sessionhook.relay.web.answers import api_answer
from sessionhook.relay.web.api import common as api_common
from sessionhook.relay.web.api.common import (
    ApiProblem,
    api_problem_response,
    page_answer,
    page_request,
    read_json,
)
from tests.support.backends import Backend
from tests.support.daemon_setup import Setup

pytestmark = [pytest.mark.app, pytest.mark.anyio]

TOKEN = "api-token-" + "y" * 30
AUTH = {"authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def api(backend: Backend | None) -> AsyncIterator[httpx.AsyncClient]:
    """The web app over ``backend``'s store (``None``: a store not open yet), in process."""
    config = Config.model_validate(
        {"server": {"listen": "127.0.0.1:9187", "token_env": "SESSIONHOOK_WEB_TOKEN"}}
    )
    astore = None if backend is None else AsyncStore(backend.open())
    ctx = WebContext(
        config=lambda: config, store=lambda: astore, metrics=Metrics(), auth=WebAuth(TOKEN)
    )
    transport = httpx.ASGITransport(create_app(ctx))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            yield http
    finally:
        if astore is not None:
            await astore.close()


async def test_without_or_with_a_wrong_token_the_api_answers_401_in_the_error_shape(
    backend: Backend,
) -> None:
    async with api(backend) as http:
        for headers in ({}, {"authorization": "Bearer wrong"}):
            answer = await http.get("/v1/status", headers=headers)
            assert answer.status_code == 401
            error = answer.json()["error"]
            assert error["code"] == 401 and error["status"] == "UNAUTHENTICATED"
            assert TOKEN not in answer.text


async def test_status_is_what_status_json_prints(backend: Backend) -> None:
    async with api(backend) as http:
        answer = await http.get("/v1/status", headers=AUTH)
    assert answer.status_code == 200
    body = answer.json()
    assert body["endpoints"] == [] and body["sessions"] == 0
    assert set(body["history_walk"]) >= {"total", "done", "remaining"}
    assert body["now"].endswith("Z")  # moments as RFC 3339, as --json prints them


async def test_an_unknown_api_path_is_a_404_error_body_not_a_page(backend: Backend) -> None:
    async with api(backend) as http:
        for method in ("GET", "POST", "DELETE"):
            answer = await http.request(method, "/v1/nothing/here", headers=AUTH)
            assert answer.status_code == 404, method
            assert answer.json()["error"]["status"] == "NOT_FOUND"
            assert "/v1/nothing/here" in answer.json()["error"]["message"]


async def test_before_the_store_opens_the_api_answers_503_with_retry_after() -> None:
    async with api(None) as http:
        answer = await http.get("/v1/status", headers=AUTH)
    assert answer.status_code == 503 and answer.headers["retry-after"]
    assert "not open yet" in answer.json()["error"]["message"]


class _Thing(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    size: int = 1


class _Items(ApiPage):
    items: list[int]
    nextPageToken: str | None = None


def _frame_app() -> Starlette:
    """The frame's helpers under a route of their own."""

    async def create(request: Request) -> Response:
        thing = await read_json(request, _Thing)
        return JSONResponse(thing.model_dump())

    async def listing(request: Request) -> Response:
        page = page_request(request, default=2)
        start = int(page.after or 0)
        items = list(range(start, min(start + page.size, 5)))
        more = str(start + page.size) if start + page.size < 5 else None
        return api_answer(page_answer(_Items, items, more))

    return Starlette(
        routes=[Route("/things", create, methods=["POST"]), Route("/things", listing)],
        exception_handlers={ApiProblem: api_problem_response},
    )


async def test_bodies_that_are_not_the_model_are_400_with_a_one_line_reason() -> None:
    transport = httpx.ASGITransport(_frame_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        cases = {
            b"{not json": (400, "not JSON"),
            b"[1, 2]": (400, "must be a JSON object"),
            b'{"name": "a", "extra": 1}': (400, "extra"),
            b'{"name": "a", "size": "big"}': (400, "size"),
            b'{"name": "' + b"x" * 70_000 + b'"}': (413, "larger than"),
            b"[" * 30_000: (400, "not JSON"),  # deep nesting: refused, not a RecursionError
        }
        for body, (status, reason) in cases.items():
            answer = await http.post(
                "/things", content=body, headers={"content-type": "application/json"}
            )
            assert answer.status_code == status, (body[:20], answer.text)
            message = answer.json()["error"]["message"]
            assert reason in message and "\n" not in message
        form = await http.post("/things", data={"name": "a"})
        assert form.status_code == 415
        good = await http.post("/things", json={"name": "a"})
        assert good.status_code == 200 and good.json() == {"name": "a", "size": 1}


async def test_pages_follow_the_token_to_the_end_and_refuse_a_forged_one() -> None:
    transport = httpx.ASGITransport(_frame_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        seen: list[int] = []
        params: dict[str, str] = {}
        for _ in range(10):
            page = (await http.get("/things", params=params)).json()
            seen += page["items"]
            if "nextPageToken" not in page:
                break
            params = {"pageToken": page["nextPageToken"]}
        assert seen == [0, 1, 2, 3, 4]
        for bad in ({"pageSize": "0"}, {"pageSize": "many"}, {"pageSize": "999"}):
            assert (await http.get("/things", params=bad)).status_code == 400
        for forged in ("%%%", "bm90LW91cnM", "\u00e9"):
            answer = await http.get("/things", params={"pageToken": forged})
            assert answer.status_code == 400, forged
            assert "pageToken" in answer.json()["error"]["message"]


def test_every_query_parameter_of_the_api_is_read_through_the_one_bounded_reader() -> None:
    """A route that reads ``request.query_params`` itself skips the bound of
    ``common.query_text`` (``GET /v1/actions?session=`` did; tests/test_api_daemon.py sends
    every documented parameter 10 KB long to the real daemon)."""
    package = Path(api_common.__file__).parent
    readers = {
        path.name: path.read_text("utf-8").count("query_params")
        for path in sorted(package.glob("*.py"))
    }
    assert readers.pop("common.py") == 1  # query_text's own read
    assert {name: n for name, n in readers.items() if n} == {}


async def test_the_daemon_acts_upstream_with_the_sessions_account(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    daemon = setup.daemon()
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        client = setup.api(http)
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        before = await daemon.act("sessions/none", "approve_plan", None)
        assert not before.ok and "not a session this relay has seen" in before.detail
        created = await client.create_session("Plan first", require_plan_approval=True)

        async def waits() -> bool:
            return (await client.get_session(created.name)).state == "AWAITING_PLAN_APPROVAL"

        async def archived() -> bool:
            store = daemon.store
            return store is not None and bool(await store.run(Ingest.session_account, created.name))

        await _until(waits)
        await _until(archived)
        empty = await daemon.act(created.name, "reply", "  ")
        assert not empty.ok and "text" in empty.detail
        approved = await daemon.act(created.name, "approve_plan", None)
        assert approved.ok, approved
        again = await daemon.act(created.name, "approve_plan", None)
        assert not again.ok and again.status == 400  # the service: no plan waits now
        assert (await client.get_session(created.name)).state != "AWAITING_PLAN_APPROVAL"
        replied = await daemon.act(created.name, "reply", "Use the new parser, please.")
        assert replied.ok, replied

        async def answered() -> bool:
            told = [a async for a in client.iter_activities(created.name) if a.user_messaged]
            return bool(told)

        await _until(answered)
        daemon.stop()


async def _until(check: Callable[[], Awaitable[bool]], within: float = 30) -> None:
    """Wait until ``check()`` holds (polled every 50 ms, at most ``within`` seconds)."""
    with anyio.fail_after(within):
        for _ in range(int(within / 0.05) + 1):
            if await check():
                return
            await anyio.sleep(0.05)
