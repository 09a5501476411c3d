"""Issue 11, pure parts: lifecycle events, change set summaries, payload filters, rendering
(thin, CloudEvents, chat presets, user templates), v1a signatures, endpoint config."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey, VerifyKey
from pydantic import SecretStr

from sessionhook.api.models import Activity, Session
from sessionhook.relay.config import ConfigError, EndpointConfig, load_config
from sessionhook.relay.domain import lifecycle, render
from sessionhook.relay.domain.contract import openapi_document, shipped_document
from sessionhook.relay.domain.events import EVENT_TYPES, payload_matches
from sessionhook.relay.domain.samples import sample_events
from sessionhook.relay.domain.signing import (
    SignatureError,
    generate_keypair,
    generate_secret,
    public_key_of,
    signature_header,
    verify,
)

pytestmark = pytest.mark.unit

NAME = "sessions/12345678901234567890"


def session(state: str, **extra: Any) -> Session:
    return Session.model_validate(
        {
            "name": NAME,
            "id": NAME.split("/")[1],
            "title": "Fix it",
            "state": state,
            "url": "https://agent.example.com/s/1",
            "createTime": "2025-03-01T10:00:00Z",
            "updateTime": "2025-03-01T10:05:00Z",
            **extra,
        }
    )


def activity(member: str, payload: dict[str, Any], n: int = 1, **extra: Any) -> Activity:
    return Activity.model_validate(
        {
            "name": f"{NAME}/activities/{n:032x}",
            "id": f"{n:032x}",
            "createTime": f"2025-03-01T10:0{n}:00Z",
            member: payload,
            **extra,
        }
    )


def sha_id(*parts: str) -> str:
    return "evt_" + hashlib.sha256(":".join(parts).encode()).hexdigest()[:32]


PLAN = {"plan": {"id": "p1", "steps": [{"id": "s0", "title": "Look"}, {"id": "s1", "index": 1}]}}


# --------------------------------------------------------------------------- lifecycle


def test_plan_wait_names_the_plan_and_the_call_with_an_id_per_wait() -> None:
    plan = activity("planGenerated", PLAN)
    (event,) = lifecycle.lifecycle_events(session("AWAITING_PLAN_APPROVAL"), plan, entered=True)
    assert event.type == "session.action_required"
    assert event.id == sha_id("session.action_required", NAME, plan.name)
    data = event.payload()["data"]
    assert data["action"] == "approve_plan" and data["activity_name"] == plan.name
    assert [s["id"] for s in data["plan"]["steps"]] == ["s0", "s1"]
    assert data["call"] == {"method": "POST", "path": f"/v1alpha/{NAME}:approvePlan", "body": {}}
    assert event.payload()["timestamp"] == plan.create_time
    # The same wait seen again (a later refresh): nothing new, or the same id.
    again = lifecycle.lifecycle_events(
        session("AWAITING_PLAN_APPROVAL"), plan, entered=False, seen_until="2025-03-01T10:05:00Z"
    )
    assert again == []
    assert lifecycle.lifecycle_events(session("AWAITING_PLAN_APPROVAL"), plan, entered=True) == [
        event
    ]


def test_question_carries_the_agent_message_and_a_new_question_is_a_new_wait() -> None:
    first = activity("agentMessaged", {"agentMessage": "Which branch?"}, 1)
    (event,) = lifecycle.lifecycle_events(session("AWAITING_USER_FEEDBACK"), first, entered=True)
    data = event.payload()["data"]
    assert data["action"] == "answer" and data["question"] == "Which branch?"
    assert data["call"]["path"] == f"/v1alpha/{NAME}:sendMessage"
    # Answered and asked again between two polls: the state looks unchanged, the question
    # is newer than the copy seen before: announced, with its own id.
    second = activity("agentMessaged", {"agentMessage": "And the tag?"}, 7)
    (later,) = lifecycle.lifecycle_events(
        session("AWAITING_USER_FEEDBACK"), second, entered=False, seen_until="2025-03-01T10:05:00Z"
    )
    assert later.id != event.id and later.payload()["data"]["question"] == "And the tag?"


def test_a_late_activity_does_not_announce_a_wait_twice() -> None:
    waiting = session("COMPLETED")
    (first,) = lifecycle.lifecycle_events(waiting, None, entered=True)
    assert first.id == sha_id("session.completed", NAME, "state:2025-03-01T10:05:00Z")
    late = activity("sessionCompleted", {}, 4)  # created before the state the relay saw
    assert (
        lifecycle.lifecycle_events(waiting, late, entered=False, seen_until="2025-03-01T10:05:00Z")
        == []
    )
    assert lifecycle.lifecycle_events(waiting, None, entered=False) == []


def test_completion_sums_up_outputs_and_a_resumed_session_completes_again() -> None:
    patch = (
        "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1,3 +1,3 @@\n keep\n"
        "--- not a header\n+new\n more\n"
        "diff --git a/b.py b/b.py\nnew file mode 100644\n--- /dev/null\n+++ b/b.py\n"
        "@@ -0,0 +1,2 @@\n+x\n+y\n"
    )
    change = {"source": "sources/github/a/b", "gitPatch": {"unidiffPatch": patch}}
    done = session(
        "COMPLETED",
        outputs=[{"pullRequest": {"url": "https://gh/pr/1", "title": "PR"}}, {"changeSet": change}],
    )
    one = activity("sessionCompleted", {}, 1)
    (event,) = lifecycle.lifecycle_events(done, one, entered=True)
    outputs = event.payload()["data"]["outputs"]
    assert outputs["pull_requests"] == [{"url": "https://gh/pr/1", "title": "PR"}]
    summary = outputs["change_set"]
    assert summary["files"] == [
        {"path": "a.py", "added": 1, "removed": 1},
        {"path": "b.py", "added": 2, "removed": 0},
    ]
    assert (summary["files_changed"], summary["lines_added"], summary["lines_removed"]) == (2, 3, 1)
    # No change set output: the one riding on the sessionCompleted activity.
    two = activity("sessionCompleted", {}, 8, artifacts=[{"changeSet": change}])
    (again,) = lifecycle.lifecycle_events(
        session("COMPLETED"), two, entered=False, seen_until="2025-03-01T10:05:00Z"
    )
    assert again.id != event.id
    assert again.payload()["data"]["outputs"]["change_set"]["lines_added"] == 3
    assert again.payload()["data"]["outputs"]["pull_requests"] == []


def test_failure_carries_the_reason_and_other_states_give_nothing() -> None:
    failed = activity("sessionFailed", {"reason": "Broken build"})
    (event,) = lifecycle.lifecycle_events(session("FAILED"), failed, entered=True)
    assert event.type == "session.failed" and event.payload()["data"]["reason"] == "Broken build"
    for state in ("QUEUED", "PLANNING", "IN_PROGRESS", "PAUSED", "SOMETHING_NEW"):
        assert lifecycle.awaited_member(state) is None
        assert lifecycle.lifecycle_events(session(state), None, entered=True) == []
    with pytest.raises(ValueError):
        lifecycle.lifecycle_events(session("FAILED"), activity("planGenerated", PLAN), entered=True)


# --------------------------------------------------------------------------- filters


def test_payload_filters_walk_dotted_paths_and_every_condition_must_match() -> None:
    payload = {
        "data": {
            "session": {"source": "sources/github/acme/api", "state": "AWAITING_PLAN_APPROVAL"},
            "plan": {"steps": [{"title": "a"}, {"title": "b"}]},
            "count": 3,
            "flag": True,
        }
    }
    assert payload_matches({}, payload)
    assert payload_matches({"data.session.source": ["sources/github/acme/*"]}, payload)
    assert payload_matches(
        {"data.session.source": ["x", "*acme*"], "data.session.state": ["AWAITING_*"]}, payload
    )
    assert not payload_matches(
        {"data.session.source": ["*acme*"], "data.session.state": ["COMPLETED"]}, payload
    )
    assert payload_matches({"data.plan.steps.title": ["b"]}, payload)  # lists fan out
    assert payload_matches({"data.plan.steps.1.title": ["b"]}, payload)
    assert not payload_matches({"data.plan.steps.0.title": ["b"]}, payload)
    assert payload_matches({"data.count": ["3"], "data.flag": ["true"]}, payload)
    assert not payload_matches({"data.missing": ["*"]}, payload)
    assert not payload_matches({"data.session": ["*"]}, payload)  # an object is no value


# --------------------------------------------------------------------------- rendering


def test_standard_full_is_the_stored_body_untouched() -> None:
    event = sample_events()[0]
    assert render.render(event.id, event.body, render.Shape()) == (event.body, "application/json")


def test_thin_keeps_ids_and_summary_only() -> None:
    for event in sample_events():
        body, _ = render.render(event.id, event.body, render.Shape(payload="thin"))
        thin = json.loads(body)
        assert thin["type"] == event.type
        assert "prompt" not in thin["data"]["session"] and "outputs" not in thin["data"]["session"]
        assert not {"plan", "question", "outputs", "call"} & set(thin["data"])
        if "activity" in thin["data"]:
            assert set(thin["data"]["activity"]) <= {"name", "id", "createTime", "originator"}


def test_every_preset_renders_every_sample_deterministically() -> None:
    for fmt in render.PRESET_FORMATS:
        for payload in ("full", "thin"):
            shape = render.Shape(payload=payload, format=fmt)
            for event in sample_events():
                first = render.render(event.id, event.body, shape)
                assert first == render.render(event.id, event.body, shape)
                json.loads(first[0])


def test_cloudevents_envelope() -> None:
    event = next(e for e in sample_events() if e.type == "session.completed")
    body, content_type = render.render(event.id, event.body, render.Shape(format="cloudevents"))
    envelope = json.loads(body)
    assert content_type == "application/cloudevents+json; charset=utf-8"
    assert envelope["specversion"] == "1.0" and envelope["id"] == event.id
    assert envelope["source"] == event.session_name and envelope["type"] == event.type
    assert envelope["data"] == event.payload()["data"]


def test_slack_escapes_what_mrkdwn_would_read_as_markup() -> None:
    event = next(e for e in sample_events() if e.type == "session.failed")
    body = json.loads(event.body)
    body["data"]["session"]["title"] = "<!channel> & <b>"
    raw = json.dumps(body).encode()
    text = render.render(event.id, raw, render.Shape(format="slack"))[0].decode()
    assert "<!channel>" not in text and "&lt;!channel&gt; &amp; &lt;b&gt;" in text


def test_user_template_is_sandboxed_and_its_errors_are_render_errors() -> None:
    event = sample_events()[0]
    shape = render.Shape(template='{"t": {{ type | tojson }}, "id": {{ webhook_id | tojson }}}')
    assert json.loads(render.render(event.id, event.body, shape)[0]) == {
        "t": event.type,
        "id": event.id,
    }
    plain = render.Shape(template="{{ session.title }}!", content_type="text/plain")
    assert render.render(event.id, event.body, plain)[0] == b"Fix the flaky login test!"
    for bad in (
        "{{ ''.__class__.__mro__ }}",  # the sandbox refuses unsafe attributes
        "{{ x | nosuchfilter }}",
        "{% if %}",
        "not json",
    ):
        with pytest.raises(render.RenderError):
            render.check_shape(render.Shape(template=bad), [(event.id, event.body)])


# --------------------------------------------------------------------------- contract


def test_shipped_openapi_document_is_the_generated_one() -> None:
    assert shipped_document() == openapi_document(), (
        "regenerate src/sessionhook/relay/domain/openapi.json from contract.openapi_document()"
    )
    assert set(openapi_document()["webhooks"]) == set(EVENT_TYPES)


# --------------------------------------------------------------------------- v1a


def test_v1a_signature_verifies_with_pynacl_and_our_verify() -> None:
    signing_key, public_key = generate_keypair()
    assert public_key_of(signing_key) == public_key
    header = signature_header([signing_key], "msg_1", 1700000000, b'{"a":1}')
    version, _, encoded = header.partition(",")
    assert version == "v1a"
    raw_public = base64.b64decode(public_key.removeprefix("whpk_"))
    VerifyKey(raw_public).verify(b'msg_1.1700000000.{"a":1}', base64.b64decode(encoded))
    headers = {"webhook-id": "msg_1", "webhook-timestamp": "1700000000"}
    verify(public_key, {**headers, "webhook-signature": header}, b'{"a":1}', now=1700000000)
    with pytest.raises(SignatureError):
        verify(public_key, {**headers, "webhook-signature": header}, b'{"a":2}', now=1700000000)


def test_a_libsodium_key_signs_and_a_mismatched_half_is_refused() -> None:
    nacl_key = SigningKey.generate()
    whsk = "whsk_" + base64.b64encode(bytes(nacl_key) + bytes(nacl_key.verify_key)).decode()
    header = signature_header([whsk], "m", 5, b"x")
    nacl_key.verify_key.verify(b"m.5.x", base64.b64decode(header.partition(",")[2]))
    other = SigningKey.generate()
    broken = "whsk_" + base64.b64encode(bytes(nacl_key) + bytes(other.verify_key)).decode()
    with pytest.raises(ValueError):
        public_key_of(broken)


# --------------------------------------------------------------------------- config


def endpoint(**fields: Any) -> EndpointConfig:
    fields.setdefault("secret", SecretStr(generate_secret()))
    return EndpointConfig(name="e", url="https://h.example/x", **fields)


def test_endpoint_shapes_and_their_errors(tmp_path: Path) -> None:
    assert endpoint(format="slack", payload="thin").shape == render.Shape("thin", "slack")
    signing_key, _ = generate_keypair()
    assert endpoint(signature="v1a", secret=SecretStr(signing_key)).signature == "v1a"

    def load(extra: str) -> ConfigError:
        path = tmp_path / "c.toml"
        path.write_text(
            '[api]\nbase_url = "http://127.0.0.1:1"\n[[endpoints]]\nname = "e"\n'
            f'url = "https://h.example/x"\nsecret = "{generate_secret()}"\n{extra}\n'
        )
        with pytest.raises(ConfigError) as caught:
            load_config(path, env={"SESSIONHOOK_API_KEY": "k"})
        return caught.value

    assert "nosuchfilter" in str(load('template = "{{ x | nosuchfilter }}"'))
    assert "not both" in str(load('template = "{}"\nformat = "slack"'))
    assert "v1a" in str(load('signature = "v1a"'))
    assert load('format = "html"').key == "endpoints[0].format"
    assert load("rate_limit = 0").key == "endpoints[0].rate_limit"
    assert "dotted path" in str(load('filter = { "data..x" = ["*"] }'))
    assert "template" in str(load('template = "not json at all"'))


def test_secret_generate_asymmetric_prints_a_usable_pair() -> None:
    from click.testing import CliRunner

    from sessionhook.cli import cli

    result = CliRunner().invoke(cli, ["secret", "generate", "--asymmetric"])
    assert result.exit_code == 0, result.output
    signing_key = result.stdout.strip()
    assert signing_key.startswith("whsk_") and "\n" not in signing_key
    public_key = result.stderr.strip().rpartition(" ")[2]
    assert public_key == public_key_of(signing_key) and public_key.startswith("whpk_")
    header = signature_header([signing_key], "m", 7, b"{}")
    verify(
        public_key,
        {"webhook-id": "m", "webhook-timestamp": "7", "webhook-signature": header},
        b"{}",
        now=7,
    )
