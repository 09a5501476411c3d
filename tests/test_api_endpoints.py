"""``/v1/endpoints`` over HTTP, on both store engines: list, get, create (the secret shown
once), update, delete (open deliveries dead), enable, disable, rotate the secret; the
token (401), validation (400 naming the key), the config file's endpoints read-only (409),
unknown names (404) and hostile inputs, each refused by name."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from sessionhook.relay.config import Config
from sessionhook.relay.domain.retry import AttemptResult
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.ops import UnknownEndpointError
from sessionhook.relay.store import AsyncStore, StoreCore
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import WebAuth, WebContext, create_app
from tests.support.backends import Backend
from tests.support.backlog import fill
from tests.support.spellings import ELSEWHERE, loopback_spellings
from tests.support.web_relay import api_error

pytestmark = [pytest.mark.app, pytest.mark.anyio]

TOKEN = "endpoints-token-" + "e" * 30
AUTH = {"authorization": f"Bearer {TOKEN}"}
FILED_SECRET = generate_secret()
NOW = 1_800_000_000.0


def _config(*, allow_private: bool = False, max_endpoints: int = 1000) -> Config:
    return Config.model_validate(
        {
            "server": {"listen": "127.0.0.1:9187", "token_env": "SESSIONHOOK_WEB_TOKEN"},
            "delivery": {"allow_private_networks": allow_private, "max_endpoints": max_endpoints},
            "endpoints": [
                {"name": "filed", "url": "https://hooks.example.com/f", "secret": FILED_SECRET}
            ],
        }
    )


class Harness:
    """The web app over ``backend``'s store, the config file's endpoint synced into it as
    the daemon does; ``sync`` is a second handle on the same store (what another process
    sees); ``tested`` the names the stand-in ``send_test`` was asked for."""

    def __init__(self, http: httpx.AsyncClient, sync: StoreCore, ctx: WebContext) -> None:
        self.http = http
        self.sync = sync
        self.ctx = ctx
        self.tested: list[str] = []
        self.woken = 0


@asynccontextmanager
async def api(
    backend: Backend, *, allow_private: bool = False, max_endpoints: int = 1000
) -> AsyncIterator[Harness]:
    config = _config(allow_private=allow_private, max_endpoints=max_endpoints)
    sync = backend.open(clock=lambda: NOW)
    sync.endpoints.sync_endpoints(config.endpoints)
    astore = AsyncStore(backend.open(clock=lambda: NOW))
    harness: Harness | None = None

    async def send_test(name: str) -> AttemptResult:
        assert harness is not None
        if name not in {s.name for s in sync.endpoints.endpoint_states()}:
            raise UnknownEndpointError(f"no endpoint named {name!r}")
        harness.tested.append(name)
        return AttemptResult(204, None, 3.0, "", None, NOW)

    def wake() -> None:
        assert harness is not None
        harness.woken += 1

    ctx = WebContext(
        config=lambda: config,
        store=lambda: astore,
        metrics=Metrics(),
        auth=WebAuth(TOKEN),
        clock=lambda: NOW,
        send_test=send_test,
        wake=wake,
    )
    transport = httpx.ASGITransport(create_app(ctx))
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", headers=AUTH
        ) as http:
            harness = Harness(http, sync, ctx)
            yield harness
    finally:
        await astore.close()
        sync.close()


NEW = {"name": "ci-bot", "url": "https://hooks.example.com/ci", "description": "CI's hook"}


async def test_every_route_answers_401_without_or_with_a_wrong_token(backend: Backend) -> None:
    async with api(backend) as h:
        routes = [
            ("GET", "/v1/endpoints"),
            ("POST", "/v1/endpoints"),
            ("GET", "/v1/endpoints/filed"),
            ("PATCH", "/v1/endpoints/filed"),
            ("PUT", "/v1/endpoints/filed"),
            ("DELETE", "/v1/endpoints/filed"),
            ("POST", "/v1/endpoints/filed:enable"),
            ("POST", "/v1/endpoints/filed:disable"),
            ("POST", "/v1/endpoints/filed:test"),
            ("POST", "/v1/endpoints/filed:rotateSecret"),
        ]
        for headers in ({"authorization": ""}, {"authorization": "Bearer wrong"}):
            for method, path in routes:
                answer = await h.http.request(method, path, headers=headers, json=NEW)
                assert answer.status_code == 401, (method, path)
        assert h.sync.endpoints.stored_endpoints() == []  # nothing was created


async def test_create_shows_the_secret_once_and_every_read_never(backend: Backend) -> None:
    async with api(backend) as h:
        created = await h.http.post("/v1/endpoints", json=NEW)
        assert created.status_code == 201, created.text
        body = created.json()
        secret = body["secret"]
        assert secret.startswith("whsec_")
        assert body["name"] == "ci-bot" and body["source"] == "api"
        assert body["definition"] == {"url": NEW["url"]}
        assert body["description"] == "CI's hook" and body["enabled"] is True
        assert h.woken >= 1  # this relay's dispatcher looks at once
        # Every replica signs with it: it is in the store.
        (stored,) = h.sync.endpoints.stored_endpoints()
        assert stored.secret == secret
        reads = [
            await h.http.get("/v1/endpoints"),
            await h.http.get("/v1/endpoints/ci-bot"),
            await h.http.patch("/v1/endpoints/ci-bot", json={"description": "again"}),
            await h.http.post("/v1/endpoints/ci-bot:disable", json={}),
            await h.http.post("/v1/endpoints/ci-bot:enable"),
        ]
        for answer in reads:
            assert answer.status_code == 200, answer.text
            assert secret not in answer.text and "whsec_" not in answer.text
        listed = reads[0].json()["endpoints"]
        assert [(e["name"], e["source"]) for e in listed] == [
            ("ci-bot", "api"),
            ("filed", "config"),
        ]
        assert FILED_SECRET not in reads[0].text
        assert listed[1]["definition"] == {"url": "https://hooks.example.com/f"}
        # A URL's user-info (a credential of the consumer's) is never shown.
        basic = await h.http.post(
            "/v1/endpoints",
            json={**NEW, "name": "basic", "url": "https://bob:hunter2@hooks.example.com/b"},
        )
        assert basic.status_code == 201 and "hunter2" not in basic.text
        assert "hunter2" not in (await h.http.get("/v1/endpoints")).text
        # A secret the caller chose is taken (and shown back once).
        chosen = generate_secret()
        given = await h.http.post("/v1/endpoints", json={**NEW, "name": "own", "secret": chosen})
        assert given.status_code == 201 and given.json()["secret"] == chosen


async def test_pages_of_endpoints_follow_the_token(backend: Backend) -> None:
    async with api(backend) as h:
        for n in range(5):
            answer = await h.http.post("/v1/endpoints", json={**NEW, "name": f"ep-{n}"})
            assert answer.status_code == 201
        seen: list[str] = []
        params = {"pageSize": "2"}
        for _ in range(10):
            page = (await h.http.get("/v1/endpoints", params=params)).json()
            seen += [e["name"] for e in page["endpoints"]]
            if "nextPageToken" not in page:
                break
            params = {"pageSize": "2", "pageToken": page["nextPageToken"]}
        assert seen == ["ep-0", "ep-1", "ep-2", "ep-3", "ep-4", "filed"]


async def test_update_changes_the_definition_and_null_restores_a_default(
    backend: Backend,
) -> None:
    async with api(backend) as h:
        assert (await h.http.post("/v1/endpoints", json=NEW)).status_code == 201
        (before,) = h.sync.endpoints.stored_endpoints()
        changed = await h.http.patch(
            "/v1/endpoints/ci-bot",
            json={
                "url": "https://hooks.example.com/v2",
                "events": ["session.*"],
                "format": "slack",
            },
        )
        assert changed.status_code == 200, changed.text
        assert changed.json()["url"] == "https://hooks.example.com/v2"
        assert changed.json()["events"] == ["session.*"]
        (after,) = h.sync.endpoints.stored_endpoints()
        assert after.revision > before.revision and after.secret == before.secret
        back = await h.http.patch("/v1/endpoints/ci-bot", json={"format": None})
        assert back.json()["definition"] == {
            "url": "https://hooks.example.com/v2",
            "events": ["session.*"],
        }
        whole = await h.http.put(
            "/v1/endpoints/ci-bot", json={"url": "https://hooks.example.com/v3"}
        )
        assert whole.status_code == 200, whole.text
        assert whole.json()["definition"] == {"url": "https://hooks.example.com/v3"}
        assert whole.json()["description"] == "CI's hook"  # not part of the definition
        message = api_error(
            await h.http.patch("/v1/endpoints/ci-bot", json={"events": ["nope.*"]}), 400
        )
        assert message.startswith("events") and "matches no event type" in message
        assert "rotateSecret" in api_error(
            await h.http.patch("/v1/endpoints/ci-bot", json={"secret": generate_secret()}), 400
        )
        assert "renamed" in api_error(
            await h.http.patch("/v1/endpoints/ci-bot", json={"name": "other"}), 400
        )


async def test_the_config_files_endpoints_are_read_only_409(backend: Backend) -> None:
    async with api(backend) as h:
        cases = [
            await h.http.post("/v1/endpoints", json={**NEW, "name": "filed"}),
            await h.http.patch("/v1/endpoints/filed", json={"url": "https://x.example.com/"}),
            await h.http.put("/v1/endpoints/filed", json={"url": "https://x.example.com/"}),
            await h.http.delete("/v1/endpoints/filed"),
            await h.http.post("/v1/endpoints/filed:rotateSecret", json={}),
        ]
        for answer in cases:
            assert "config file" in api_error(answer, 409)
        assert (await h.http.post("/v1/endpoints", json=NEW)).status_code == 201
        assert "exists" in api_error(await h.http.post("/v1/endpoints", json=NEW), 409)
        # Enabling, disabling and testing apply to both kinds.
        off = await h.http.post("/v1/endpoints/filed:disable", json={"reason": "maintenance"})
        assert off.status_code == 200 and off.json()["disabled_reason"] == "maintenance"
        assert (await h.http.post("/v1/endpoints/filed:enable")).json()["enabled"] is True
        tested = await h.http.post("/v1/endpoints/ci-bot:test")
        assert tested.status_code == 200 and tested.json()["ok"] is True
        assert h.tested == ["ci-bot"]


async def test_unknown_names_are_404(backend: Backend) -> None:
    async with api(backend) as h:
        for method, path in [
            ("GET", "/v1/endpoints/ghost"),
            ("PATCH", "/v1/endpoints/ghost"),
            ("DELETE", "/v1/endpoints/ghost"),
            ("POST", "/v1/endpoints/ghost:enable"),
            ("POST", "/v1/endpoints/ghost:disable"),
            ("POST", "/v1/endpoints/ghost:rotateSecret"),
            ("POST", "/v1/endpoints/ghost:test"),
        ]:
            answer = await h.http.request(method, path, json={})
            assert "no endpoint named 'ghost'" in api_error(answer, 404), (method, path)
        assert "frobnicate" in api_error(await h.http.post("/v1/endpoints/filed:frobnicate"), 404)


async def test_delete_closes_the_open_deliveries_as_dead_and_frees_the_name(
    backend: Backend,
) -> None:
    async with api(backend) as h:
        assert (await h.http.post("/v1/endpoints", json=NEW)).status_code == 201
        fill(h.sync, 2, 2)  # 4 events, each enqueued to both endpoints
        open_before = h.sync.outbox.pending_count("ci-bot")
        assert open_before == 4
        deleted = await h.http.delete("/v1/endpoints/ci-bot")
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["deliveries_closed"] == 4
        assert deleted.json()["deliveries_closed_reason"] == "endpoint deleted"
        rows = h.sync.operator.list_deliveries("ci-bot", None, None, 10)
        assert {(r.status, r.last_error) for r in rows} == {("dead", "endpoint deleted")}
        assert h.sync.outbox.pending_count("filed") == 4  # the others are untouched
        assert h.sync.endpoints.stored_endpoints() == []
        api_error(await h.http.get("/v1/endpoints/ci-bot"), 404)
        fill(h.sync, 1, 1)  # nothing is enqueued to a deleted endpoint
        assert h.sync.outbox.pending_count("ci-bot") == 0
        again = await h.http.post("/v1/endpoints", json=NEW)
        assert again.status_code == 201
        assert again.json()["pending"] == 0 and again.json()["enabled"] is True


async def test_rotation_keeps_the_old_secret_signing_for_the_overlap(backend: Backend) -> None:
    async with api(backend) as h:
        first = (await h.http.post("/v1/endpoints", json=NEW)).json()["secret"]
        rotated = await h.http.post("/v1/endpoints/ci-bot:rotateSecret", json={"overlap": "1h"})
        assert rotated.status_code == 200, rotated.text
        second = rotated.json()["secret"]
        assert second.startswith("whsec_") and second != first
        assert rotated.json()["previous_secret_expires_at"] == "2027-01-15T09:00:00.000000Z"
        (stored,) = h.sync.endpoints.stored_endpoints()
        assert stored.secrets_at(NOW) == (second, first)
        assert stored.secrets_at(NOW + 3600) == (second,)
        default = await h.http.post("/v1/endpoints/ci-bot:rotateSecret")
        (stored,) = h.sync.endpoints.stored_endpoints()
        assert stored.previous_until == NOW + 24 * 3600  # the default overlap: a day
        assert stored.secrets_at(NOW) == (default.json()["secret"], second)
        for bad, key in [
            ({"overlap": -1}, "overlap"),
            ({"overlap": "forever"}, "overlap"),
            ({"overlap": 90 * 86400}, "overlap"),
            ({"secret": "whsec_short"}, "secret"),
            ({"extra": 1}, "extra"),
        ]:
            assert key in api_error(
                await h.http.post("/v1/endpoints/ci-bot:rotateSecret", json=bad), 400
            )


async def test_hostile_inputs_are_refused_by_name(backend: Backend) -> None:
    async with api(backend) as h:
        cases: list[tuple[Any, int, str]] = [
            ({**NEW, "url": "http://169.254.169.254/latest/meta-data"}, 400, "url"),
            ({**NEW, "url": "http://127.0.0.1:8080/hook"}, 400, "url"),
            ({**NEW, "url": "http://[::1]/hook"}, 400, "url"),
            ({**NEW, "url": "http://localhost/hook"}, 400, "url"),
            ({**NEW, "url": "ftp://hooks.example.com/x"}, 400, "http(s)"),
            ({**NEW, "url": "javascript:alert(1)"}, 400, "url"),
            ({**NEW, "url": "https://" + "a" * 3000 + ".example.com/"}, 400, "url"),
            ({**NEW, "name": "a/b"}, 400, "name"),
            ({**NEW, "name": "../etc"}, 400, "name"),
            ({**NEW, "name": "x" * 10_000}, 400, "name"),
            ({**NEW, "name": ""}, 400, "name"),
            ({**NEW, "name": 5}, 400, "name"),
            ({**NEW, "description": "d" * 5000}, 400, "description"),
            ({**NEW, "secret": "not-a-secret"}, 400, "secret"),
            ({**NEW, "secret": f"{generate_secret()} {generate_secret()}"}, 400, "secret"),
            ({**NEW, "accounts": ["nobody"]}, 400, "accounts"),
            ({**NEW, "template": "{{ event.nope.deeper }}"}, 400, "template"),
            ({**NEW, "enabled": False}, 400, "enabled"),
            ({**NEW, "secret_env": "HOME"}, 400, "secret_env"),
            ({"url": NEW["url"]}, 400, "name"),
        ]
        for body, status, key in cases:
            answer = await h.http.post("/v1/endpoints", json=body)
            message = api_error(answer, status)
            assert key in message, (str(body)[:80], message)
            assert "Traceback" not in answer.text
        raw = [
            (b"{not json", 400, "not JSON"),
            (b"[1]", 400, "JSON object"),
            (b"[" * 50_000, 400, "not JSON"),  # deep nesting: refused, no RecursionError
            (json.dumps({**NEW, "description": "d" * 70_000}).encode(), 413, "larger than"),
            (b"\xff\xfe", 400, "not JSON"),
        ]
        for content, status, reason in raw:
            answer = await h.http.post(
                "/v1/endpoints", content=content, headers={"content-type": "application/json"}
            )
            assert reason in api_error(answer, status)
        assert "a/b" not in {s.name for s in h.sync.endpoints.endpoint_states()}
        slashed = await h.http.get("/v1/endpoints/a/b")
        api_error(slashed, 404)
        assert h.sync.endpoints.stored_endpoints() == []  # nothing of it was stored


async def test_markup_and_control_characters_are_refused_in_url_and_description(
    backend: Backend,
) -> None:
    # A NUL is what PostgreSQL cannot store; '"><script>' what ends an HTML attribute.
    async with api(backend) as h:
        for body, key in [
            ({**NEW, "url": 'https://hooks.example.com/x"><script>alert(1)</script>'}, "url"),
            ({**NEW, "url": "https://hooks.example.com/x\x00"}, "url"),
            ({**NEW, "url": "https://hooks.example.com/a b"}, "url"),
            ({**NEW, "description": "note\x00"}, "description"),
            ({**NEW, "description": "bell\x07"}, "description"),
        ]:
            assert api_error(await h.http.post("/v1/endpoints", json=body), 400).startswith(key)
        assert h.sync.endpoints.stored_endpoints() == []
        assert (await h.http.post("/v1/endpoints", json=NEW)).status_code == 201
        patched = await h.http.patch(f"/v1/endpoints/{NEW['name']}", json={"description": "\x00"})
        assert api_error(patched, 400).startswith("description")


async def test_hosts_that_normalize_to_private_addresses_are_refused(backend: Backend) -> None:
    """127.0.0.1 in fullwidth digits, with ideographic full stops, localhost in circled
    letters...: judged on the host the HTTP client connects to, at create and at update
    (400, one line, never a 500)."""
    async with api(backend) as h:
        assert (await h.http.post("/v1/endpoints", json=NEW)).status_code == 201
        for url in [*loopback_spellings(8080), *ELSEWHERE]:
            created = await h.http.post(
                "/v1/endpoints", json={**NEW, "name": "spelled", "url": url}
            )
            message = api_error(created, 400, "allow_private_networks = false")
            assert message.startswith("url: "), message
            changed = await h.http.patch(f"/v1/endpoints/{NEW['name']}", json={"url": url})
            assert api_error(changed, 400).startswith("url: ")
        [kept] = h.sync.endpoints.stored_endpoints()
        assert kept.spec["url"] == NEW["url"]


async def test_international_names_are_kept_as_written(backend: Backend) -> None:
    async with api(backend) as h:
        url = "https://bücher.example/hook"
        created = await h.http.post("/v1/endpoints", json={**NEW, "url": url})
        assert created.status_code == 201, created.text
        assert created.json()["url"] == url


async def test_private_addresses_pass_when_the_config_allows_them(backend: Backend) -> None:
    async with api(backend, allow_private=True) as h:
        answer = await h.http.post(
            "/v1/endpoints", json={**NEW, "url": "http://127.0.0.1:8080/hook"}
        )
        assert answer.status_code == 201, answer.text


async def test_a_create_past_delivery_max_endpoints_is_refused_in_one_line(
    backend: Backend,
) -> None:
    """Issue 26 item 6: the endpoints created at run time are bounded; the config file's
    do not count; a delete makes room again."""
    async with api(backend, max_endpoints=2) as h:
        for name in ("one", "two"):
            created = await h.http.post(
                "/v1/endpoints", json={"name": name, "url": f"https://hooks.example.com/{name}"}
            )
            assert created.status_code == 201, created.text
        refused = await h.http.post(
            "/v1/endpoints", json={"name": "three", "url": "https://hooks.example.com/3"}
        )
        api_error(refused, 409, "delivery.max_endpoints is 2 (the store holds 2)")
        assert [e.name for e in h.sync.endpoints.stored_endpoints()] == ["one", "two"]
        assert (await h.http.delete("/v1/endpoints/one")).status_code == 200
        again = await h.http.post(
            "/v1/endpoints", json={"name": "three", "url": "https://hooks.example.com/3"}
        )
        assert again.status_code == 201, again.text
    async with api(backend, max_endpoints=0) as h:
        none = await h.http.post("/v1/endpoints", json=NEW)
        api_error(none, 409, "delivery.max_endpoints is 0 (the store holds 2)")
