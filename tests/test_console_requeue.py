"""The console's "Retry now" and "Recover": a button on a delivery that is not delivered,
a form on each endpoint; each a POST with the session's CSRF token, answered 303 back
with a flash, the same delivery rows re-opened, the dispatcher woken."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from sessionhook.relay.config import Config
from sessionhook.relay.domain.retry import Dead, Delivered
from sessionhook.relay.store import AsyncStore, StoreCore
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import WebContext, create_app
from sessionhook.relay.web.auth import CSRF_FIELD, WebAuth
from tests.support.backends import Backend
from tests.support.requeue_rows import ACT0, Ep, failure, fill

pytestmark = [pytest.mark.app, pytest.mark.anyio]

TOKEN = "console-requeue-token-0123456789abcdef"
BASE = "http://127.0.0.1:9187"


@dataclass
class Console:
    http: httpx.AsyncClient
    store: StoreCore
    csrf: str
    wakes: list[int] = field(default_factory=list)


@asynccontextmanager
async def console(backend: Backend) -> AsyncIterator[Console]:
    config = Config.model_validate({"server": {"listen": "127.0.0.1:9187", "token_env": "T"}})
    core = backend.open()
    core.endpoints.sync_endpoints([Ep("ci-bot")])
    astore = AsyncStore(core)
    wakes: list[int] = []
    ctx = WebContext(
        config=lambda: config,
        store=lambda: astore,
        metrics=Metrics(),
        auth=WebAuth(TOKEN),
        wake=lambda: wakes.append(1),
    )
    transport = httpx.ASGITransport(app=create_app(ctx))
    try:
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            answer = await http.post("/login", data={"token": TOKEN, "next": "/console"})
            assert answer.status_code == 303
            page = await http.get("/console")
            found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
            assert found is not None
            yield Console(http, core, found.group(1), wakes)
    finally:
        await astore.close()


async def test_retry_now_button_reopens_a_dead_delivery(backend: Backend) -> None:
    async with console(backend) as c:
        fill(c.store, 1, 2)
        first, second = sorted(c.store.operator.list_deliveries(), key=lambda d: d.id)
        c.store.outbox.record_attempt(first.id, failure(ACT0), Dead())
        c.store.outbox.record_attempt(second.id, failure(ACT0), Delivered())
        page = (await c.http.get("/console/deliveries")).text
        buttons = re.findall(r'name="delivery" value="(\d+)"', page)
        assert buttons == [str(first.id)]  # the dead one; a delivered one has none
        assert "Retry now" in (await c.http.get(f"/console/deliveries/{first.id}")).text
        assert "Retry now" not in (await c.http.get(f"/console/deliveries/{second.id}")).text
        refused = await c.http.post("/console/actions/retry", data={"delivery": str(first.id)})
        assert refused.status_code == 403  # no CSRF token: nothing done
        assert c.store.operator.get_delivery(first.id).status == "dead"  # type: ignore[union-attr]
        back = f"/console/deliveries/{first.id}"
        done = await c.http.post(
            "/console/actions/retry",
            data={"delivery": str(first.id), "back": back, CSRF_FIELD: c.csrf},
        )
        assert done.status_code == 303 and done.headers["location"] == back
        after = c.store.operator.get_delivery(first.id)
        assert after is not None and after.status == "pending"
        assert after.event_id == first.event_id and c.wakes == [1]
        assert (
            f"delivery {first.id} ({first.event_id}) to ci-bot: dead -&gt; due now"
            in (await c.http.get(back)).text
        )
        for bad in ("", "abc", "9" * 40):
            await c.http.post("/console/actions/retry", data={"delivery": bad, CSRF_FIELD: c.csrf})
            assert "retry: choose a delivery" in (await c.http.get("/console")).text
        await c.http.post(
            "/console/actions/retry", data={"delivery": str(second.id), CSRF_FIELD: c.csrf}
        )
        assert "was delivered already" in (await c.http.get("/console")).text
        assert c.wakes == [1]


async def test_recover_form_on_each_endpoint(backend: Backend) -> None:
    async with console(backend) as c:
        fill(c.store, 2, 2)
        for d in c.store.operator.list_deliveries():
            c.store.outbox.record_attempt(d.id, failure(ACT0), Dead())
        overview = (await c.http.get("/console")).text
        assert 'action="/console/actions/recover"' in overview and "Recover" in overview
        form = {"endpoint": "ci-bot", "since": "2025-03-01T09:00:00Z", CSRF_FIELD: c.csrf}
        done = await c.http.post("/console/actions/recover", data=form)
        assert done.status_code == 303
        assert "recovered 4 deliveries of ci-bot, due now" in (await c.http.get("/console")).text
        assert {d.status for d in c.store.operator.list_deliveries()} == {"pending"}
        assert c.wakes == [1]
        await c.http.post("/console/actions/recover", data=form)
        assert (
            "recovered 0 deliveries of ci-bot: it has no failed or dead delivery"
            in (await c.http.get("/console")).text
        )
        await c.http.post("/console/actions/recover", data={**form, "since": "<b>soon</b>"})
        page = (await c.http.get("/console")).text
        assert "recover: since:" in page and "<b>soon</b>" not in page
        await c.http.post("/console/actions/recover", data={**form, "endpoint": "nope"})
        assert "recover: no endpoint named &#39;nope&#39;" in (await c.http.get("/console")).text
        assert c.wakes == [1]
