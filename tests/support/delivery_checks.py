"""Checks of what a verifying consumer received from the real daemon, against the
:class:`~tests.support.world.World` the test played: every activity delivered, signed,
with the documented ids, bodies and session summaries, in order per session; and the
session events (discovered, state changes, pull requests)."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from tests.support.blackbox_consumer import Consumer, Hit
from tests.support.relay_process import Harness, outbox_empty, wait_until
from tests.support.standin import StandIn, parse_time
from tests.support.world import World

#: Event member -> webhook event type (docs/events.md, event types).
MEMBER_TYPES = {
    "planGenerated": "activity.plan_generated",
    "planApproved": "activity.plan_approved",
    "userMessaged": "activity.user_messaged",
    "agentMessaged": "activity.agent_messaged",
    "progressUpdated": "activity.progress_updated",
    "sessionCompleted": "activity.session_completed",
    "sessionFailed": "activity.session_failed",
}
SESSION_TYPES = {"session.discovered", "session.state_changed", "session.pull_request_opened"}


def expected_type(activity: dict[str, Any]) -> str:
    for member, event_type in MEMBER_TYPES.items():
        if member in activity:
            return event_type
    memberless = not any(isinstance(value, dict) for value in activity.values())
    if memberless and activity.get("originator") == "system":
        return "activity.session_started"  # the service's "Session started" notice
    return "activity.unknown"


def documented_id(kind: str, *parts: str) -> str:
    """The event id the design contract documents: evt_ + sha256("kind:part...")[:32]."""
    return "evt_" + hashlib.sha256(":".join((kind, *parts)).encode()).hexdigest()[:32]


def missing_activities(consumer: Consumer, endpoint: str, world: World) -> set[str]:
    return world.activity_names() - consumer.delivered_activity_names(endpoint)


def wait_all_delivered(
    consumer: Consumer, endpoints: Iterable[str], world: World, harness: Harness, timeout: float
) -> float:
    names = list(endpoints)

    def done() -> bool:
        return all(not missing_activities(consumer, e, world) for e in names)

    def diagnose() -> str:
        lines = [f"{e}: {len(missing_activities(consumer, e, world))} missing" for e in names]
        lines.append(f"stand-in requests: {dict(world.standin.counts())}")
        lines.append(f"stand-in statuses: {dict(world.standin.statuses())}")
        return "\n".join(lines) + "\n" + harness.diagnostics()

    return wait_until(done, timeout, "every activity to be delivered", diagnose)


def wait_settled(consumer: Consumer, endpoint: str, world: World, harness: Harness) -> None:
    """Until the final state and every pull request of every session were announced and
    every event id the endpoint has seen was eventually acknowledged (nothing left in a
    retry). A session discovered only after its script ended announces its pull request
    after all its activities: that is the last thing to wait for."""

    def settled() -> bool:
        hits = consumer.hits(endpoint)
        announced: dict[str, str] = {}
        prs: set[tuple[str, str]] = set()
        for h in hits:
            if h.ok and h.type in ("session.discovered", "session.state_changed"):
                assert h.session is not None and h.body is not None
                announced[h.session] = h.body["data"]["session"]["state"]
            if h.ok and h.type == "session.pull_request_opened" and h.body is not None:
                prs.add((str(h.session), h.body["data"]["pull_request"]["url"]))
        final = all(announced.get(name) == history[-1] for name, history in world.states.items())
        opened = {(name, url) for name, urls in world.prs.items() for url in urls} <= prs
        acked = {h.webhook_id for h in hits} == {h.webhook_id for h in hits if h.ok}
        # An event the relay queued but has not tried yet (a lifecycle event that follows
        # the final state, say) is invisible to the consumer: ask the relay's outbox too.
        return final and opened and acked and outbox_empty(harness.relays[-1], endpoint)

    wait_until(settled, 20, f"{endpoint} to settle", harness.diagnostics)


def settled_hits(
    consumer: Consumer, endpoint: str, world: World, harness: Harness, timeout: float = 30
) -> dict[str, Hit]:
    """The hits of ``endpoint`` by webhook id, once every activity was delivered there and
    it settled (session events may still follow the last activity: :func:`wait_settled`)."""
    wait_all_delivered(consumer, [endpoint], world, harness, timeout=timeout)
    wait_settled(consumer, endpoint, world, harness)
    return {h.webhook_id: h for h in consumer.hits(endpoint)}


def assert_all_verified(hits: list[Hit]) -> None:
    assert hits, "the consumer received nothing"
    bad = [(h.endpoint, h.webhook_id, h.error) for h in hits if not h.verified]
    assert not bad, f"requests failing Standard Webhooks verification: {bad[:5]}"
    for h in hits:
        assert h.headers.get("content-type", "").startswith("application/json"), h.headers
        assert h.headers.get("user-agent", "").startswith("sessionhook/"), h.headers
        assert h.webhook_id.startswith("evt_"), h.webhook_id
        assert h.webhook_timestamp.isdigit(), h.webhook_timestamp
        assert h.body is not None and set(h.body) >= {"type", "timestamp", "data"}, h.raw[:200]


def assert_stable_ids(hits: list[Hit], activities: dict[str, dict[str, Any]]) -> dict[str, str]:
    """One webhook-id per activity (the documented derivation), one activity per id,
    and identical bytes on every attempt of one id. Returns activity name -> id."""
    ids: dict[str, set[str]] = defaultdict(set)
    bodies: dict[str, set[bytes]] = defaultdict(set)
    owner: dict[str, set[str]] = defaultdict(set)
    for h in hits:
        bodies[h.webhook_id].add(h.raw)
        name = h.activity_name
        if name is not None:
            ids[name].add(h.webhook_id)
            owner[h.webhook_id].add(name)
    for name, seen in ids.items():
        assert name in activities, f"an event for an activity that does not exist: {name}"
        assert seen == {documented_id("activity", name)}, (name, seen)
    for webhook_id, names in owner.items():
        assert len(names) == 1, f"{webhook_id} carried several activities: {names}"
    for webhook_id, variants in bodies.items():
        assert len(variants) == 1, f"{webhook_id} was sent with {len(variants)} different bodies"
    return {name: next(iter(seen)) for name, seen in ids.items()}


def assert_activity_bodies(hits: list[Hit], standin: StandIn) -> None:
    """Type, timestamp, the upstream activity whole, and the session summary."""
    activities = standin.all_activities()
    for h in hits:
        name = h.activity_name
        if name is None:
            continue
        upstream = activities[name]
        assert h.type == expected_type(upstream), (h.type, upstream)
        assert h.body is not None
        assert h.body["timestamp"] == upstream["createTime"]
        assert h.activity == upstream, f"the activity is not forwarded whole: {h.activity}"
        session_name = name.rsplit("/activities/", 1)[0]
        truth = standin.session(session_name)
        summary = h.body["data"]["session"]
        assert summary["name"] == session_name
        assert summary["id"] == truth["id"]
        assert summary["title"] == truth["title"]
        assert summary["url"] == truth["url"]
        assert summary["source"] == truth.get("sourceContext", {}).get("source", "")
        assert "state" in summary


def verified_hits(consumer: Consumer, endpoint: str, world: World) -> list[Hit]:
    """The hits of ``endpoint``, checked: every one verified, one documented id per
    activity with the same bytes on every attempt, each session's activities in order."""
    hits = consumer.hits(endpoint)
    assert_all_verified(hits)
    assert_stable_ids(hits, world.standin.all_activities())
    assert_session_order(hits, world.order())
    return hits


def assert_summaries_complete(hits: list[Hit], standin: StandIn) -> None:
    """Every event's data.session carries the session's url and source."""
    wrong = []
    for h in hits:
        assert h.session is not None and h.body is not None
        truth = standin.session(h.session)
        summary = h.body["data"]["session"]
        expected = (truth["url"], truth.get("sourceContext", {}).get("source", ""))
        if (summary.get("url"), summary.get("source")) != expected:
            wrong.append((h.type, summary.get("url"), summary.get("source")))
    assert not wrong, f"{len(wrong)} of {len(hits)} events lack url/source: {wrong[:4]}"


def assert_session_order(hits: list[Hit], order: dict[str, list[str]]) -> None:
    """Per session (hits of one endpoint): no activity event is sent before the previous
    activity of the session (in upstream list order) has been acknowledged with a 2xx."""
    position = {name: (s, i) for s, names in order.items() for i, name in enumerate(names)}
    first_ack: dict[str, int] = {}
    for h in hits:
        if h.ok and h.activity_name is not None:
            first_ack[h.activity_name] = min(
                first_ack.get(h.activity_name, h.answered_seq), h.answered_seq
            )
    for h in hits:
        if h.activity_name is None:
            continue
        session, index = position[h.activity_name]
        if index == 0:
            continue
        previous = order[session][index - 1]
        acked = first_ack.get(previous)
        assert acked is not None and acked < h.seq, (
            f"{h.endpoint}: {h.activity_name} (#{index} of {session}) was sent before "
            f"{previous} had been delivered"
        )


def assert_session_events(
    consumer: Consumer, endpoint: str, world: World, *, state_changes: bool = True
) -> None:
    """session.discovered once per session; state changes chained up to the final state;
    each pull request announced."""
    by_session: dict[str, list[Hit]] = defaultdict(list)
    seen: set[str] = set()
    for h in consumer.delivered(endpoint):
        if h.webhook_id in seen:
            continue  # a re-delivery (at least once)
        seen.add(h.webhook_id)
        if h.type in SESSION_TYPES:
            assert h.session is not None and h.body is not None
            parse_time(h.body["timestamp"])  # an RFC 3339 upstream time
            by_session[h.session].append(h)
    for name, history in world.states.items():
        hits = by_session[name]
        discovered = [h for h in hits if h.type == "session.discovered"]
        assert discovered, f"{endpoint}: no session.discovered for {name}"
        assert {h.webhook_id for h in discovered} == {documented_id("session.discovered", name)}
        assert discovered[0].body is not None
        assert discovered[0].body["data"]["session"]["url"] == world.standin.session(name)["url"]
        if state_changes:
            changes = [h for h in hits if h.type == "session.state_changed"]
            current = discovered[0].body["data"]["session"]["state"]
            seen_states = [current]
            for h in changes:
                assert h.body is not None
                data = h.body["data"]
                assert data["previous_state"] == current, (name, data["previous_state"], current)
                current = data["session"]["state"]
                assert current != data["previous_state"]
                seen_states.append(current)
            assert current == history[-1], f"{name}: last announced {current}, is {history[-1]}"
            assert is_subsequence(seen_states, history), (seen_states, history)
        opened = {
            h.body["data"]["pull_request"]["url"]
            for h in hits
            if h.type == "session.pull_request_opened" and h.body is not None
        }
        assert opened == set(world.prs[name]), (name, opened, world.prs[name])


def is_subsequence(items: list[str], sequence: list[str]) -> bool:
    it = iter(sequence)
    return all(any(x == y for y in it) for x in items)
