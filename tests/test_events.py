"""Events: ids, types, bodies, media trimming, glob matching (pure)."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionhook.api.models import Activity, PullRequest, Session, _parse_general, parse_timestamp
from sessionhook.relay.domain.events import (
    EVENT_TYPES,
    activity_event,
    activity_event_type,
    archived_page,
    event_id,
    make_event,
    matches,
    pull_request_opened,
    session_discovered,
    session_state_changed,
    session_summary,
    webhook_timestamp,
    with_account,
)
from sessionhook.relay.domain.samples import sample_events

pytestmark = pytest.mark.unit

SESSION_JSON: dict[str, Any] = {
    "name": "sessions/12345678901234567890",
    "id": "12345678901234567890",
    "title": "Fix the flaky test",
    "prompt": "Please fix the flaky test",
    "state": "IN_PROGRESS",
    "url": "https://agent.example.com/session/12345678901234567890",
    "createTime": "2025-03-01T10:00:00.000001Z",
    "updateTime": "2025-03-01T10:05:00.123456Z",
    "sourceContext": {
        "source": "sources/github/acme/widgets",
        "hostRepoContext": {"startingBranch": "main"},
    },
    "archived": False,
}
ACT_NAME = "sessions/12345678901234567890/activities/" + "a" * 32


def make_session(**overrides: Any) -> Session:
    return Session.model_validate({**SESSION_JSON, **overrides})


def make_activity(member: dict[str, Any] | None = None, **fields: Any) -> Activity:
    raw: dict[str, Any] = {
        "name": ACT_NAME,
        "id": "a" * 32,
        "originator": "agent",
        "description": "Working",
        "createTime": "2025-03-01T10:04:00.654321Z",
        **(member or {}),
        **fields,
    }
    return Activity.model_validate(raw)


def sha_id(text: str) -> str:
    return "evt_" + hashlib.sha256(text.encode()).hexdigest()[:32]


def test_event_ids_follow_the_design_doc() -> None:
    session = make_session()
    activity = make_activity({"agentMessaged": {"agentMessage": "hi"}})
    pr = PullRequest(url="https://github.com/acme/widgets/pull/7", title="Fix")
    assert activity_event(session, activity, max_media_bytes=10).id == sha_id(
        "activity:" + ACT_NAME
    )
    assert session_discovered(session).id == sha_id("session.discovered:" + session.name)
    assert session_state_changed(session, "PLANNING").id == sha_id(
        f"session.state_changed:{session.name}:2025-03-01T10:05:00.123456Z:IN_PROGRESS"
    )
    assert pull_request_opened(session, pr).id == sha_id(
        f"session.pull_request_opened:{session.name}:{pr.url}"
    )
    assert event_id("activity", ACT_NAME) == sha_id("activity:" + ACT_NAME)
    assert len(event_id("x")) == 4 + 32


def test_activity_event_id_depends_only_on_the_name() -> None:
    # Same activity re-read with a later session state: same id (stable webhook-id).
    a1 = activity_event(make_session(), make_activity(), max_media_bytes=10)
    a2 = activity_event(make_session(state="COMPLETED"), make_activity(), max_media_bytes=10)
    assert a1.id == a2.id
    assert a1.body != a2.body


@pytest.mark.parametrize(
    ("member", "expected"),
    [
        ({"planGenerated": {"plan": {"id": "p", "steps": [{"title": "a"}]}}}, "plan_generated"),
        ({"planApproved": {"planId": "p"}}, "plan_approved"),
        ({"userMessaged": {"userMessage": "go"}}, "user_messaged"),
        ({"agentMessaged": {"agentMessage": "ok"}}, "agent_messaged"),
        ({"progressUpdated": {"title": "step"}}, "progress_updated"),
        ({"sessionCompleted": {}}, "session_completed"),
        ({"sessionFailed": {"reason": "boom"}}, "session_failed"),
        ({}, "unknown"),
        ({"somethingNew": {"x": 1}}, "unknown"),
    ],
)
def test_activity_event_types(member: dict[str, Any], expected: str) -> None:
    activity = make_activity(member)
    assert activity_event_type(activity) == f"activity.{expected}"
    event = activity_event(make_session(), activity, max_media_bytes=100)
    assert event.type == f"activity.{expected}"
    assert event.type in EVENT_TYPES


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # The emulator's and the service's first activity of every session.
        ({"originator": "system", "description": "Session started"}, "session_started"),
        ({"originator": "system"}, "session_started"),
        # A member from the future stays unknown, whoever sends it.
        ({"originator": "system", "somethingNew": {"x": 1}}, "unknown"),
        # No member, but not the system's: nothing says what it is.
        ({"originator": "agent"}, "unknown"),
        ({"originator": ""}, "unknown"),
    ],
)
def test_the_memberless_system_notice_has_a_type_of_its_own(
    fields: dict[str, Any], expected: str
) -> None:
    activity = make_activity(None, **fields)
    event = activity_event(make_session(), activity, max_media_bytes=100)
    assert event.type == f"activity.{expected}" and event.type in EVENT_TYPES
    assert matches(["activity.*"], event.type)  # an activity.* endpoint gets it as before


def test_samples_cover_every_event_type_and_the_readme_documents_each() -> None:
    """samples.py (templates are checked against it at start-up) has an event of every
    type, and the event reference (docs/events.md) has one row per type, no more."""
    assert {e.type for e in sample_events()} == set(EVENT_TYPES)
    readme = (Path(__file__).parent.parent / "docs" / "events.md").read_text("utf-8")
    rows = re.findall(r"^\| `((?:activity|session)\.[a-z_]+)` \|", readme, re.MULTILINE)
    assert sorted(rows) == sorted(EVENT_TYPES)


def test_activity_body_shape_and_raw_activity_kept_whole() -> None:
    raw_extra = {"futureField": {"nested": [1, 2]}}
    activity = make_activity({"progressUpdated": {"title": "Ran tests"}}, **raw_extra)
    event = activity_event(make_session(), activity, max_media_bytes=100)
    body = json.loads(event.body)
    assert set(body) == {"type", "timestamp", "data"}
    assert body["type"] == "activity.progress_updated"
    assert body["timestamp"] == "2025-03-01T10:04:00.654321Z"
    assert body["data"]["activity"] == activity.to_wire()
    assert body["data"]["activity"]["futureField"] == {"nested": [1, 2]}
    assert body["data"]["session"]["source"] == "sources/github/acme/widgets"
    assert event.session_name == SESSION_JSON["name"]
    assert event.activity_name == ACT_NAME
    assert event.occurred_at == "2025-03-01T10:04:00.654321Z"
    assert event.occurred_ts == parse_timestamp("2025-03-01T10:04:00.654321Z").timestamp()
    assert event.payload() == body


def test_body_is_compact_utf8_and_deterministic() -> None:
    activity = make_activity({"agentMessaged": {"agentMessage": "Grüße ✓"}})
    e1 = activity_event(make_session(), activity, max_media_bytes=100)
    e2 = activity_event(
        make_session(),
        make_activity({"agentMessaged": {"agentMessage": "Grüße ✓"}}),
        max_media_bytes=100,
    )
    assert e1 == e2
    assert b", " not in e1.body and b'": ' not in e1.body
    assert "Grüße ✓".encode() in e1.body


def test_session_summary_fields() -> None:
    summary = session_summary(make_session())
    assert summary == {
        "name": SESSION_JSON["name"],
        "id": SESSION_JSON["id"],
        "title": "Fix the flaky test",
        "state": "IN_PROGRESS",
        "url": SESSION_JSON["url"],
        "source": "sources/github/acme/widgets",
        "createTime": SESSION_JSON["createTime"],
        "updateTime": SESSION_JSON["updateTime"],
        "prompt": "Please fix the flaky test",
    }


def test_session_summary_of_a_repoless_list_item() -> None:
    session = Session.model_validate({"name": "sessions/42", "state": "QUEUED"})
    summary = session_summary(session)
    assert summary["source"] == ""
    assert summary["id"] == "42"
    assert {"name", "id", "title", "state", "url", "source"} <= set(summary)
    assert "prompt" not in summary and "outputs" not in summary


def test_session_summary_outputs() -> None:
    pr = {"pullRequest": {"url": "https://github.com/acme/widgets/pull/7", "title": "Fix"}}
    summary = session_summary(make_session(outputs=[pr]))
    assert summary["outputs"] == [pr]


def test_media_trimming_bounds_the_event_not_the_activity() -> None:
    big = "A" * 101
    small = "B" * 100
    activity = make_activity(
        {"progressUpdated": {"title": "screenshot"}},
        artifacts=[
            {"media": {"mimeType": "image/png", "data": big}},
            {"media": {"mimeType": "image/png", "data": small}},
            {"bashOutput": {"command": "ls", "output": "x" * 500}},
        ],
    )
    event = activity_event(make_session(), activity, max_media_bytes=100)
    artifacts = event.payload()["data"]["activity"]["artifacts"]
    assert artifacts[0]["media"] == {
        "mimeType": "image/png",
        "data": "",
        "trimmed": True,
        "originalSize": 101,
    }
    assert artifacts[1]["media"] == {"mimeType": "image/png", "data": small}
    assert artifacts[2]["bashOutput"]["output"] == "x" * 500
    # The activity itself (what the archive stores) keeps its media whole.
    assert activity.to_wire()["artifacts"][0]["media"]["data"] == big


def test_session_discovered_body() -> None:
    event = session_discovered(make_session())
    body = event.payload()
    assert event.type == "session.discovered"
    assert event.activity_name is None
    assert body["timestamp"] == SESSION_JSON["createTime"]
    assert body["data"] == {"session": session_summary(make_session())}


def test_state_changed_body_and_id_varies_with_state_and_time() -> None:
    session = make_session(state="COMPLETED")
    event = session_state_changed(session, "IN_PROGRESS")
    assert event.payload()["data"]["previous_state"] == "IN_PROGRESS"
    assert event.payload()["data"]["session"]["state"] == "COMPLETED"
    # COMPLETED -> resumed -> COMPLETED again later is a second, distinct event.
    later = make_session(state="COMPLETED", updateTime="2025-03-02T00:00:00Z")
    assert session_state_changed(later, "IN_PROGRESS").id != event.id


def test_pull_request_opened_body() -> None:
    pr = PullRequest.model_validate(
        {"url": "https://github.com/acme/widgets/pull/7", "title": "Fix", "headRef": "fix"}
    )
    event = pull_request_opened(make_session(), pr)
    assert event.type == "session.pull_request_opened"
    assert event.payload()["data"]["pull_request"] == {
        "url": "https://github.com/acme/widgets/pull/7",
        "title": "Fix",
        "headRef": "fix",
    }


def test_missing_upstream_time_falls_back_to_injected_clock() -> None:
    activity = Activity.model_validate({"name": ACT_NAME, "sessionCompleted": {}})
    event = activity_event(make_session(), activity, max_media_bytes=0, now=1_700_000_000.5)
    assert event.occurred_at == "2023-11-14T22:13:20.500000Z"
    assert event.occurred_ts == 1_700_000_000.5
    session = Session.model_validate({"name": "sessions/1"})
    assert session_discovered(session, now=0).occurred_at == "1970-01-01T00:00:00.000000Z"


def test_upstream_time_wins_over_the_clock() -> None:
    event = session_discovered(make_session(), now=0)
    assert event.occurred_at == SESSION_JSON["createTime"]


@pytest.mark.parametrize(
    ("globs", "event_type", "expected"),
    [
        (["*"], "activity.plan_generated", True),
        (["activity.*"], "activity.plan_generated", True),
        (["activity.*"], "session.discovered", False),
        (["session.state_changed", "activity.session_*"], "activity.session_failed", True),
        (["Activity.*"], "activity.plan_generated", False),
        ([], "activity.plan_generated", False),
        (["activity.plan_?????????"], "activity.plan_generated", True),
    ],
)
def test_matches(globs: list[str], event_type: str, expected: bool) -> None:
    assert matches(globs, event_type) is expected


def test_session_summary_keeps_a_change_set_output_without_its_diff() -> None:
    change = {
        "source": "sources/github/acme/widgets",
        "gitPatch": {"baseCommitId": "abc", "unidiffPatch": "+é\n", "suggestedCommitMessage": "m"},
    }
    session = make_session(outputs=[{"changeSet": change}])
    (output,) = session_summary(session)["outputs"]
    assert output == {
        "changeSet": {
            "source": "sources/github/acme/widgets",
            "gitPatch": {
                "baseCommitId": "abc",
                "suggestedCommitMessage": "m",
                "unidiffPatchBytes": 4,
            },
        }
    }
    # The session itself is left whole (the lifecycle summary reads the diff from it).
    assert session.outputs[0].change_set is not None
    assert session.outputs[0].change_set.git_patch is not None
    assert session.outputs[0].change_set.git_patch.unidiff_patch == "+é\n"


def _stamped_the_old_way(event: Any, account: str) -> bytes:
    """What the poller did before: parse the body back, add data.account, dump again."""
    payload = json.loads(event.body)
    payload["data"]["account"] = account
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _event_the_old_way(session: Session, activity: Activity, limit: int, now: float) -> Any:
    """An activity event as it was made before bodies were joined from parts: the whole
    body through make_event (one ``json.dumps``), media trimmed in a fresh ``to_wire()``."""
    wire = activity.to_wire()
    for artifact in wire.get("artifacts") or ():
        media = artifact.get("media") if isinstance(artifact, dict) else None
        if isinstance(media, dict):
            size = len(str(media.get("data", "")).encode("utf-8"))
            if size > limit:
                media.update(data="", trimmed=True, originalSize=size)
    return make_event(
        event_id("activity", activity.name),
        activity_event_type(activity),
        session.name,
        activity.name,
        webhook_timestamp(activity.create_time, now),
        {"session": session_summary(session), "activity": wire},
    )


@pytest.mark.parametrize("account", ["default", 'work \u00e9\u00e8 "quoted" \u2603'])
def test_page_of_events_is_byte_identical_to_one_by_one(account: str) -> None:
    """archived_page joins each body from serialized parts (the session summary once
    per page, the activity's raw JSON as data.activity): the bytes must be exactly
    make_event's, account added as before; the raw JSON is the archive's, untrimmed."""
    session = make_session(title='Unicode \u00fc \u4e2d and "quotes" \\ and \n newline')
    page = [
        make_activity({"progressUpdated": {"title": "step \u2603", "description": "x\ty"}}),
        make_activity(
            {"agentMessaged": {"agentMessage": "big numbers"}},
            name=ACT_NAME[:-1] + "b",
            extra={"f": 1.5e300, "i": 10**20, "n": None, "l": [1, "2", {"3": []}]},
        ),
        make_activity(
            {"progressUpdated": {"title": "media"}},
            name=ACT_NAME[:-1] + "c",
            artifacts=[
                {"media": {"mimeType": "image/png", "data": "A" * 50}},
                {"media": {"mimeType": "image/png", "data": "B" * 5}},
            ],
        ),
        make_activity(name=ACT_NAME[:-1] + "d", createTime="garbage"),  # no member, no time
        make_activity(name=ACT_NAME[:-1] + "e", createTime="2025-03-01 10:04:00"),
        make_activity(name=ACT_NAME[:-1] + "f", createTime="2025-03-01T12:04:00.123456789+02:00"),
        make_activity(name=ACT_NAME[:-1] + "g", createTime="2025-03-01T10:04:00Z\n"),
    ]
    old = [_event_the_old_way(session, a, 10, 1_700_000_000) for a in page]
    one_by_one = [activity_event(session, a, max_media_bytes=10, now=1_700_000_000) for a in page]
    joined, _raws = archived_page(session, page, max_media_bytes=10, now=1_700_000_000)
    stamped, raws = archived_page(
        session, page, max_media_bytes=10, now=1_700_000_000, account=account
    )
    for before, single, plain, with_acct in zip(old, one_by_one, joined, stamped, strict=True):
        assert plain == single == before
        assert with_acct.body == _stamped_the_old_way(before, account)
        assert with_account(before, account).body == with_acct.body
        assert with_acct.occurred_ts == before.occurred_ts == plain.occurred_ts
        assert json.loads(with_acct.body)["data"]["account"] == account
    assert raws == [
        json.dumps(a.to_wire(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        for a in page
    ]
    assert b'"data":"' + b"A" * 50 in raws[2]  # the archive keeps the media whole
    assert b"A" * 50 not in stamped[2].body and b"B" * 5 in stamped[2].body


def test_with_account_on_every_kind_of_session_event() -> None:
    session = make_session()
    pr = PullRequest.model_validate({"url": "https://github.com/acme/widgets/pull/1"})
    for event in (
        session_discovered(session),
        session_state_changed(session, "QUEUED"),
        pull_request_opened(session, pr),
    ):
        assert with_account(event, "acct").body == _stamped_the_old_way(event, "acct")


@given(moment=st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.just(UTC)))
def test_the_services_spelling_parses_as_every_other_spelling(moment: datetime) -> None:
    """``2026-01-02T03:04:05.123456Z`` (several per archived activity) is read directly:
    the same instant, the same aware UTC value as the general way."""
    text = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    parsed = parse_timestamp(text)
    assert parsed == _parse_general(text) == moment
    assert parsed.utcoffset() is not None and parsed.utcoffset().total_seconds() == 0


@pytest.mark.parametrize(
    "text",
    [
        "2025-13-01T10:04:00.654321Z",
        "2025-02-30T10:04:00.654321Z",
        "2025-02-01T24:04:00.654321Z",
        "\uff12025-02-01T10:04:00.654321Z",
        "2025-02-01T10:04:00.654321Z\n",
        " 2025-02-01T10:04:00.65432Z",
        "2025-02-01t10:04:00.654321z",
    ],
)
def test_odd_texts_of_that_shape_parse_or_fail_as_before(text: str) -> None:
    try:
        expected: datetime | str = _parse_general(text)
    except ValueError as exc:
        expected = str(exc)
    try:
        got: datetime | str = parse_timestamp(text)
    except ValueError as exc:
        got = str(exc)
    assert got == expected
