"""Every operation of the management API (the ``paths`` of ``/openapi.json``) over HTTP
against the real daemon, in process on both store engines: its listener on a loopback port,
the emulator upstream and a consumer behind ASGI transports. Each operation answers 401
without the token and with a wrong one, 400 with one line for a body that is not JSON,
and does its work with a good request; every answer, the refusals too, is valid against
its schema in the document the daemon serves; the test fails if the document lists an
operation it did not call (the event stream included). Every parameter the document names,
in a path, a query or a header, sent 10 KB long, is refused with one short line (400; 404
for a name in a path, which names nothing), never answered 200 or 500. (The Slack route is
Slack's, signed by Slack: tests/test_slack_daemon.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import jsonschema
import pytest

from sessionhook.relay.domain.contract import openapi_document
from tests.support.backends import Backend
from tests.support.daemon_setup import Setup, token_server
from tests.support.receiver import Receiver
from tests.support.web_relay import api_error

pytestmark = [pytest.mark.app, pytest.mark.anyio]

TOKEN = "api-daemon-token-" + "k" * 30
SLACK = "/v1/integrations/slack/interactions"
STREAM = "/v1/events/stream"
WITHIN = 30.0
#: A parameter's length in :func:`_every_parameter_10_kb_long`.
LONG = 10 * 1024


@dataclass
class Api:
    """The relay's listener, the document it serves, and the operations called on it
    (method, path template)."""

    http: httpx.AsyncClient
    document: dict[str, Any]
    called: set[tuple[str, str]] = field(default_factory=set)

    def valid(self, method: str, template: str, answer: httpx.Response) -> Any:
        """``answer``'s JSON, checked against the schema the document gives the
        operation's answer of that status."""
        responses = self.document["paths"][template][method.lower()]["responses"]
        schema = responses[str(answer.status_code)]["content"]["application/json"]["schema"]
        data = answer.json()
        jsonschema.validate(data, {**schema, "components": self.document["components"]})
        return data

    async def __call__(
        self, method: str, template: str, status: int, body: Any = None, **params: str
    ) -> Any:
        """Call ``template`` (its ``{name}``s filled from ``params``) after checking that it
        refuses a missing or wrong token and, when it takes a body, a body that is not JSON;
        the JSON answer, which must have ``status``."""
        self.called.add((method, template))
        path = template.format(**params)
        for headers in ({}, {"authorization": "Bearer " + "x" * 40}):
            refused = await self.http.request(method, path, headers=headers)
            api_error(refused, 401)
            self.valid(method, template, refused)
        if method in ("POST", "PUT", "PATCH"):
            broken = await self.http.request(
                method,
                path,
                content=b'{"name": ',
                headers={**_auth(), "content-type": "application/json"},
            )
            api_error(broken, 400)
            self.valid(method, template, broken)
        answer = await self.http.request(method, path, json=body, headers=_auth())
        assert answer.status_code == status, (method, path, answer.text)
        return self.valid(method, template, answer)

    async def first_streamed(self, **params: str) -> str:
        """Refusals as :meth:`__call__` checks them, then the id of the first event
        ``GET /v1/events/stream`` sends."""
        self.called.add(("GET", STREAM))
        for headers in ({}, {"authorization": "Bearer " + "x" * 40}):
            api_error(await self.http.get(STREAM, params=params, headers=headers), 401)
        async with self.http.stream("GET", STREAM, params=params, headers=_auth()) as answer:
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/event-stream")
            async for line in answer.aiter_lines():
                if line.startswith("id: "):
                    return line.removeprefix("id: ")
        raise AssertionError("the stream ended before its first event")


def _auth() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}"}


def _operations() -> set[tuple[str, str]]:
    paths = openapi_document()["paths"]
    return {(m.upper(), p) for p, ops in paths.items() for m in ops if p != SLACK}


async def _every_parameter_10_kb_long(http: httpx.AsyncClient) -> set[tuple[str, str]]:
    """Send each parameter of each operation of the daemon's ``/openapi.json`` 10 KB long
    (digits, then letters), the others of its path short; check each refusal. Returns the
    (operation, parameter) pairs sent."""
    document = (await http.get("/openapi.json")).json()
    sent: set[tuple[str, str]] = set()
    for template, operations in document["paths"].items():
        if template == SLACK:
            continue
        for method, operation in operations.items():
            parameters = operation.get("parameters", [])
            in_path = [p["name"] for p in parameters if p["in"] == "path"]
            for parameter in parameters:
                name, where = parameter["name"], parameter["in"]
                for value in ("7" * LONG, "x" * LONG):
                    filled = {n: value if (n, where) == (name, "path") else "x" for n in in_path}
                    query = {name: value} if where == "query" else None
                    header = {name: value} if where == "header" else {}
                    answer = await http.request(
                        method.upper(),
                        template.format(**filled),
                        params=query,
                        json={} if method in ("post", "put", "patch") else None,
                        headers={**_auth(), **header},
                    )
                    refused = 404 if answer.status_code == 404 and where == "path" else 400
                    message = api_error(answer, refused)
                    assert len(message) < 300, (method, template, name, message[:100])
                    if where in ("query", "header"):
                        assert name in message, (method, template, message)
                sent.add((operation["operationId"], name))
    return sent


def _delivered(session: str, kind: str) -> Callable[[Receiver], bool]:
    def check(receiver: Receiver) -> bool:
        return any(
            a.type == kind and a.body["data"]["session"]["name"] == session
            for a in receiver.first_deliveries()
        )

    return check


async def test_every_operation_of_the_document_over_http_on_the_real_daemon(
    backend: Backend, tmp_path: Path
) -> None:
    server = token_server(tmp_path, TOKEN)
    listen = server["listen"]
    store = {"url": backend.target} if backend.name == "postgresql" else {}
    setup = Setup(tmp_path, server=server, store=store)
    daemon = setup.daemon()
    async with (
        setup.api_http() as api_http,
        httpx.AsyncClient(base_url=f"http://{listen}", timeout=10) as http,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        upstream = setup.api(api_http)
        session = await upstream.create_session("Through the API", require_plan_approval=True)
        sid = session.name.removeprefix("sessions/")
        await setup.receiver.wait_for(
            _delivered(session.name, "session.action_required"), within=WITHIN
        )
        api = Api(http, (await http.get("/openapi.json")).json())

        status = await api("GET", "/v1/status", 200)
        assert [e["name"] for e in status["endpoints"]] == ["rx"]

        # Sessions, and what a person does to one upstream.
        listed = await api("GET", "/v1/sessions", 200)
        assert session.name in [s["name"] for s in listed["sessions"]]
        one = await api("GET", "/v1/sessions/{id}", 200, id=sid)
        assert "session.action_required" in [e["type"] for e in one["events"]]
        approved = await api("POST", "/v1/sessions/{id}:approvePlan", 200, {}, id=sid)
        assert approved["ok"] is True
        again = await http.post(f"/v1/sessions/{sid}:approvePlan", headers=_auth())
        api_error(again, 502)  # no plan waits any more: the service's own words
        sent = await api("POST", "/v1/sessions/{id}:sendMessage", 200, {"prompt": "Thanks"}, id=sid)
        assert sent["ok"] is True
        acted = await api("GET", "/v1/actions", 200)
        assert [(a["action"], a["actor_kind"]) for a in acted["actions"]][:3] == [
            ("reply", "api"),
            ("approve_plan", "api"),
            ("approve_plan", "api"),
        ]

        # Events and deliveries of that session; the config file's endpoint held while an
        # event is replayed to it, so that its delivery waits to be retried.
        events = await api("GET", "/v1/events", 200)
        event_id = next(e["id"] for e in events["events"] if e["session"] == session.name)
        first, second = (e["id"] for e in events["events"][:2])
        event = await api("GET", "/v1/events/{id}", 200, id=event_id)
        assert event["event"]["id"] == event_id and event["deliveries"]
        off = await api("POST", "/v1/endpoints/{name}:disable", 200, {}, name="rx")
        assert off["enabled"] is False
        replayed = await api("POST", "/v1/events/{id}:replay", 200, {"endpoint": "rx"}, id=event_id)
        assert replayed["queued"] == 1
        deliveries = await api("GET", "/v1/deliveries", 200)
        # The session's own later events wait behind the held endpoint too: the replayed one.
        waiting = [
            d for d in deliveries["deliveries"] if d["status"] == "pending" and d["replayed"]
        ]
        assert [d["event_id"] for d in waiting] == [event_id]
        delivery = str(waiting[0]["id"])
        got = await api("GET", "/v1/deliveries/{id}", 200, id=delivery)
        assert got["delivery"]["event_id"] == event_id and got["attempts"] == []
        retried = await api("POST", "/v1/deliveries/{id}:retry", 200, {}, id=delivery)
        assert retried["previous_status"] == "pending"
        recovered = await api(
            "POST", "/v1/deliveries:recover", 200, {"endpoint": "rx", "since": "1h"}
        )
        assert recovered["recovered"] == 0 and recovered["message"]
        on = await api("POST", "/v1/endpoints/{name}:enable", 200, {}, name="rx")
        assert on["enabled"] is True
        for _ in range(int(WITHIN / 0.05)):  # sent once the endpoint is on again
            got = await http.get(f"/v1/deliveries/{delivery}", headers=_auth())
            if got.json()["delivery"]["status"] == "delivered":
                break
            await anyio.sleep(0.05)
        else:
            raise AssertionError(f"delivery {delivery} not sent after the endpoint was enabled")
        pinged = await api("POST", "/v1/endpoints/{name}:test", 200, {}, name="rx")
        assert pinged["ok"] is True
        sample = {"type": "session.completed"}
        triggered = await api("POST", "/v1/endpoints/{name}:trigger", 200, sample, name="rx")
        assert triggered["ok"] is True and triggered["webhook_id"].startswith("msg_trigger_")

        # Endpoints: one made here through its whole life.
        assert [e["name"] for e in (await api("GET", "/v1/endpoints", 200))["endpoints"]] == ["rx"]
        made = await api(
            "POST",
            "/v1/endpoints",
            201,
            {"name": "laptop", "url": "http://laptop.test/hook", "events": ["session.*"]},
        )
        assert made["secret"].startswith("whsec_")
        assert (await api("GET", "/v1/endpoints/{name}", 200, name="laptop"))["name"] == "laptop"
        patched = await api(
            "PATCH", "/v1/endpoints/{name}", 200, {"description": "mine"}, name="laptop"
        )
        assert patched["description"] == "mine"
        put = await api(
            "PUT",
            "/v1/endpoints/{name}",
            200,
            {"url": "http://laptop.test/other", "events": ["activity.*"]},
            name="laptop",
        )
        assert put["definition"]["events"] == ["activity.*"]
        rotated = await api(
            "POST", "/v1/endpoints/{name}:rotateSecret", 200, {"overlap": "1h"}, name="laptop"
        )
        assert rotated["secret"] != made["secret"]
        gone = await api("DELETE", "/v1/endpoints/{name}", 200, name="laptop")
        assert gone["deleted"] is True
        api_error(await http.get("/v1/endpoints/laptop", headers=_auth()), 404)
        # The stream, from after the first event archived: the second comes first.
        assert await api.first_streamed(last_event_id=first) == second
        too_long = await _every_parameter_10_kb_long(http)
        daemon.stop()

    assert api.called == _operations()
    assert ("listActions", "session") in too_long and ("listDeliveries", "pageToken") in too_long
    assert ("streamEvents", "Last-Event-ID") in too_long
    assert len(too_long) == sum(
        len(op.get("parameters", []))
        for ops in openapi_document()["paths"].values()
        for op in ops.values()
    )
