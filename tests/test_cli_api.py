"""The ``sessions``, ``activities`` and ``sources`` commands, run with click's CliRunner.

Every command talks to the emulator in process: the test passes a Runtime carrying an
``httpx.ASGITransport`` as the click context object (no patching). The emulator's clock is
fake and the retry ``sleep`` only records, so nothing waits. The shared helpers of
``cli/_output.py`` are unit-tested at the end.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
from click.testing import CliRunner, Result

from sessionhook.api.client import DEFAULT_API_KEY_HEADER
from sessionhook.api.errors import NotFoundError
from sessionhook.api.models import ErrorDetail
from sessionhook.cli import _output, cli
from sessionhook.cli._output import (
    CliError,
    Runtime,
    error_line,
    handle_errors,
    http_client,
    register_user_error,
    render_fields,
    render_table,
)
from sessionhook.emulator.app import create_app
from tests.support.clock import Clock

pytestmark = pytest.mark.app

KEY = "cli-test-key-123"
OTHER_KEY = "cli-other-key-456"
BASE = "http://emulator.test"
WHOLE_RUN = 60.0


@dataclass
class CliHarness:
    """Runs the CLI against one emulator."""

    clock: Clock
    runtime: Runtime
    sleeps: list[float] = field(default_factory=list)

    def run(
        self, *args: str, key: str | None = KEY, input: str | None = None, **env: str
    ) -> Result:
        environment: dict[str, str | None] = {
            "SESSIONHOOK_API_KEY": key,
            "SESSIONHOOK_BASE_URL": BASE,
            **env,
        }
        return CliRunner().invoke(cli, list(args), obj=self.runtime, env=environment, input=input)

    def ok(self, *args: str, **kwargs: Any) -> str:
        result = self.run(*args, **kwargs)
        assert result.exit_code == 0, (result.output, result.exception)
        assert result.stderr == ""
        return result.stdout

    def json(self, *args: str, **kwargs: Any) -> Any:
        return json.loads(self.ok(*args, "--json", **kwargs))

    def create(self, prompt: str = "Add a health endpoint", *extra: str, **kwargs: Any) -> str:
        return str(self.json("sessions", "create", prompt, *extra, **kwargs)["name"])


def make_harness(**app_kwargs: Any) -> CliHarness:
    clock = Clock(1_750_000_000.0)
    app = create_app(api_keys=(KEY, OTHER_KEY), step_delay=1.0, seed=99, clock=clock, **app_kwargs)
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    runtime = Runtime(transport=httpx.ASGITransport(app=app), sleep=fake_sleep)
    return CliHarness(clock, runtime, sleeps)


@pytest.fixture
def h() -> CliHarness:
    return make_harness()


def assert_one_error_line(result: Result, exit_code: int, *needles: str) -> str:
    """The command failed with exactly one line on stderr, no traceback, nothing on stdout."""
    assert result.exit_code == exit_code, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: ")
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in line
    return line


# --------------------------------------------------------------------------- sessions


def test_create_prints_name_and_state(h: CliHarness) -> None:
    out = h.ok("sessions", "create", "Fix the login bug", "--title", "Login")
    first, url = out.splitlines()
    assert first.startswith("created sessions/")
    assert first.endswith("(QUEUED)")
    assert url.startswith("https://")


def test_create_json_with_every_option(h: CliHarness) -> None:
    body = h.json(
        "sessions",
        "create",
        "--prompt",
        "Add dark mode",
        "--title",
        "Dark",
        "--source",
        "github/acme/webapp",
        "--branch",
        "feature/dark-mode",
        "--require-plan-approval",
        "--auto-pr",
    )
    assert body["state"] == "QUEUED"
    assert body["title"] == "Dark"
    name = body["name"]
    got = h.json("sessions", "get", name)
    assert got["prompt"] == "Add dark mode"
    assert got["sourceContext"] == {
        "source": "sources/github/acme/webapp",
        "hostRepoContext": {"startingBranch": "feature/dark-mode"},
    }
    h.clock.now += WHOLE_RUN
    assert h.json("sessions", "get", name)["state"] == "AWAITING_PLAN_APPROVAL"


def test_create_reads_the_prompt_from_stdin(h: CliHarness) -> None:
    name = h.create("-", input="Write the changelog\nfor 2.0\n")
    assert h.json("sessions", "get", name)["prompt"] == "Write the changelog\nfor 2.0"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((), "a prompt is required"),
        (("x", "--prompt", "y"), "give the prompt once"),
        (("x", "--branch", "main"), "--branch needs --source"),
        (("x", "--source", "sources/"), "not a source name"),
    ],
)
def test_create_usage_errors_exit_2(h: CliHarness, args: Sequence[str], needle: str) -> None:
    result = h.run("sessions", "create", *args)
    assert result.exit_code == 2
    assert needle in result.stderr
    assert "Traceback" not in result.output


def test_list_table_and_json(h: CliHarness) -> None:
    first = h.create("First task")
    second = h.create("Second task")
    table = h.ok("sessions", "list").splitlines()
    assert table[0].split() == ["ID", "STATE", "UPDATED", "TITLE"]
    ids = [line.split()[0] for line in table[1:]]
    assert ids == [second.removeprefix("sessions/"), first.removeprefix("sessions/")]
    body = h.json("sessions", "list")
    assert [s["name"] for s in body["sessions"]] == [second, first]
    assert "nextPageToken" not in body


def test_list_empty(h: CliHarness) -> None:
    assert h.ok("sessions", "list").strip() == "no sessions"


def test_list_pages_by_token_and_walks_with_all(h: CliHarness) -> None:
    names = [h.create(f"task {i}") for i in range(5)]
    out = h.ok("sessions", "list", "--page-size", "2")
    last = out.splitlines()[-1]
    assert last.startswith("next page: --page-token ")
    token = last.split()[-1]
    page2 = h.json("sessions", "list", "--page-size", "2", "--page-token", token)
    assert [s["name"] for s in page2["sessions"]] == names[::-1][2:4]
    walked = h.json("sessions", "list", "--page-size", "2", "--all")
    assert [s["name"] for s in walked["sessions"]] == names[::-1]
    everything = h.ok("sessions", "list", "--all", "--page-size", "1")
    assert "next page" not in everything
    assert len(everything.splitlines()) == 1 + 5


@pytest.mark.parametrize(
    "args",
    [
        ("--page-size", "0"),
        ("--page-size", "101"),
        ("--all", "--page-token", "abc"),
        ("--base-url", "localhost:8080"),
        ("--timeout", "0"),
    ],
)
def test_list_usage_errors_exit_2(h: CliHarness, args: Sequence[str]) -> None:
    result = h.run("sessions", "list", *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_get_human_output(h: CliHarness) -> None:
    name = h.create("Add a cache", "--source", "sources/github/acme/api-server", "--auto-pr")
    h.clock.now += WHOLE_RUN
    out = h.ok("sessions", "get", name.removeprefix("sessions/"))
    fields = dict(line.split(":", 1) for line in out.splitlines() if not line.startswith(" "))
    assert fields["name"].strip() == name
    assert fields["state"].strip() == "COMPLETED"
    assert fields["source"].strip() == "sources/github/acme/api-server"
    assert "github.com/acme/api-server/pull/" in fields["pull requests"]


def test_times_for_people_are_rfc3339_to_the_second(h: CliHarness) -> None:
    # They were "2026-11-22 12:00:03Z" (a space, not RFC 3339's T): issue 20.
    name = h.create("Add a cache")
    h.clock.now += WHOLE_RUN
    wire = h.json("sessions", "get", name)
    expected = wire["createTime"][:19] + "Z"  # the service's time, to the second
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", expected)
    details = h.ok("sessions", "get", name)
    assert f"created:  {expected}" in details
    assert f"updated:  {wire['updateTime'][:19]}Z" in details
    table = h.ok("sessions", "list")
    assert f"{wire['updateTime'][:19]}Z" in table.splitlines()[1]
    activities = h.json("activities", "list", name)["activities"]
    listed = h.ok("activities", "list", name)
    assert f"{activities[0]['createTime'][:19]}Z" in listed.splitlines()[1]


def test_message_approve_delete(h: CliHarness) -> None:
    name = h.create("Plan first", "--require-plan-approval")
    h.clock.now += WHOLE_RUN
    assert h.ok("sessions", "approve", name) == f"approved the plan of {name}\n"
    assert h.ok("sessions", "message", name, "Also update the docs") == f"sent to {name}\n"
    assert h.json("sessions", "message", name, "-", input="From stdin") == {}
    h.clock.now += WHOLE_RUN
    activities = h.json("activities", "list", name, "--all")["activities"]
    said = [a["userMessaged"]["userMessage"] for a in activities if "userMessaged" in a]
    assert said == ["Also update the docs", "From stdin"]
    assert h.ok("sessions", "delete", name) == f"deleted {name}\n"
    result = h.run("sessions", "get", name)
    assert_one_error_line(result, 1, "404 NOT_FOUND", "check the name or id")


def test_approve_without_a_waiting_plan_is_one_line_400(h: CliHarness) -> None:
    name = h.create("No approval asked")
    result = h.run("sessions", "approve", name)
    assert_one_error_line(result, 1, "400 INVALID_ARGUMENT", "check the arguments")


@pytest.mark.parametrize(
    "args",
    [
        ("sessions", "get", "sessions/1/activities/2"),
        ("sessions", "delete", ""),
        ("activities", "list", "a/b"),
        ("activities", "get", "sessions/1"),
        ("sources", "get", "sources/"),
    ],
)
def test_malformed_names_are_usage_errors(h: CliHarness, args: Sequence[str]) -> None:
    result = h.run(*args)
    assert result.exit_code == 2
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------- activities


def test_activities_list_get_and_create_time(h: CliHarness) -> None:
    name = h.create("Document the API")
    h.clock.now += WHOLE_RUN
    table = h.ok("activities", "list", name).splitlines()
    assert table[0].split() == ["ID", "CREATED", "BY", "EVENT", "SUMMARY"]
    assert "Session started" in table[1]
    assert "planGenerated" in table[2]
    assert "sessionCompleted" in table[-1]
    everything = h.json("activities", "list", name)["activities"]
    cursor = everything[1]["createTime"]
    later = h.json("activities", "list", name, "--create-time", cursor, "--all")["activities"]
    assert [a["name"] for a in later] == [a["name"] for a in everything[2:]]

    plan = everything[1]
    assert h.json("activities", "get", plan["name"]) == plan
    session_id = name.removeprefix("sessions/")
    details = h.ok("activities", "get", session_id, plan["id"])
    assert "event:" in details and "planGenerated" in details
    assert "1. " in details  # the plan's steps are listed
    last = h.ok("activities", "get", everything[-1]["name"])
    assert "change set on" in last


def test_activities_list_pages(h: CliHarness) -> None:
    name = h.create("Many steps")
    h.clock.now += WHOLE_RUN
    out = h.ok("activities", "list", name, "--page-size", "1")
    assert out.splitlines()[-1].startswith("next page: --page-token ")
    assert len(out.splitlines()) == 3  # header, one row, next-page line


def test_activities_bad_create_time_is_a_usage_error(h: CliHarness) -> None:
    result = h.run("activities", "list", "123", "--create-time", "yesterday")
    assert result.exit_code == 2
    assert "RFC 3339" in result.stderr


# --------------------------------------------------------------------------- sources


def test_sources_list_filter_and_get(h: CliHarness) -> None:
    table = h.ok("sources", "list").splitlines()
    # The emulator's list items carry no privacy or branches: those columns are left out.
    assert table[0].split() == ["NAME", "REPOSITORY"]
    rows = [line.split() for line in table[1:]]
    assert ["sources/github/acme/webapp", "acme/webapp"] in rows
    names = [row[0] for row in rows]
    flt = 'name="sources/github/acme/webapp" OR name="sources/github/octocat/hello-world"'
    filtered = h.json("sources", "list", "--filter", flt)["sources"]
    assert sorted(s["name"] for s in filtered) == [
        "sources/github/acme/webapp",
        "sources/github/octocat/hello-world",
    ]
    assert len(h.json("sources", "list", "--all", "--page-size", "1")["sources"]) == len(names)
    details = h.ok("sources", "get", "github/acme/webapp")
    assert "repository:" in details and "acme/webapp" in details
    assert "develop" in details
    assert h.json("sources", "get", "sources/github/acme/webapp")["id"] == "github/acme/webapp"


def test_sources_table_shows_privacy_and_default_branch_when_given() -> None:
    full = {
        "name": "sources/github/o/full",
        "hostRepo": {
            "owner": "o",
            "repo": "full",
            "isPrivate": False,
            "defaultBranch": {"displayName": "trunk"},
        },
    }
    bare = {"name": "sources/github/o/bare", "hostRepo": {"owner": "o", "repo": "bare"}}

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"sources": [full, bare]})

    runtime = Runtime(transport=httpx.MockTransport(answer))
    result = CliRunner().invoke(
        cli, ["sources", "list"], obj=runtime, env={"SESSIONHOOK_API_KEY": KEY}
    )
    assert result.exit_code == 0
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["NAME", "REPOSITORY", "PRIVATE", "DEFAULT", "BRANCH"],
        ["sources/github/o/full", "o/full", "no", "trunk"],
        ["sources/github/o/bare", "o/bare"],
    ]


def test_bad_source_filter_is_one_line_400(h: CliHarness) -> None:
    result = h.run("sources", "list", "--filter", "owner=acme")
    assert_one_error_line(result, 1, "400 INVALID_ARGUMENT")


# --------------------------------------------------------------------------- errors


def test_wrong_key_is_one_clear_line_and_exit_1(h: CliHarness) -> None:
    result = h.run("sessions", "list", key="not-a-real-key-xyz")
    line = assert_one_error_line(result, 1, "401 UNAUTHENTICATED", "SESSIONHOOK_API_KEY")
    assert "not-a-real-key-xyz" not in result.output
    assert " — " in line


def test_wrong_key_json_mode_also_one_line(h: CliHarness) -> None:
    result = h.run("sources", "get", "github/acme/webapp", "--json", key="bad-key-000")
    assert_one_error_line(result, 1, "401")


def test_missing_key_exits_2_with_a_hint(h: CliHarness) -> None:
    result = h.run("sessions", "list", key=None)
    assert_one_error_line(result, 2, "SESSIONHOOK_API_KEY is not set", "export")


def test_another_accounts_session_is_403(h: CliHarness) -> None:
    name = h.create("Mine only")
    result = h.run("sessions", "get", name, key=OTHER_KEY)
    assert_one_error_line(result, 1, "403 PERMISSION_DENIED", "no access")


def test_rate_limit_is_retried_then_reported_in_one_line() -> None:
    h = make_harness(fault_rate_limit=1.0)
    result = h.run("sources", "list")
    assert_one_error_line(
        result, 1, "429 RESOURCE_EXHAUSTED", "after 3 attempts", "retry after 1 s"
    )
    # Waits of about 1 s and 2 s (jittered), never shorter than the advised Retry-After: 1.
    first, second = h.sleeps
    assert 1.0 <= first <= 1.2
    assert 1.6 <= second <= 2.4


def test_unreachable_service_is_one_line() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    runtime = Runtime(transport=httpx.MockTransport(refuse), sleep=fake_sleep)
    result = CliRunner().invoke(
        cli,
        ["sessions", "list", "--base-url", "http://127.0.0.1:1"],
        obj=runtime,
        env={"SESSIONHOOK_API_KEY": KEY},
    )
    assert_one_error_line(result, 1, "ConnectError", "127.0.0.1:1", "reachable at --base-url")
    assert len(sleeps) == 2


def test_base_url_comes_from_the_environment_and_the_option_wins() -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={"sources": []})

    runtime = Runtime(transport=httpx.MockTransport(record))
    runner = CliRunner()
    env = {"SESSIONHOOK_API_KEY": KEY, "SESSIONHOOK_BASE_URL": "https://env.test/"}
    assert runner.invoke(cli, ["sources", "list"], obj=runtime, env=env).exit_code == 0
    args = ["sources", "list", "--base-url", "https://flag.test/v1alpha"]
    assert runner.invoke(cli, args, obj=runtime, env=env).exit_code == 0
    env.pop("SESSIONHOOK_BASE_URL")
    result = runner.invoke(
        cli, ["sources", "list"], obj=runtime, env={**env, "SESSIONHOOK_BASE_URL": None}
    )
    assert result.exit_code == 0
    assert seen == [
        "https://env.test/v1alpha/sources",
        "https://flag.test/v1alpha/sources",
        "http://127.0.0.1:8080/v1alpha/sources",
    ]


def _recorder(seen: list[httpx.Request]) -> Runtime:
    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"sources": []})

    return Runtime(transport=httpx.MockTransport(record))


def _config(tmp_path: Path, body: str, key: str = KEY) -> Path:
    """A daemon's config: ``body``, and the API key in a file beside it."""
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    path = tmp_path / "config.toml"
    path.write_text(body.replace("KEY_FILE", str(key_file)))
    return path


def test_the_service_is_named_as_for_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sessions create`` read the config's api.base_url nowhere: the API commands take
    --config (else $SESSIONHOOK_CONFIG, else the default file when it exists); the address
    is flag > environment > file, the key environment > file, the header from the file."""
    config = _config(
        tmp_path,
        '[api]\nbase_url = "https://file.test"\napi_key_file = "KEY_FILE"\n'
        'api_key_header = "x-file-key"\n',
    )
    seen: list[httpx.Request] = []
    runtime = _recorder(seen)
    blank: dict[str, str | None] = {
        "SESSIONHOOK_API_KEY": None,
        "SESSIONHOOK_BASE_URL": None,
        "SESSIONHOOK_CONFIG": None,
    }

    def called(*args: str, **env: str | None) -> tuple[str, str | None]:
        seen.clear()
        result = CliRunner().invoke(cli, list(args), obj=runtime, env={**blank, **env})
        assert result.exit_code == 0, result.output
        (request,) = seen
        return str(request.url), request.headers.get("x-file-key")

    listing = ("sources", "list")
    assert called(*listing, "--config", str(config)) == ("https://file.test/v1alpha/sources", KEY)
    assert called(*listing, SESSIONHOOK_CONFIG=str(config))[0].startswith("https://file.test/")
    env_url = called(*listing, "--config", str(config), SESSIONHOOK_BASE_URL="https://env.test")
    assert env_url == ("https://env.test/v1alpha/sources", KEY)
    flag = called(
        *listing,
        "--config",
        str(config),
        "--base-url",
        "https://flag.test",
        SESSIONHOOK_BASE_URL="https://env.test",
        SESSIONHOOK_API_KEY=OTHER_KEY,
    )
    assert flag == ("https://flag.test/v1alpha/sources", OTHER_KEY)
    # The default file, when it exists and something is left to find.
    monkeypatch.setattr(_output, "DEFAULT_CONFIG", str(config))
    assert called(*listing) == ("https://file.test/v1alpha/sources", KEY)
    seen.clear()
    created = CliRunner().invoke(
        cli, ["sessions", "create", "Fix it", "--config", str(config)], obj=runtime, env=blank
    )
    assert str(seen[0].url) == "https://file.test/v1alpha/sessions", created.output


def test_an_account_of_the_config_is_named_with_account(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        '[api]\nbase_url = "https://default.test"\n'
        '[[accounts]]\nname = "team-a"\napi_key_file = "KEY_FILE"\n'
        '[[accounts]]\nname = "team-b"\napi_key_env = "TEAM_B_KEY"\n'
        'base_url = "https://b.test"\n',
    )
    seen: list[httpx.Request] = []
    runtime = _recorder(seen)
    env = {"SESSIONHOOK_API_KEY": None, "SESSIONHOOK_BASE_URL": None, "TEAM_B_KEY": OTHER_KEY}
    base = ["sources", "list", "--config", str(config)]
    runner = CliRunner()
    assert runner.invoke(cli, [*base, "--account", "team-b"], obj=runtime, env=env).exit_code == 0
    assert str(seen[-1].url).startswith("https://b.test/")
    assert seen[-1].headers[DEFAULT_API_KEY_HEADER] == OTHER_KEY
    assert runner.invoke(cli, [*base, "--account", "team-a"], obj=runtime, env=env).exit_code == 0
    assert str(seen[-1].url).startswith("https://default.test/")
    assert seen[-1].headers[DEFAULT_API_KEY_HEADER] == KEY
    both = runner.invoke(cli, base, obj=runtime, env=env)
    assert both.exit_code == 2 and "--account" in both.stderr and "team-a, team-b" in both.stderr
    unknown = runner.invoke(cli, [*base, "--account", "team-c"], obj=runtime, env=env)
    assert unknown.exit_code == 2 and unknown.stderr.splitlines() == [
        "config error: accounts: no account 'team-c' (known: team-a, team-b)"
    ]
    missing = runner.invoke(
        cli, ["sources", "list", "--config", str(tmp_path / "nope.toml")], obj=runtime, env=env
    )
    assert missing.exit_code == 2 and "nope.toml: file not found" in missing.stderr
    assert len(seen) == 2  # no call made by a command that failed


def test_api_key_header_option(h: CliHarness) -> None:
    seen: list[httpx.Headers] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, json={})

    runtime = Runtime(transport=httpx.MockTransport(record))
    args = ["sources", "list", "--api-key-header", "X-Other-Key"]
    result = CliRunner().invoke(cli, args, obj=runtime, env={"SESSIONHOOK_API_KEY": KEY})
    assert result.exit_code == 0
    assert seen[0]["x-other-key"] == KEY
    assert "x-vendor-api-key" not in seen[0]


def test_api_key_header_default_is_the_clients_and_help_names_it() -> None:
    # --help spells the default out (it must not import the client to know it).
    seen: list[httpx.Headers] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, json={})

    runtime = Runtime(transport=httpx.MockTransport(record))
    env = {"SESSIONHOOK_API_KEY": KEY}
    assert CliRunner().invoke(cli, ["sources", "list"], obj=runtime, env=env).exit_code == 0
    assert seen[0][DEFAULT_API_KEY_HEADER] == KEY
    shown = CliRunner().invoke(cli, ["sources", "list", "--help"]).stdout
    assert f"else {DEFAULT_API_KEY_HEADER}]" in " ".join(shown.split())


def test_help_lists_every_command() -> None:
    runner = CliRunner()
    expected = {
        "sessions": {"list", "get", "create", "delete", "message", "approve"}
        | {"archive", "unarchive"},
        "activities": {"list", "get"},
        "sources": {"list", "get"},
    }
    for group, commands in expected.items():
        result = runner.invoke(cli, [group, "--help"])
        assert result.exit_code == 0
        listed = {
            line.split()[0]
            for line in result.stdout.split("Commands:")[1].splitlines()
            if line.strip()
        }
        assert listed == commands


# --------------------------------------------------------------------------- _output helpers


def test_render_table_aligns_and_cuts() -> None:
    table = render_table(
        ("ID", "TITLE"),
        [("1", "short"), ("22", "x" * 80), ("3", None), ("4", "two\nlines")],
        max_cell=10,
    )
    assert table.splitlines() == [
        "ID  TITLE",
        "1   short",
        "22  xxxxxxxxx…",
        "3",
        "4   two lines",
    ]
    with pytest.raises(ValueError):
        render_table(("A", "B"), [("only one",)])


def test_render_fields_skips_empty_and_indents_continuations() -> None:
    text = render_fields([("name", "n"), ("empty", ""), ("none", None), ("multi", "a\nb")])
    assert text.splitlines() == ["name:   n", "multi:  a", "        b"]
    assert render_fields([("x", "")]) == ""


def test_error_line_shapes() -> None:
    assert error_line("boom") == "error: boom"
    assert error_line("boom\n  twice", "check\nthis") == "error: boom twice — check this"
    # A message that names itself an error is not prefixed twice.
    assert error_line("config error: api.base_url: bad") == "config error: api.base_url: bad"
    # ...but an exception name ending in "Error" is not such a message.
    assert error_line("ConnectError: refused") == "error: ConnectError: refused"


class _ConfigProblem(Exception):
    hint = "fix the file"


register_user_error(_ConfigProblem, exit_code=2)


def _raiser(exc: BaseException) -> click.Command:
    @click.command()
    def command() -> None:
        with handle_errors():
            raise exc

    return command


@pytest.mark.parametrize(
    ("exc", "exit_code", "line"),
    [
        (
            _ConfigProblem("config error: store.path: missing"),
            2,
            "config error: store.path: missing — fix the file",
        ),
        (
            NotFoundError(
                "404 NOT_FOUND: gone",
                request=httpx.Request("GET", "http://x.test/a"),
                status_code=404,
                error=ErrorDetail(code=404, status="NOT_FOUND", message="gone"),
            ),
            1,
            "error: 404 NOT_FOUND: gone (GET http://x.test/a) — " + NotFoundError.hint,
        ),
        (
            ExceptionGroup("wrapped", [_ConfigProblem("bad value")]),
            2,
            "error: bad value — fix the file",
        ),
        (
            CliError("already one line", hint="do this", exit_code=3),
            3,
            "error: already one line — do this",
        ),
    ],
)
def test_handle_errors_reports_one_line(exc: BaseException, exit_code: int, line: str) -> None:
    result = CliRunner().invoke(_raiser(exc))
    assert result.exit_code == exit_code
    assert result.stderr.splitlines() == [line]
    assert result.stdout == ""


def test_handle_errors_lets_bugs_through() -> None:
    result = CliRunner().invoke(_raiser(KeyError("bug")))
    assert isinstance(result.exception, KeyError)
    assert result.exit_code == 1


@pytest.mark.parametrize(
    ("base_url", "mode"),
    [("http://127.0.0.1:8080", ssl.CERT_NONE), ("https://api.example.com", ssl.CERT_REQUIRED)],
)
@pytest.mark.anyio
async def test_only_an_https_service_gets_a_verifying_tls_context(
    base_url: str, mode: ssl.VerifyMode
) -> None:
    # A plain-http service never uses TLS (no redirects are followed): its client skips
    # loading the CA bundle; an https one verifies as before.
    async with http_client(timeout=5.0, base_url=base_url) as http:
        context = http._transport._pool._ssl_context  # type: ignore[attr-defined]
        assert context.verify_mode == mode
