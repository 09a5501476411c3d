"""SessionsClient against the emulator, in process through httpx.ASGITransport.

Every endpoint and every error status the emulator produces, end to end through the real
client and the real app. The emulator's clock is a fake one the tests move forward, so the
scripted agent is deterministic and nothing sleeps; the client's ``sleep`` only records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette

from sessionhook.api import (
    Activity,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    RetryPolicy,
    ServerError,
    SessionsClient,
    UnauthenticatedError,
)
from sessionhook.api.models import parse_timestamp
from sessionhook.emulator.app import create_app
from tests.support.clock import Clock

pytestmark = [pytest.mark.app, pytest.mark.anyio]

KEY = "test-key"
SECOND_KEY = "test-key-2"  # a second key of the same account
OTHER_KEY = "other-key"  # another account
BASE = "http://emulator.test"
START = 1_750_000_000.0
STEP = 1.0
# Long enough for any script (start, plan, approval, up to 4 steps, PR, completion).
WHOLE_RUN = 60.0
NO_JITTER = RetryPolicy(jitter=0.0)


class CountingTransport(httpx.AsyncBaseTransport):
    """Passes requests to the app and remembers them (to count retries)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return await self.inner.handle_async_request(request)


@dataclass
class Emulator:
    app: Starlette
    clock: Clock
    transport: CountingTransport
    sleeps: list[float] = field(default_factory=list)

    @asynccontextmanager
    async def client(
        self,
        key: str = KEY,
        *,
        headers: dict[str, str] | None = None,
        retry: RetryPolicy = NO_JITTER,
    ) -> AsyncIterator[SessionsClient]:
        async def fake_sleep(seconds: float) -> None:
            self.sleeps.append(seconds)

        async with httpx.AsyncClient(transport=self.transport, headers=headers) as http:
            yield SessionsClient(http, base_url=BASE, api_key=key, retry=retry, sleep=fake_sleep)


def make_emulator(**kwargs: Any) -> Emulator:
    clock = Clock(START)
    kwargs.setdefault("api_keys", ((KEY, SECOND_KEY), OTHER_KEY))
    app = create_app(step_delay=STEP, seed=1234, clock=clock, **kwargs)
    return Emulator(app, clock, CountingTransport(httpx.ASGITransport(app=app)))


@pytest.fixture
def emu() -> Emulator:
    return make_emulator()


async def all_activities(client: SessionsClient, session: str) -> list[Activity]:
    return [a async for a in client.iter_activities(session)]


# --------------------------------------------------------------------------- sessions


async def test_create_get_list_a_repository_session(emu: Emulator) -> None:
    async with emu.client() as client:
        created = await client.create_session(
            "Add a greeting helper",
            title="Greeting",
            source="github/acme/webapp",
            starting_branch="develop",
        )
        assert created.state == "QUEUED"
        assert created.name == f"sessions/{created.id}"
        assert created.title == "Greeting"
        got = await client.get_session(created.id)
        listed = await client.list_sessions()
    assert got.prompt == "Add a greeting helper"
    assert got.url
    assert got.source_context is not None
    assert got.source_context.source == "sources/github/acme/webapp"
    assert got.source_context.host_repo_context is not None
    assert got.source_context.host_repo_context.starting_branch == "develop"
    assert [s.name for s in listed.sessions] == [created.name]
    assert listed.next_page_token == ""


async def test_a_session_runs_to_completion_and_its_activities_read_back(emu: Emulator) -> None:
    async with emu.client() as client:
        created = await client.create_session("Add a slugify function")
        emu.clock.advance(WHOLE_RUN)
        done = await client.get_session(created.name)
        activities = await all_activities(client, created.name)
        fetched = [await client.get_activity(a.name) for a in activities]
        by_parts = await client.get_activity(created.id, activities[-1].id)
    assert done.state == "COMPLETED"
    kinds = [a.event_member for a in activities]
    # "Session started" is a system activity without any event member.
    assert kinds[0] is None
    assert activities[0].originator == "system"
    assert kinds[1:3] == ["planGenerated", "planApproved"]
    assert "progressUpdated" in kinds
    assert kinds[-1] == "sessionCompleted"
    assert [a.to_wire() for a in fetched] == [a.to_wire() for a in activities]
    assert by_parts.name == activities[-1].name
    times = [parse_timestamp(a.create_time) for a in activities]
    assert times == sorted(times)  # oldest first
    assert all(a.session_name == created.name for a in activities)


async def test_plan_approval_flow(emu: Emulator) -> None:
    async with emu.client() as client:
        created = await client.create_session("Refactor the parser", require_plan_approval=True)
        emu.clock.advance(WHOLE_RUN)
        waiting = await client.get_session(created.id)
        assert waiting.state == "AWAITING_PLAN_APPROVAL"
        await client.approve_plan(created.id)
        emu.clock.advance(WHOLE_RUN)
        done = await client.get_session(created.id)
        kinds = [a.event_member for a in await all_activities(client, created.id)]
    assert done.state == "COMPLETED"
    assert kinds.count("planApproved") == 1
    assert kinds.index("planGenerated") < kinds.index("planApproved")


async def test_a_question_waits_for_a_message(emu: Emulator) -> None:
    async with emu.client() as client:
        created = await client.create_session("Tidy the config loader [ask]")
        emu.clock.advance(WHOLE_RUN)
        waiting = await client.get_session(created.id)
        assert waiting.state == "AWAITING_USER_FEEDBACK"
        question = (await all_activities(client, created.id))[-1]
        assert question.agent_messaged is not None
        await client.send_message(created.name, "Raise an error on empty values.")
        emu.clock.advance(WHOLE_RUN)
        done = await client.get_session(created.id)
        activities = await all_activities(client, created.id)
    assert done.state == "COMPLETED"
    messages = [a.user_messaged.user_message for a in activities if a.user_messaged]
    assert messages == ["Raise an error on empty values."]


async def test_a_failing_session_reports_its_reason(emu: Emulator) -> None:
    async with emu.client() as client:
        created = await client.create_session("Upgrade everything [fail]")
        emu.clock.advance(WHOLE_RUN)
        failed = await client.get_session(created.id)
        last = (await all_activities(client, created.id))[-1]
    assert failed.state == "FAILED"
    assert last.session_failed is not None
    assert last.session_failed.reason


async def test_auto_pr_puts_a_pull_request_in_outputs(emu: Emulator) -> None:
    async with emu.client() as client:
        created = await client.create_session(
            "Add caching",
            source="sources/github/octocat/hello-world",
            automation_mode="AUTO_CREATE_PR",
        )
        emu.clock.advance(WHOLE_RUN)
        done = await client.get_session(created.id)
    assert done.state == "COMPLETED"
    assert len(done.pull_requests) == 1
    assert done.pull_requests[0].url.startswith("https://")


async def test_delete_then_the_session_is_gone(emu: Emulator) -> None:
    async with emu.client() as client:
        created = await client.create_session("Short-lived")
        await client.delete_session(created.id)
        with pytest.raises(NotFoundError):
            await client.get_session(created.id)
        with pytest.raises(NotFoundError):
            await client.delete_session(created.id)
        assert (await client.list_sessions()).sessions == []


async def test_every_key_of_an_account_sees_its_sessions(emu: Emulator) -> None:
    async with emu.client(KEY) as first, emu.client(SECOND_KEY) as second:
        created = await first.create_session("Shared work")
        assert (await second.get_session(created.id)).name == created.name


async def test_create_time_filter_returns_the_later_activities(emu: Emulator) -> None:
    async with emu.client() as client:
        created = await client.create_session("Write docs")
        emu.clock.advance(WHOLE_RUN)
        everything = await all_activities(client, created.id)
        cursor = everything[2].create_time
        later = [a async for a in client.iter_activities(created.id, create_time=cursor)]
    # The emulator defaults to an exclusive bound: strictly after the cursor.
    assert [a.name for a in later] == [a.name for a in everything[3:]]


# --------------------------------------------------------------------------- sources


async def test_sources_list_filter_and_get(emu: Emulator) -> None:
    async with emu.client() as client:
        page = await client.list_sources()
        walked = [s async for s in client.iter_sources(page_size=1)]
        names = [s.name for s in page.sources]
        wanted = names[:2]
        flt = " OR ".join(f'name="{n}"' for n in wanted)
        filtered = await client.list_sources(filter=flt)
        one = await client.get_source("github/acme/webapp")
        same = await client.get_source("sources/github/acme/webapp")
    assert "sources/github/acme/webapp" in names
    assert [s.name for s in walked] == names
    assert sorted(s.name for s in filtered.sources) == sorted(wanted)
    assert one.to_wire() == same.to_wire()
    assert one.id == "github/acme/webapp"
    assert one.host_repo is not None
    assert one.host_repo.owner == "acme"
    assert {b.display_name for b in one.host_repo.branches} >= {"main", "develop"}


# --------------------------------------------------------------------------- errors


async def test_400_invalid_argument_with_field_violations(emu: Emulator) -> None:
    async with emu.client() as client:
        with pytest.raises(InvalidArgumentError) as empty_prompt:
            await client.create_session("   ")
        with pytest.raises(InvalidArgumentError) as unknown_source:
            await client.create_session("x", source="github/nobody/nothing")
        with pytest.raises(InvalidArgumentError) as unknown_branch:
            await client.create_session("x", source="github/acme/webapp", starting_branch="nope")
        created = await client.create_session("No approval needed")
        with pytest.raises(InvalidArgumentError) as not_waiting:
            await client.approve_plan(created.id)
    for caught in (empty_prompt, unknown_source, unknown_branch, not_waiting):
        assert caught.value.status_code == 400
        assert caught.value.error.status == "INVALID_ARGUMENT"
        violations = caught.value.error.details[0]["fieldViolations"]
        assert violations
    assert empty_prompt.value.error.details[0]["fieldViolations"][0]["field"] == "prompt"


@pytest.mark.parametrize("page_size", [0, 101, -1])
async def test_400_for_a_page_size_out_of_range(emu: Emulator, page_size: int) -> None:
    async with emu.client() as client:
        with pytest.raises(InvalidArgumentError):
            await client.list_sessions(page_size=page_size)


async def test_400_for_a_page_token_that_is_not_the_servers(emu: Emulator) -> None:
    async with emu.client() as client:
        with pytest.raises(InvalidArgumentError):
            await client.list_sessions(page_token="forged-token")


async def test_401_for_an_unknown_key_on_every_endpoint(emu: Emulator) -> None:
    async with emu.client() as good:
        created = await good.create_session("Mine")
    async with emu.client("wrong-key") as client:
        calls = [
            client.list_sessions(),
            client.get_session(created.id),
            client.create_session("x"),
            client.delete_session(created.id),
            client.send_message(created.id, "x"),
            client.approve_plan(created.id),
            client.list_activities(created.id),
            client.get_activity(created.id, "0" * 32),
            client.list_sources(),
            client.get_source("github/acme/webapp"),
        ]
        for call in calls:
            with pytest.raises(UnauthenticatedError) as caught:
                await call
            assert caught.value.error.status == "UNAUTHENTICATED"
            assert "wrong-key" not in str(caught.value)
    # Not retried: a wrong key does not get better.
    assert emu.sleeps == []


async def test_403_for_another_accounts_session(emu: Emulator) -> None:
    async with emu.client() as mine:
        created = await mine.create_session("Private work")
        emu.clock.advance(WHOLE_RUN)
        activity = (await all_activities(mine, created.id))[0]
    async with emu.client(OTHER_KEY) as theirs:
        calls = [
            theirs.get_session(created.id),
            theirs.delete_session(created.id),
            theirs.send_message(created.id, "hi"),
            theirs.approve_plan(created.id),
            theirs.list_activities(created.id),
            theirs.get_activity(activity.name),
        ]
        for call in calls:
            with pytest.raises(PermissionDeniedError) as caught:
                await call
            assert caught.value.error.status == "PERMISSION_DENIED"
        # ...and the other account does not see it in its list.
        assert (await theirs.list_sessions()).sessions == []


async def test_404_for_what_does_not_exist(emu: Emulator) -> None:
    async with emu.client() as client:
        created = await client.create_session("Exists")
        calls = [
            client.get_session("12345678901234567890"),
            client.list_activities("12345678901234567890"),
            client.get_activity(created.id, "f" * 32),
            client.get_source("github/nobody/nothing"),
            client.send_message("12345678901234567890", "hi"),
        ]
        for call in calls:
            with pytest.raises(NotFoundError) as caught:
                await call
            assert caught.value.error.status == "NOT_FOUND"


async def test_forced_429_is_retried_honouring_retry_after(emu: Emulator) -> None:
    async with emu.client(headers={"x-emulator-fault": "429"}) as client:
        with pytest.raises(RateLimitedError) as caught:
            await client.list_sessions()
    assert caught.value.error.status == "RESOURCE_EXHAUSTED"
    assert caught.value.attempts == NO_JITTER.max_attempts
    assert len(emu.transport.requests) == NO_JITTER.max_attempts
    assert len(emu.sleeps) == NO_JITTER.max_attempts - 1
    # The emulator advises Retry-After: 1; the waits honour it and still back off.
    assert caught.value.retry_after == 1.0
    assert emu.sleeps == [1.0, 2.0, 4.0, 8.0]


async def test_forced_500_is_retried_for_reads_but_not_for_creates(emu: Emulator) -> None:
    async with emu.client(headers={"x-emulator-fault": "500"}) as client:
        with pytest.raises(ServerError) as read:
            await client.get_source("github/acme/webapp")
        reads = len(emu.transport.requests)
        with pytest.raises(ServerError):
            await client.create_session("Should be sent once")
    assert read.value.status_code == 500
    assert read.value.error.status == "INTERNAL"
    assert reads == NO_JITTER.max_attempts
    assert len(emu.transport.requests) == reads + 1
    async with emu.client() as client:
        # The failed create left nothing behind.
        assert (await client.list_sessions()).sessions == []


async def test_configured_rate_limit_fault_is_a_429() -> None:
    emu = make_emulator(fault_rate_limit=1.0)
    async with emu.client(retry=RetryPolicy(max_attempts=1)) as client:
        with pytest.raises(RateLimitedError):
            await client.list_sources()


async def test_configured_error_fault_is_a_5xx() -> None:
    emu = make_emulator(fault_error=1.0)
    async with emu.client(retry=RetryPolicy(max_attempts=1)) as client:
        with pytest.raises(ServerError):
            await client.list_sessions()


# --------------------------------------------------------------------------- pagination


async def walk_pages(
    client: SessionsClient, page_size: int, session: str | None = None
) -> list[Any]:
    """Every item on every page, duplicates kept (the client's iterators would hide them).

    Sessions when ``session`` is ``None``, else that session's activities.
    """
    items: list[Any] = []
    token: str | None = None
    for _ in range(10_000):
        if session is None:
            sessions = await client.list_sessions(page_size=page_size, page_token=token)
            items += sessions.sessions
            token = sessions.next_page_token
        else:
            activities = await client.list_activities(
                session, page_size=page_size, page_token=token
            )
            items += activities.activities
            token = activities.next_page_token
        if not token:
            return items
    raise AssertionError("pagination did not end")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page_size=st.integers(min_value=1, max_value=100), count=st.integers(0, 130))
async def test_walking_session_pages_yields_each_session_once(page_size: int, count: int) -> None:
    emu = make_emulator()
    world = emu.app.state.world  # seeded directly: the walk is what is tested
    account = world.account_for_key(KEY)
    created = [
        world.create_session(account, prompt=f"task {i}").to_session().name for i in range(count)
    ]
    async with emu.client() as client:
        walked = [s.name for s in await walk_pages(client, page_size)]
        iterated = [s.name async for s in client.iter_sessions(page_size=page_size)]
    assert len(walked) == len(set(walked)) == count
    assert walked == list(reversed(created))  # each once, newest first
    assert iterated == walked


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page_size=st.integers(min_value=1, max_value=100), messages=st.integers(0, 60))
async def test_walking_activity_pages_yields_each_activity_once(
    page_size: int, messages: int
) -> None:
    emu = make_emulator()
    async with emu.client() as client:
        created = await client.create_session("Busy session")
        emu.clock.advance(WHOLE_RUN)
        world = emu.app.state.world  # messages sent directly: the walk is what is tested
        for i in range(messages):
            world.send_message(world.account_for_key(KEY), created.id, f"message {i}")
            emu.clock.advance(STEP)
        emu.clock.advance(WHOLE_RUN)
        walked: list[Activity] = await walk_pages(client, page_size, session=created.id)
        reference: list[Activity] = await walk_pages(client, 100, session=created.id)
        iterated = [a.name async for a in client.iter_activities(created.id, page_size=page_size)]
    names = [a.name for a in walked]
    assert len(names) == len(set(names))
    assert names == [a.name for a in reference]
    assert iterated == names
    sent = [a.user_messaged.user_message for a in walked if a.user_messaged is not None]
    assert sent == [f"message {i}" for i in range(messages)]
    assert walked[-1].event_member == "sessionCompleted"


async def test_sessions_created_during_a_walk_do_not_disturb_it(emu: Emulator) -> None:
    async with emu.client() as client:
        before = [(await client.create_session(f"old {i}")).name for i in range(7)]
        names: list[str] = []
        page = await client.list_sessions(page_size=3)
        while True:
            names += [s.name for s in page.sessions]
            await client.create_session("created mid-walk")
            if not page.next_page_token:
                break
            page = await client.list_sessions(page_size=3, page_token=page.next_page_token)
    assert names == list(reversed(before))
