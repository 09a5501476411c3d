"""Black-box tests of issue 11: lifecycle events, payload modes, formats, templates,
filters, ``v1a`` signatures and rate limits, through the real ``sessionhook run`` against
the stand-in API and a consumer on loopback.

Bodies are checked by independent means only: the OpenAPI document the daemon serves
(jsonschema), the CloudEvents SDK, JSON schemas written from each chat service's
documented webhook format (``chat_schemas.py``), PyNaCl for ed25519. Nothing is imported
from ``sessionhook``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http_event

from tests.support.blackbox_consumer import Consumer, Hit
from tests.support.chat_schemas import CHAT, CHAT_FORMATS
from tests.support.delivery_checks import documented_id
from tests.support.relay_process import (
    Endpoint,
    Harness,
    relay_config,
    sessionhook,
    wait_ready,
    wait_until,
)
from tests.support.world import World

pytestmark = pytest.mark.process

LIFECYCLE = ("session.action_required", "session.completed", "session.failed")

TEMPLATE = (
    '{"kind": {{ type | tojson }}, "who": {{ session.title | tojson }}, '
    '"id": {{ webhook_id | tojson }}, '
    '"step": {{ (data.plan.steps[1].title if data.plan else "") | tojson }}}'
)


def new_keypair() -> tuple[str, str]:
    """An ed25519 pair made with PyNaCl (libsodium layout: seed + public key)."""
    from nacl.signing import SigningKey

    key = SigningKey.generate()
    seed, public = bytes(key), bytes(key.verify_key)
    import base64

    return (
        "whsk_" + base64.b64encode(seed + public).decode(),
        "whpk_" + base64.b64encode(public).decode(),
    )


def message_text(name: str, body: dict[str, Any]) -> str:
    """Every human-readable string of a chat body, joined (to look for content in)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, str):
            found.append(node)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(body)
    return "\n".join(found)


def lifecycle_hits(consumer: Consumer, endpoint: str) -> list[Hit]:
    return [h for h in consumer.delivered(endpoint) if h.type in LIFECYCLE]


def step_until_state(world: World, name: str, consumer: Consumer, harness: Harness) -> None:
    """Play ``name``'s script; after each state move, wait until the relay announced it
    (a snapshot poller could otherwise skip a short wait, which is documented behaviour)."""
    while world.pending[name]:
        what, arg, _ = world.pending[name][0]
        if what == "state":
            # The activity behind a wait or an end is archived before the state is shown:
            # the order the real service commits them in (a later activity is covered by
            # the unit tests: no change set then, and no second announcement).
            def archived() -> bool:
                upstream = {a["name"] for a in world.standin.activities(name)}
                return upstream <= consumer.delivered_activity_names("std")

            wait_until(archived, 20, f"{name}'s activities delivered", harness.diagnostics)
        world.step(name)
        if what == "state":
            count = world.states[name].count(arg)

            def seen(state: str = arg, want: int = count) -> bool:
                return (
                    sum(
                        1
                        for h in consumer.delivered("std")
                        if h.session == name
                        and h.type == "session.state_changed"
                        and h.body is not None
                        and h.body["data"]["session"]["state"] == state
                    )
                    >= want
                )

            wait_until(seen, 20, f"{name} announced as {arg}", harness.diagnostics)


def test_lifecycle_events_formats_filters_signatures_and_rate_limit(
    harness: Harness, free_tcp_port: int
) -> None:
    standin = harness.standin()
    consumer = harness.consumer()
    signing_key, public_key = new_keypair()
    endpoints = []

    def add(name: str, *extra: str, events: Iterable[str] = ("*",), **behaviour: Any) -> None:
        url, secret = consumer.add_endpoint(name, **behaviour)
        if behaviour.get("public_key"):
            secret = signing_key
        endpoints.append(Endpoint(name, url, secret, tuple(events), tuple(extra)))

    add("std")
    add("thin", 'payload = "thin"')
    add("ce", 'format = "cloudevents"')
    for name, fmt in CHAT_FORMATS.items():
        add(name, f'format = "{fmt}"', events=LIFECYCLE)
    add(
        "tpl",
        f"template = {json.dumps(TEMPLATE)}",
        'filter = { "data.session.source" = ["sources/github/acme/*"] }',
        events=("session.action_required",),
    )
    add("v1a", 'signature = "v1a"', events=("session.*",), public_key=public_key)
    add("slow", "rate_limit = 10")

    world = World(standin)
    feedback = world.add("feedback")
    pr = world.add("resumed")
    failing = world.add("fail", source="sources/github/other/repo")
    relay = harness.relay(
        standin, "relay", endpoints=endpoints, listen=f"127.0.0.1:{free_tcp_port}"
    )
    wait_ready(standin, relay)

    # A burst: 30 activities at once, so that deliveries to "slow" queue up behind its limit.
    burst = standin.add_session("burst task")
    for _ in range(30):
        standin.append_activity(burst, "progressUpdated")
    for name in (feedback, pr, failing):
        step_until_state(world, name, consumer, harness)

    def done() -> bool:
        finished = all(
            len([h for h in lifecycle_hits(consumer, "std") if h.session == name]) >= want
            for name, want in ((feedback, 3), (pr, 2), (failing, 1))
        ) and all(len(consumer.delivered(e)) >= 6 for e in CHAT)
        return finished and len(consumer.delivered("slow")) >= len(consumer.delivered("std"))

    def diagnose() -> str:
        counts = {
            "std": [(h.session, h.type) for h in lifecycle_hits(consumer, "std")],
            **{e: len(consumer.delivered(e)) for e in CHAT},
        }
        return f"lifecycle hits: {counts}\nslow: {len(consumer.delivered('slow'))}"

    wait_until(done, 60, "every lifecycle event on every endpoint", diagnose)

    # -- the lifecycle events, standard format ------------------------------------------
    by_session: dict[str, list[dict[str, Any]]] = {}
    for hit in lifecycle_hits(consumer, "std"):
        assert hit.body is not None and hit.session is not None
        by_session.setdefault(hit.session, []).append(hit.body)
    plan_wait, question, done_feedback = by_session[feedback]
    assert plan_wait["type"] == "session.action_required"
    assert plan_wait["data"]["action"] == "approve_plan"
    assert [s["title"] for s in plan_wait["data"]["plan"]["steps"]] == [
        "Read the code",
        "Change it",
    ]
    assert plan_wait["data"]["call"]["path"].endswith(feedback + ":approvePlan")
    assert question["data"]["action"] == "answer"
    assert question["data"]["question"] == "Which branch should I use?"
    assert question["data"]["call"]["path"].endswith(feedback + ":sendMessage")
    assert done_feedback["type"] == "session.completed"
    first_done, second_done = by_session[pr]
    assert first_done["type"] == second_done["type"] == "session.completed"
    outputs = first_done["data"]["outputs"]
    assert outputs["pull_requests"] == [
        {"url": "https://github.example.test/acme/api/pull/7", "title": "Fix it"}
    ]
    assert outputs["change_set"]["files"] == [{"path": "x.py", "added": 1, "removed": 1}]
    assert (outputs["change_set"]["lines_added"], outputs["change_set"]["lines_removed"]) == (1, 1)
    (failed,) = by_session[failing]
    assert failed["type"] == "session.failed" and failed["data"]["reason"] == "The build is broken"
    # Ids: one per wait / completion, derived from the activity behind it (documented).
    activities = {a["name"]: a for a in standin.all_activities().values()}
    ids = {}
    for hit in lifecycle_hits(consumer, "std"):
        assert hit.body is not None
        activity = hit.body["data"]["activity_name"]
        assert activity in activities
        ids[hit.webhook_id] = documented_id(hit.type or "", hit.session or "", activity)
    assert all(got == want for got, want in ids.items())
    assert len({h.webhook_id for h in lifecycle_hits(consumer, "std")}) == 6  # no repeats

    # -- every body sent matches the OpenAPI document the daemon serves ------------------
    document = httpx.get(f"http://127.0.0.1:{free_tcp_port}/openapi.json", timeout=10).json()
    assert document["openapi"].startswith("3.1")
    assert set(document["webhooks"]) >= {*LIFECYCLE, "session.state_changed"}
    for endpoint, choice in (("std", 0), ("thin", 1)):
        hits = consumer.delivered(endpoint)
        assert {h.type for h in hits} >= {*LIFECYCLE, "activity.plan_generated"}
        for hit in hits:
            body_schema = document["webhooks"][hit.type]["post"]["requestBody"]
            ref = body_schema["content"]["application/json"]["schema"]["anyOf"][choice]
            jsonschema.validate(hit.body, {**ref, "components": document["components"]})
    for hit in consumer.delivered("thin"):
        assert hit.body is not None
        assert set(hit.body["data"]["session"]) == {
            "name",
            "id",
            "title",
            "state",
            "url",
            "source",
            "createTime",
            "updateTime",
        }
        assert set(hit.body["data"].get("activity", {})) <= {
            "name",
            "id",
            "createTime",
            "originator",
        }
        assert "plan" not in hit.body["data"] and "artifacts" not in hit.raw.decode()

    # -- CloudEvents, parsed by the SDK --------------------------------------------------
    ce_hits = consumer.delivered("ce")
    assert ce_hits and all(h.verified for h in ce_hits)  # still signed (v1)
    for hit in ce_hits:
        assert hit.headers["content-type"].startswith("application/cloudevents+json")
        event = from_http_event(HTTPMessage(headers=hit.headers, body=hit.raw))
        assert event.get_specversion() == "1.0"
        assert event.get_id() == hit.webhook_id
        assert event.get_type() in {h.type for h in consumer.delivered("std")}
        data = event.get_data()
        assert isinstance(data, dict) and event.get_source() == data["session"]["name"]
        assert event.get_time() is not None
        content = document["webhooks"][event.get_type()]["post"]["requestBody"]["content"]
        schema = content["application/cloudevents+json"]["schema"]
        jsonschema.validate(json.loads(hit.raw), {**schema, "components": document["components"]})

    # -- chat presets: documented shapes, readable content, signed -----------------------
    for name, schema in CHAT.items():
        hits = consumer.delivered(name)
        assert len(hits) == 6 and all(h.verified for h in hits), name
        texts = {}
        for hit in hits:
            assert hit.body is not None
            jsonschema.validate(hit.body, schema)
            texts[hit.webhook_id] = message_text(name, hit.body)
        by_id = {h.webhook_id: h for h in lifecycle_hits(consumer, "std")}
        for webhook_id, text in texts.items():
            original = by_id[webhook_id].body
            assert original is not None
            data = original["data"]
            assert data["session"]["title"] in text, (name, text)
            if data.get("action") == "approve_plan":
                assert "Read the code" in text and "Change it" in text, (name, text)
            if data.get("action") == "answer":
                assert "Which branch should I use?" in text, (name, text)
            if original["type"] == "session.completed" and data["outputs"]["pull_requests"]:
                assert "https://github.example.test/acme/api/pull/7" in text, (name, text)
            if original["type"] == "session.failed":
                assert "The build is broken" in text, (name, text)

    # -- a user template with a filter ---------------------------------------------------
    tpl = consumer.delivered("tpl")
    assert [h.body for h in tpl] == [
        {"kind": "session.action_required", "who": "feedback task", "id": h.webhook_id, "step": s}
        for h, s in zip(tpl, ("Change it", ""), strict=True)
    ]
    # The failing session lives in sources/github/other/repo: filtered out (it never waits).

    # -- v1a: verified by PyNaCl with the public key only --------------------------------
    v1a = consumer.hits("v1a")
    assert v1a and all(h.verified and h.ok for h in v1a), [h.error for h in v1a][:3]
    assert all(h.headers["webhook-signature"].startswith("v1a,") for h in v1a)

    # -- rate limit: every event, in order per session, never above 10/s ----------------
    slow = consumer.delivered("slow")
    expected = [h.webhook_id for h in consumer.delivered("std")]
    assert sorted(h.webhook_id for h in slow) == sorted(expected)
    for name in (feedback, pr, failing, burst):
        std_order = [h.webhook_id for h in consumer.delivered("std") if h.session == name]
        assert [h.webhook_id for h in slow if h.session == name] == std_order
    # The burst queued at once behind the limit: its deliveries START at least 0.1 s apart,
    # so they cannot ARRIVE in less than (n - 1) / 10 s, less what one delivery's latency
    # can shift (1 s of slack). A lower bound on a duration: a loaded machine only makes it
    # longer, and without the limit the burst arrives in a fraction of a second.
    arrivals = sorted(h.arrived for h in slow if h.session == burst)
    assert len(arrivals) >= 31, len(arrivals)
    assert arrivals[-1] - arrivals[0] >= (len(arrivals) - 1) / 10 - 1.0, arrivals
    relay.terminate()


def test_a_template_that_cannot_render_is_a_config_error(harness: Harness, tmp_path: Path) -> None:
    standin = harness.standin()
    config = tmp_path / "bad.toml"
    bad = Endpoint(
        "bad",
        "http://127.0.0.1:9/hook",
        "whsec_" + "A" * 43 + "=",
        extra=(f"template = {json.dumps('{{ data.session.title | nosuchfilter }}')}",),
    )
    config.write_text(relay_config(standin=standin, store=tmp_path / "x.db", endpoints=[bad]))
    env = {"SESSIONHOOK_API_KEY": standin.api_key, "PATH": str(Path(sys.executable).parent)}
    run = sessionhook("run", "--config", str(config), "--once", env=env)
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "endpoints[0]" in lines[0] and "nosuchfilter" in lines[0], lines
