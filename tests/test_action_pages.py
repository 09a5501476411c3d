"""The pages behind action links in process (relay/web/action_pages.py over a real store and
a stand-in for the daemon's upstream act): off while ``[actions]`` is off, public by
default, behind the console's login with ``require_login``, served with the console off,
and two clicks at once make one upstream call."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html import unescape
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from sessionhook.api.models import Activity, Session
from sessionhook.relay.config import Config
from sessionhook.relay.config.action_keys import LinkKeys
from sessionhook.relay.domain import events
from sessionhook.relay.domain.action_links import LinkClaims, sign_link
from sessionhook.relay.domain.actions import ActionKind, ActOutcome
from sessionhook.relay.ops.actions import REFUSALS
from sessionhook.relay.store import AsyncStore, Store
from sessionhook.relay.store.actions import ActionClaim
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import WebAuth, WebContext, create_app
from sessionhook.relay.web.action_pages import perform_for_chat

pytestmark = [pytest.mark.app, pytest.mark.anyio]

TOKEN = "page-token-" + "p" * 30
SESSION = "sessions/4242"
WAIT = SESSION + "/activities/" + "c" * 32


class Upstream:
    """The daemon's act, slowed down so that two clicks overlap."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ActionKind, str | None]] = []

    async def __call__(self, session: str, kind: ActionKind, text: str | None) -> ActOutcome:
        self.calls.append((session, kind, text))
        await anyio.sleep(0.2)
        return ActOutcome(True, 200, "plan approved")


def _config(tmp_path: Path, *, server: dict[str, Any], **actions: Any) -> Config:
    return Config.model_validate(
        {
            "server": {"listen": "127.0.0.1:9187", **server},
            "actions": {
                "enabled": True,
                "public_url": "http://127.0.0.1:9187",
                "key_file": str(tmp_path / "links.key"),
                **actions,
            },
        }
    )


def _seed(path: Path) -> None:
    with Store.open(path) as store:
        session = Session(name=SESSION, id="4242", state="AWAITING_PLAN_APPROVAL", title="Seeded")
        store.ingest.upsert_session(session, baseline=False)
        planned = Activity.model_validate(
            {
                "name": WAIT,
                "createTime": "2026-11-26T10:00:00Z",
                "planGenerated": {"plan": {"id": "p", "steps": [{"title": "Step <one>"}]}},
            }
        )
        made, raws = events.archived_page(session, [planned], max_media_bytes=1000)
        store.ingest.ingest_activities(SESSION, [planned], made, False, raws=raws)


@asynccontextmanager
async def pages(
    tmp_path: Path, config: Config, act: Upstream
) -> AsyncIterator[tuple[httpx.AsyncClient, LinkKeys]]:
    _seed(tmp_path / "relay.db")
    astore = AsyncStore(Store.open(tmp_path / "relay.db"))
    keys = LinkKeys(lambda: config)
    ctx = WebContext(
        config=lambda: config,
        store=lambda: astore,
        metrics=Metrics(),
        auth=WebAuth(TOKEN if config.server and config.server.token_env else None),
        act=act,
        link_keys=keys,
    )
    transport = httpx.ASGITransport(create_app(ctx))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            yield http, keys
    finally:
        await astore.close()


def _link(keys: LinkKeys) -> str:
    claims = LinkClaims("default", SESSION, WAIT, "approve_plan", time.time() + 600)
    return "/actions/" + sign_link(keys.ring().current, claims)


def _form(page: str) -> str:
    found = re.search(r'name="form_token" value="([^"]+)"', page)
    assert found, page
    return unescape(found.group(1))


async def test_two_clicks_at_once_make_one_upstream_call(tmp_path: Path) -> None:
    act = Upstream()
    config = _config(tmp_path, server={"allow_unauthenticated": True})
    async with pages(tmp_path, config, act) as (http, keys):
        link = _link(keys)
        page = await http.get(link)
        assert page.status_code == 200 and "Step &lt;one&gt;" in page.text
        form = _form(page.text)
        answers: list[httpx.Response] = []

        async def click() -> None:
            answers.append(await http.post(link, data={"form_token": form}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(click)
            tg.start_soon(click)
        assert sorted(a.status_code for a in answers) == [200, 409]
        assert act.calls == [(SESSION, "approve_plan", None)]


async def test_require_login_puts_the_pages_behind_the_console_login(tmp_path: Path) -> None:
    act = Upstream()
    config = _config(tmp_path, server={"token_env": "WEB_TOKEN"}, require_login=True)
    async with pages(tmp_path, config, act) as (http, keys):
        link = _link(keys)
        assert (await http.get(link)).status_code == 401
        anonymous = await http.get(link, headers={"accept": "text/html"})
        assert anonymous.status_code == 303 and "/login" in anonymous.headers["location"]
        assert (await http.post(link, data={"form_token": "x"})).status_code == 401
        login = await http.post("/login", data={"token": TOKEN, "next": link})
        assert login.status_code == 303
        page = await http.get(link)
        assert page.status_code == 200 and 'name="csrf_token"' in page.text
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert csrf is not None
        # The console's CSRF token is needed as well as the link's form token.
        assert (await http.post(link, data={"form_token": _form(page.text)})).status_code == 403
        done = await http.post(
            link, data={"form_token": _form(page.text), "csrf_token": unescape(csrf.group(1))}
        )
        assert done.status_code == 200, done.text
        assert len(act.calls) == 1


async def test_pages_are_off_with_actions_off_and_on_with_the_console_off(
    tmp_path: Path,
) -> None:
    act = Upstream()
    off = _config(tmp_path, server={"allow_unauthenticated": True}, enabled=False)
    async with pages(tmp_path, off, act) as (http, keys):
        assert (await http.get(_link(keys))).status_code == 404
    (tmp_path / "relay.db").unlink()
    console_off = _config(tmp_path, server={})
    async with pages(tmp_path, console_off, act) as (http, keys):
        assert (await http.get("/console")).status_code == 404
        link = _link(keys)
        page = await http.get(link)
        assert page.status_code == 200
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert page.headers["referrer-policy"] == "no-referrer"
        done = await http.post(link, data={"form_token": _form(page.text)})
        assert done.status_code == 200 and len(act.calls) == 1
        # A reload that asks for require_login keeps the console off ([server] needs a
        # restart): with no login to ask for, the pages refuse everybody.
        ctx: WebContext = http._transport.app.state.web  # type: ignore[attr-defined]
        stricter = console_off.actions.model_copy(update={"require_login": True})
        ctx.config = lambda: console_off.model_copy(update={"actions": stricter})
        assert (await http.get(link)).status_code == 404


async def test_the_api_lists_the_actions_taken_page_by_page(tmp_path: Path) -> None:
    config = _config(tmp_path, server={"token_env": "WEB_TOKEN"})
    async with pages(tmp_path, config, Upstream()) as (http, _):
        with Store.open(tmp_path / "relay.db") as store:
            for n in range(3):
                claim = ActionClaim(
                    float(n),
                    SESSION,
                    f"w{n}",
                    "reply",
                    "default",
                    "slack",
                    "10.0.0.1",
                    "ua",
                    "U42",
                    f"hash{n}",
                )
                store.actions.claim_action(claim)
        auth = {"authorization": f"Bearer {TOKEN}"}
        assert (await http.get("/v1/actions")).status_code == 401
        first = (await http.get("/v1/actions?pageSize=2", headers=auth)).json()
        assert [a["wait"] for a in first["actions"]] == ["w2", "w1"]
        assert first["actions"][0]["chat_user"] == "U42"
        assert first["actions"][0]["taken_at"] == "1970-01-01T00:00:02.000000Z"
        rest = await http.get(
            "/v1/actions", params={"pageSize": 2, "pageToken": first["nextPageToken"]}, headers=auth
        )
        assert [a["wait"] for a in rest.json()["actions"]] == ["w0"]
        assert "nextPageToken" not in rest.json()
        other = await http.get("/v1/actions", params={"session": "sessions/1"}, headers=auth)
        assert other.json() == {"actions": []}
        forged = base64.urlsafe_b64encode(b"p:abc").decode().rstrip("=")
        bad = await http.get("/v1/actions", params={"pageToken": forged}, headers=auth)
        assert bad.status_code == 400 and "pageToken" in bad.json()["error"]["message"]


async def test_a_chat_button_performs_once_as_its_user(tmp_path: Path) -> None:
    act = Upstream()
    config = _config(tmp_path, server={"allow_unauthenticated": True})
    async with pages(tmp_path, config, act) as (http, keys):
        ctx: WebContext = http._transport.app.state.web  # type: ignore[attr-defined]
        token = _link(keys).rsplit("/", 1)[1]
        middle = len(token) // 4  # in the payload: a good spelling, a bad signature
        tampered = token[:middle] + ("A" if token[middle] != "A" else "B") + token[middle + 1 :]
        assert await perform_for_chat(ctx, tampered, "U1", None) == (
            False,
            REFUSALS["bad signature"],
        )
        assert await perform_for_chat(ctx, token, "U1", None) == (True, "plan approved")
        assert await perform_for_chat(ctx, token, "U2", None) == (False, REFUSALS["used"])
        assert act.calls == [(SESSION, "approve_plan", None)]
        with Store.open(tmp_path / "relay.db") as store:
            [row] = store.actions.list_actions()
        assert (row.actor_kind, row.chat_user, row.result) == ("slack", "U1", "ok")


async def test_log_lines_never_carry_a_links_token(tmp_path: Path) -> None:
    config = _config(tmp_path, server={"token_env": "WEB_TOKEN"}, require_login=True)
    async with pages(tmp_path, config, Upstream()) as (http, keys):
        link = _link(keys)
        with capture_logs() as logs:
            wrong = await http.get(link, headers={"authorization": "Bearer " + "w" * 40})
        assert wrong.status_code == 401
        [failed] = [line for line in logs if line["event"] == "web.auth_failed"]
        assert failed["path"] == "/actions/<token>"
        assert link.rsplit("/", 1)[1] not in str(logs)


async def test_an_act_that_raises_frees_the_link(tmp_path: Path) -> None:
    class Broken(Upstream):
        async def __call__(self, session: str, kind: ActionKind, text: str | None) -> ActOutcome:
            self.calls.append((session, kind, text))
            raise RuntimeError("the store went away")

    broken = Broken()
    config = _config(tmp_path, server={"allow_unauthenticated": True})
    async with pages(tmp_path, config, broken) as (http, keys):
        ctx: WebContext = http._transport.app.state.web  # type: ignore[attr-defined]
        token = _link(keys).rsplit("/", 1)[1]
        with pytest.raises(RuntimeError):
            await perform_for_chat(ctx, token, "U1", None)
        with Store.open(tmp_path / "relay.db") as store:
            [row] = store.actions.list_actions()
        assert row.result == "failed" and row.detail == "the relay failed to act"
        ctx.act = Upstream()
        assert await perform_for_chat(ctx, token, "U1", None) == (True, "plan approved")
