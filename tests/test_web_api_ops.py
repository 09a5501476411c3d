"""The management API's deliveries, events and sessions over HTTP, in process over a real
store on both backends: every route's answer, 401 without the token, 400 with a one-line
reason for what cannot be read (hostile ids, bodies, times), 404 for what is not there;
retry and recover keep the webhook-id and each session's order, and wake the dispatcher."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.routing import Route
from structlog.testing import capture_logs

from sessionhook.relay.config import Config
from sessionhook.relay.config.endpoint_spec import SPEC_KEYS
from sessionhook.relay.domain import api_models
from sessionhook.relay.domain.actions import ActionKind, ActOutcome
from sessionhook.relay.domain.api_paths import api_document
from sessionhook.relay.domain.contract import EVENT_MODELS, openapi_document, shipped_document
from sessionhook.relay.domain.retry import Dead, Delivered, Retry
from sessionhook.relay.domain.rows import (
    AttemptRow,
    DeliveryRow,
    EndpointState,
    EndpointSummary,
    RefusedRow,
    RefusedSummary,
    ReplicaRow,
    StatusSummary,
    UpstreamSummary,
)
from sessionhook.relay.store import AsyncStore, StoreCore, StoreError
from sessionhook.relay.store.actions import ActionRow
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import WebAuth, WebContext, create_app
from sessionhook.relay.web.api import API_GROUPS
from sessionhook.relay.web.stream import stream_routes
from tests.support.backends import Backend
from tests.support.requeue_rows import ACT0, Ep, failure, fill
from tests.support.web_relay import api_error

pytestmark = [pytest.mark.app, pytest.mark.anyio]

TOKEN = "api-token-" + "z" * 30
AUTH = {"authorization": f"Bearer {TOKEN}"}


@dataclass
class Relay:
    """What the app was handed: the store, the dispatcher's wake-ups, the upstream acts."""

    http: httpx.AsyncClient
    store: StoreCore
    wakes: list[int] = field(default_factory=list)
    acts: list[tuple[str, str, str | None]] = field(default_factory=list)
    refuse: str | None = None


@asynccontextmanager
async def relay(backend: Backend, *, can_act: bool = True) -> AsyncIterator[Relay]:
    config = Config.model_validate(
        {"server": {"listen": "127.0.0.1:9187", "token_env": "SESSIONHOOK_WEB_TOKEN"}}
    )
    core = backend.open()
    core.endpoints.sync_endpoints(
        [Ep("ci-bot", events=("activity.*",)), Ep("chat", events=("session.*",))]
    )
    astore = AsyncStore(core)
    state: dict[str, Relay] = {}

    async def act(session: str, kind: ActionKind, text: str | None) -> ActOutcome:
        r = state["relay"]
        r.acts.append((session, kind, text))
        if r.refuse is not None:
            return ActOutcome(False, 400, r.refuse)
        return ActOutcome(True, 200, "done")

    ctx = WebContext(
        config=lambda: config,
        store=lambda: astore,
        metrics=Metrics(),
        auth=WebAuth(TOKEN),
        wake=lambda: state["relay"].wakes.append(1),
        act=act if can_act else None,
    )
    transport = httpx.ASGITransport(create_app(ctx))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            state["relay"] = Relay(http, core)
            yield state["relay"]
    finally:
        await astore.close()


ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/v1/deliveries", None),
    ("GET", "/v1/deliveries/1", None),
    ("POST", "/v1/deliveries/1:retry", None),
    ("POST", "/v1/deliveries:recover", {"endpoint": "ci-bot", "since": "1h"}),
    ("GET", "/v1/events", None),
    ("GET", "/v1/events/evt_1", None),
    ("POST", "/v1/events/evt_1:replay", {"endpoint": "ci-bot"}),
    ("GET", "/v1/sessions", None),
    ("GET", "/v1/sessions/s0", None),
    ("POST", "/v1/sessions/s0:approvePlan", None),
    ("POST", "/v1/sessions/s0:sendMessage", {"prompt": "go on"}),
]


async def test_every_route_answers_401_without_or_with_a_wrong_token(backend: Backend) -> None:
    async with relay(backend) as r:
        fill(r.store, 1, 1, discovered=True)
        (only,) = r.store.operator.list_deliveries(endpoint="ci-bot")
        r.store.outbox.record_attempt(only.id, failure(1.0), Dead())
        for method, path, body in ROUTES:
            for headers in ({}, {"authorization": "Bearer wrong"}):
                answer = await r.http.request(method, path, json=body, headers=headers)
                api_error(answer, 401)
        assert r.acts == [] and r.wakes == []
        assert r.store.operator.get_delivery(only.id).status == "dead"  # type: ignore[union-attr]


async def test_deliveries_list_filters_and_pages_newest_first(backend: Backend) -> None:
    async with relay(backend) as r:
        fill(r.store, 3, 3, discovered=True)
        everything = [d.id for d in r.store.operator.list_deliveries(limit=100)]
        assert len(everything) == 12  # 9 activity events to ci-bot, 3 session events to chat
        seen: list[int] = []
        params: dict[str, str] = {"pageSize": "5"}
        for _ in range(10):
            page = (await r.http.get("/v1/deliveries", params=params, headers=AUTH)).json()
            seen += [d["id"] for d in page["deliveries"]]
            if "nextPageToken" not in page:
                break
            params = {"pageSize": "5", "pageToken": page["nextPageToken"]}
        assert seen == everything
        one = (
            await r.http.get(
                "/v1/deliveries",
                params={"session": "sessions/s1", "endpoint": "ci-bot"},
                headers=AUTH,
            )
        ).json()
        rows = one["deliveries"]
        assert len(rows) == 3 and {d["session_name"] for d in rows} == {"sessions/s1"}
        assert rows[0]["created_at"].endswith("Z") and rows[-1]["waiting_on"] is None
        event = rows[0]["event_id"]
        by_event = await r.http.get("/v1/deliveries", params={"event": event}, headers=AUTH)
        assert [d["event_id"] for d in by_event.json()["deliveries"]] == [event]
        api_error(await r.http.get("/v1/deliveries?status=lost", headers=AUTH), 400, "status")
        api_error(await r.http.get("/v1/deliveries?endpoint=nope", headers=AUTH), 404, "nope")
        api_error(await r.http.get("/v1/deliveries?session=" + "x" * 5000, headers=AUTH), 400)
        for token in ("bm90LWEtbnVtYmVy", "cDphYmM", "%%%"):  # "p:abc" is ours but not an id
            api_error(await r.http.get(f"/v1/deliveries?pageToken={token}", headers=AUTH), 400)


async def test_one_delivery_with_its_attempts_and_hostile_ids(backend: Backend) -> None:
    async with relay(backend) as r:
        fill(r.store, 1, 1, discovered=True)
        (only,) = r.store.operator.list_deliveries(endpoint="ci-bot")
        r.store.outbox.record_attempt(only.id, failure(ACT0), Retry(at=ACT0 + 300))
        answer = await r.http.get(f"/v1/deliveries/{only.id}", headers=AUTH)
        assert answer.status_code == 200
        body = answer.json()
        assert body["delivery"]["id"] == only.id and body["delivery"]["status"] == "failed"
        assert [a["status_code"] for a in body["attempts"]] == [500]
        api_error(await r.http.get("/v1/deliveries/424242", headers=AUTH), 404, "no delivery")
        for bad in ("abc", "9" * 40, "-1", "1.5", "\u0661"):  # U+0661: a digit, not ASCII
            api_error(await r.http.get(f"/v1/deliveries/{bad}", headers=AUTH), 400, "whole number")
            api_error(await r.http.post(f"/v1/deliveries/{bad}:retry", headers=AUTH), 400)


async def test_retry_over_http_reopens_the_same_delivery_and_wakes_the_dispatcher(
    backend: Backend,
) -> None:
    async with relay(backend) as r:
        fill(r.store, 1, 2, discovered=True)
        first, second = sorted(
            r.store.operator.list_deliveries(endpoint="ci-bot"), key=lambda d: d.id
        )
        r.store.outbox.record_attempt(first.id, failure(ACT0), Dead())
        answer = await r.http.post(f"/v1/deliveries/{first.id}:retry", headers=AUTH)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["previous_status"] == "dead" and body["delivery"]["status"] == "pending"
        assert body["delivery"]["event_id"] == first.event_id and r.wakes == [1]
        # The later one of the session waits behind it again: order kept.
        after = r.store.operator.get_delivery(second.id)
        assert after is not None and after.waiting_on == first.id
        r.store.outbox.record_attempt(first.id, failure(ACT0), Delivered())
        api_error(
            await r.http.post(f"/v1/deliveries/{first.id}:retry", headers=AUTH),
            409,
            "delivered already",
            first.event_id,
        )
        api_error(await r.http.post("/v1/deliveries/999999:retry", headers=AUTH), 404)
        api_error(await r.http.post(f"/v1/deliveries/{first.id}/retry", headers=AUTH), 404)


async def test_recover_over_http_requeues_and_says_why_when_nothing(backend: Backend) -> None:
    async with relay(backend) as r:
        fill(r.store, 2, 2, discovered=True)
        for d in r.store.operator.list_deliveries(endpoint="ci-bot"):
            r.store.outbox.record_attempt(d.id, failure(ACT0), Dead())
        ids = sorted(d.id for d in r.store.operator.list_deliveries(endpoint="ci-bot"))
        answer = await r.http.post(
            "/v1/deliveries:recover",
            json={"endpoint": "ci-bot", "since": "2025-03-01T09:00:00Z"},
            headers=AUTH,
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["recovered"] == 4 and body["ids"] == ids and body["reason"] is None
        assert r.wakes == [1]
        assert {d.status for d in r.store.operator.list_deliveries(endpoint="ci-bot")} == {
            "pending"
        }
        none = await r.http.post(
            "/v1/deliveries:recover", json={"endpoint": "ci-bot", "since": "1h"}, headers=AUTH
        )
        assert none.json()["recovered"] == 0 and "4 are pending" in none.json()["reason"]
        assert r.wakes == [1]  # nothing queued: nobody woken
        for body_bytes, words in (
            (b"{not json", ("not JSON",)),
            (b"[]", ("JSON object",)),
            (b'{"endpoint": "ci-bot"}', ("since",)),
            (b'{"endpoint": "ci-bot", "since": "yesterday-ish"}', ("since", "RFC 3339")),
            (b'{"endpoint": "ci-bot", "since": "99999999999d"}', ("since",)),
            (b'{"endpoint": "ci-bot", "since": "1h", "more": 1}', ("more",)),
            (b'{"endpoint": 7, "since": "1h"}', ("endpoint",)),
        ):
            answer = await r.http.post(
                "/v1/deliveries:recover",
                content=body_bytes,
                headers={**AUTH, "content-type": "application/json"},
            )
            api_error(answer, 400, *words)
        api_error(
            await r.http.post(
                "/v1/deliveries:recover", json={"endpoint": "nope", "since": "1h"}, headers=AUTH
            ),
            404,
            "nope",
        )


async def test_events_list_get_and_replay(backend: Backend) -> None:
    async with relay(backend) as r:
        fill(r.store, 2, 3, discovered=True)
        seen: list[int] = []
        params: dict[str, str] = {"pageSize": "2", "session": "sessions/s1"}
        for _ in range(10):
            page = (await r.http.get("/v1/events", params=params, headers=AUTH)).json()
            seen += [e["seq"] for e in page["events"]]
            assert {e["session"] for e in page["events"]} <= {"sessions/s1"}
            if "nextPageToken" not in page:
                break
            params = {**params, "pageToken": page["nextPageToken"]}
        assert seen == sorted(seen) and len(seen) == 4  # session.discovered + 3 activities
        typed = (await r.http.get("/v1/events?type=session.*", headers=AUTH)).json()["events"]
        assert [e["type"] for e in typed] == ["session.discovered"] * 2
        event = typed[0]["id"]
        got = (await r.http.get(f"/v1/events/{event}", headers=AUTH)).json()
        assert got["event"]["id"] == event and got["event"]["body"]["type"] == "session.discovered"
        assert [d["endpoint"] for d in got["deliveries"]] == ["chat"]
        # Its delivery is open: nothing to queue, and the answer says why.
        on_way = await r.http.post(
            f"/v1/events/{event}:replay", json={"endpoint": "chat"}, headers=AUTH
        )
        assert on_way.status_code == 200 and on_way.json()["queued"] == 0
        assert "the event selected is on its way" in on_way.json()["reason"]
        for d in got["deliveries"]:
            r.store.outbox.record_attempt(d["id"], failure(ACT0), Delivered())
        again = await r.http.post(
            f"/v1/events/{event}:replay", json={"endpoint": "chat"}, headers=AUTH
        )
        assert again.json()["queued"] == 1 and r.wakes == [1]
        replayed = r.store.operator.list_deliveries(event_id=event, endpoint="chat")
        assert len(replayed) == 2 and replayed[0].replayed and replayed[0].event_id == event
        api_error(await r.http.get("/v1/events/evt_nothing", headers=AUTH), 404, "evt_nothing")
        api_error(await r.http.get("/v1/events/" + "e" * 300, headers=AUTH), 400, "event id")
        api_error(await r.http.get("/v1/events?pageToken=cDp4", headers=AUTH), 400)
        api_error(
            await r.http.post(
                "/v1/events/evt_nothing:replay", json={"endpoint": "chat"}, headers=AUTH
            ),
            404,
        )
        api_error(
            await r.http.post(
                f"/v1/events/{event}:replay", json={"endpoint": "nope"}, headers=AUTH
            ),
            404,
            "nope",
        )
        api_error(
            await r.http.post(
                f"/v1/events/{event}:replay",
                content=b"\xff\xfe",
                headers={**AUTH, "content-type": "application/json"},
            ),
            400,
        )


async def test_sessions_list_get_and_act_through_the_daemons_seam(backend: Backend) -> None:
    async with relay(backend) as r:
        fill(r.store, 3, 1, discovered=True)
        first = (await r.http.get("/v1/sessions?pageSize=2", headers=AUTH)).json()
        assert [s["name"] for s in first["sessions"]] == ["sessions/s0", "sessions/s1"]
        rest = await r.http.get(
            "/v1/sessions",
            params={"pageSize": "2", "pageToken": first["nextPageToken"]},
            headers=AUTH,
        )
        assert [s["name"] for s in rest.json()["sessions"]] == ["sessions/s2"]
        assert "nextPageToken" not in rest.json()
        one = (await r.http.get("/v1/sessions/s1", headers=AUTH)).json()
        assert one["session"]["title"] == "Session 1" and one["more_events"] is False
        kinds = [e["type"] for e in one["events"]]
        assert kinds == ["session.discovered", "activity.progress_updated"]
        api_error(await r.http.get("/v1/sessions/nope", headers=AUTH), 404, "sessions/nope")
        api_error(await r.http.get("/v1/sessions/a%20b", headers=AUTH), 400, "session id")
        ok = await r.http.post("/v1/sessions/s1:approvePlan", headers=AUTH)
        assert ok.status_code == 200 and ok.json()["ok"] is True
        sent = await r.http.post(
            "/v1/sessions/s1:sendMessage", json={"prompt": "Use the new parser"}, headers=AUTH
        )
        assert sent.status_code == 200
        assert r.acts == [
            ("sessions/s1", "approve_plan", None),
            ("sessions/s1", "reply", "Use the new parser"),
        ]
        r.refuse = "Precondition failed: no plan\nis waiting <b>now</b>"
        refused = await r.http.post("/v1/sessions/s1:approvePlan", headers=AUTH)
        api_error(refused, 502, "no plan is waiting <b>now</b>")
        api_error(await r.http.post("/v1/sessions/nope:approvePlan", headers=AUTH), 404)
        for body in (b'{"prompt": ""}', b'{"prompt": "   "}', b"{}", b"prompt", b'{"text": "x"}'):
            answer = await r.http.post(
                "/v1/sessions/s1:sendMessage",
                content=body,
                headers={**AUTH, "content-type": "application/json"},
            )
            api_error(answer, 400)
        assert len(r.acts) == 3  # the refused one reached the seam; no bad body did
        # Each act is recorded beside the links' and the console's, and counted.
        listed = (await r.http.get("/v1/actions", headers=AUTH)).json()["actions"]
        assert [(a["action"], a["result"], a["actor_kind"]) for a in listed] == [
            ("approve_plan", "failed", "api"),
            ("reply", "ok", "api"),
            ("approve_plan", "ok", "api"),
        ]
        assert {a["session"] for a in listed} == {"sessions/s1"}
        assert listed[0]["status"] == 400 and "no plan" in listed[0]["detail"]
        assert all(a["actor_agent"].startswith("python-httpx/") for a in listed)
        assert all(a["token_hash"] == "" for a in listed)
        metrics = (await r.http.get("/metrics")).text
        assert 'sessionhook_actions_total{action="approve_plan",result="done"} 1.0' in metrics
        assert 'sessionhook_actions_total{action="reply",result="done"} 1.0' in metrics
        failed = 'sessionhook_actions_total{action="approve_plan",result="upstream failed"} 1.0'
        assert failed in metrics


async def test_an_action_made_is_answered_as_made_when_the_store_cannot_record_it(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with relay(backend) as r:
        fill(r.store, 1, 1, discovered=True)

        def full(*args: object, **kwargs: object) -> int:
            raise StoreError("database or disk is full")

        monkeypatch.setattr(r.store.actions, "record_action", full)
        with capture_logs() as logs:
            ok = await r.http.post("/v1/sessions/s0:approvePlan", headers=AUTH)
        # Upstream approved it: saying otherwise would invite a second approval.
        assert ok.status_code == 200 and ok.json()["ok"] is True
        assert r.acts == [("sessions/s0", "approve_plan", None)]
        [line] = [e for e in logs if e["event"] == "actions.not_recorded"]
        assert (line["session"], line["actor"], line["log_level"]) == (
            "sessions/s0",
            "api",
            "error",
        )
        assert "disk is full" in line["error"]


async def test_acting_is_503_when_the_relay_cannot_act(backend: Backend) -> None:
    async with relay(backend, can_act=False) as r:
        fill(r.store, 1, 1, discovered=True)
        api_error(await r.http.post("/v1/sessions/s0:approvePlan", headers=AUTH), 503, "cannot act")


def test_the_models_carry_every_field_of_the_rows_they_show() -> None:
    """A field the store's rows gain is not left out of the API silently: each row the API
    shows and its model have the same fields (and the model what it adds to the row); the
    definition keys of an endpoint are the config's."""
    shown: list[tuple[type[Any], type[BaseModel], set[str]]] = [
        (DeliveryRow, api_models.ApiDeliveryRow, set()),
        (DeliveryRow, api_models.ApiDelivery, {"claimed_by", "claimed_at"}),
        (AttemptRow, api_models.ApiAttempt, set()),
        (EndpointState, api_models.ApiEndpointState, {"pending", "in_flight"}),
        (EndpointSummary, api_models.ApiEndpointSummary, set()),
        (UpstreamSummary, api_models.ApiUpstream, set()),
        (RefusedSummary, api_models.ApiRefused, set()),
        (RefusedRow, api_models.ApiRefusedActivity, set()),
        (ReplicaRow, api_models.ApiReplica, {"health"}),
        (ActionRow, api_models.ApiAction, set()),
        (StatusSummary, api_models.ApiStatus, {"history_walk", "accounts", "replicas"}),
    ]
    for row, model, added in shown:
        assert {f.name for f in fields(row)} | added == set(model.model_fields), model
    assert api_models.DEFINITION_KEYS == SPEC_KEYS


def test_openapi_describes_every_api_route_and_only_those() -> None:
    config = Config.model_validate({"server": {"listen": "127.0.0.1:9187"}})
    ctx = WebContext(
        config=lambda: config, store=lambda: None, metrics=Metrics(), auth=WebAuth(TOKEN)
    )
    served = {
        (method, route.path)
        for group in (*API_GROUPS, stream_routes)
        for route in group(ctx)
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    document = openapi_document()
    described = {(m.upper(), path) for path, ops in document["paths"].items() for m in ops}
    assert served == described and ("POST", "/v1/deliveries:recover") in served
    assert ("GET", "/v1/events/stream") in served
    # The API's schemas are apart from the webhooks' (none replaces one of theirs).
    webhook_models = {m.__name__ for m in EVENT_MODELS.values()}
    _, api_models = api_document()
    _, api_schemas = models_json_schema([(m, "validation") for m in api_models])
    assert not webhook_models & {*api_schemas["$defs"], *(m.__name__ for m in api_models)}
    for path, ops in document["paths"].items():
        for op in ops.values():
            # Slack's route is signed by Slack; every other one needs the bearer token.
            scheme = "slackSignature" if path.startswith("/v1/integrations/slack/") else "bearer"
            assert op["security"] == [{scheme: []}] and "401" in op["responses"], path
    assert shipped_document() == document
