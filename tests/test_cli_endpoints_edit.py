"""``sessionhook endpoints create|update|delete|rotate-secret`` on the local store (both
engines, found through ``--config``): the secret printed once, ``--json``, the config
file's endpoints refused, bad definitions refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result
from standardwebhooks import Webhook

from sessionhook.cli import cli
from sessionhook.cli._output import Runtime
from sessionhook.relay.domain.signing import generate_secret
from tests.support.backends import Backend, sqlite_only
from tests.support.backlog import fill
from tests.support.spellings import ELSEWHERE, loopback_spellings
from tests.support.store_rows import Ep

pytestmark = pytest.mark.app


@pytest.fixture
def config_file(backend: Backend, tmp_path: Path) -> Path:
    """A config naming ``backend``'s store, with one endpoint of its own, synced as the
    daemon does at its start."""
    store = (
        f'url = "{backend.target}"'
        if backend.name == "postgresql"
        else f'path = "{backend.target}"'
    )
    path = tmp_path / "config.toml"
    path.write_text(
        f"[store]\n{store}\n"
        "[[endpoints]]\n"
        'name = "filed"\n'
        'url = "https://hooks.example.com/filed"\n'
        f'secret = "{generate_secret()}"\n'
    )
    with backend.open() as opened:
        opened.endpoints.sync_endpoints([Ep("filed", "https://hooks.example.com/filed")])
    return path


def run(config: Path, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, [*args, "--config", str(config)], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def create(config: Path, name: str, *more: str) -> Result:
    """``endpoints create NAME --url https://hooks.example.com/NAME MORE...``."""
    return run(
        config, "endpoints", "create", name, "--url", f"https://hooks.example.com/{name}", *more
    )


def test_events_is_spelled_as_in_the_config_and_the_api(config_file: Path) -> None:
    """``--events`` (a list, comma-separated or repeated) as the config's ``events`` and the
    API's; ``--event`` still works."""
    made = create(config_file, "both", "--events", "session.*, activity.plan_*", "--json")
    assert json.loads(made.output)["definition"]["events"] == ["session.*", "activity.plan_*"]
    again = create(config_file, "old", "--event", "session.*", "--events", "activity.*", "--json")
    assert json.loads(again.output)["definition"]["events"] == ["session.*", "activity.*"]
    change = ["update", "both", "--events", "session.completed", "--json"]
    updated = json.loads(run(config_file, "endpoints", *change).output)
    assert updated["definition"]["events"] == ["session.completed"]


def test_create_update_rotate_delete(backend: Backend, config_file: Path) -> None:
    more = ["--events", "session.*", "--format", "slack", "--description", "CI", "--json"]
    answer = json.loads(create(config_file, "ci-bot", *more).output)
    secret = answer["secret"]
    assert secret.startswith("whsec_") and answer["source"] == "api"
    assert answer["definition"] == {
        "url": "https://hooks.example.com/ci-bot",
        "events": ["session.*"],
        "format": "slack",
    }
    listed = run(config_file, "endpoints", "list", "--json").output
    assert secret not in listed and "ci-bot" in listed

    only_github = "data.session.source=sources/github/*"
    update = ["update", "ci-bot", "--unset", "format", "--filter", only_github, "--json"]
    updated = json.loads(run(config_file, "endpoints", *update).output)
    assert updated["definition"] == {
        "url": "https://hooks.example.com/ci-bot",
        "events": ["session.*"],
        "filter": {"data.session.source": ["sources/github/*"]},
    }
    rotated = json.loads(
        run(config_file, "endpoints", "rotate-secret", "ci-bot", "--overlap", "1h", "--json").output
    )
    assert rotated["secret"] != secret and rotated["previous_secret_expires_at"].endswith("Z")
    with backend.open() as store:
        (stored,) = store.endpoints.stored_endpoints()
        assert stored.secret == rotated["secret"] and stored.previous_secret == secret
        fill(store, 1, 2)
    plain = run(config_file, "endpoints", "delete", "ci-bot").output
    assert "deleted; 0 open deliveries" in plain  # its filter took none of those events
    with backend.open() as store:
        assert store.endpoints.stored_endpoints() == []
        assert store.outbox.pending_count("filed") == 2


def test_the_secret_is_printed_once_and_can_come_from_the_environment(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = generate_secret()
    monkeypatch.setenv("HOOK_SECRET", chosen)
    out = create(config_file, "mine", "--secret-env", "HOOK_SECRET").output
    assert out.count(chosen) == 1 and "shown once" in out
    rotated = run(config_file, "endpoints", "rotate-secret", "mine").output
    assert "new secret" in rotated and chosen not in rotated


def test_refusals_are_one_line(config_file: Path) -> None:
    cases = [
        (["create", "filed", "--url", "https://hooks.example.com/x"], "config file"),
        (["create", "meta", "--url", "http://169.254.169.254/latest"], "url:"),
        (["create", "a/b", "--url", "https://hooks.example.com/x"], "name:"),
        (["create", "bad", "--url", "https://hooks.example.com/x", "--event", "nope"], "events"),
        (["update", "filed", "--url", "https://hooks.example.com/y"], "config file"),
        (["delete", "filed"], "config file"),
        (["rotate-secret", "filed"], "config file"),
    ]
    for args, reason in cases:
        result = run(config_file, "endpoints", *args, code=1)
        lines = result.output.strip().splitlines()
        assert lines[0].startswith("error: ") and reason in lines[0], result.output
        assert "Traceback" not in result.output
    unknown = run(config_file, "endpoints", "delete", "ghost", code=2)
    assert "ghost" in unknown.output


@sqlite_only
def test_hosts_that_normalize_to_private_addresses_are_refused(config_file: Path) -> None:
    create(config_file, "mine")
    for url in [*loopback_spellings(8080), *ELSEWHERE]:
        for args in (["create", "spelled"], ["update", "mine"]):
            result = run(config_file, "endpoints", *args, "--url", url, code=1)
            [line] = result.output.strip().splitlines()
            assert line.startswith("error: url: ") and "allow_private_networks" in line, line
    listed = json.loads(run(config_file, "endpoints", "list", "--json").output)
    assert {e["name"]: e["url"] for e in listed} == {
        "filed": "https://hooks.example.com/filed",
        "mine": "https://hooks.example.com/mine",
    }


def test_endpoints_test_signs_a_ping_with_the_stored_secret(config_file: Path) -> None:
    created = json.loads(create(config_file, "mine", "--json").output)
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    result = CliRunner().invoke(
        cli,
        ["endpoints", "test", "mine", "--config", str(config_file)],
        obj=Runtime(transport=httpx.MockTransport(answer)),
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    (request,) = seen
    assert str(request.url) == "https://hooks.example.com/mine"
    body = Webhook(created["secret"]).verify(request.content, dict(request.headers))
    assert body["type"] == "ping"
    assert created["secret"] not in result.output


def test_a_create_past_delivery_max_endpoints_is_refused_in_one_line(config_file: Path) -> None:
    """Issue 26 item 6: the CLI's create counts the store's endpoints created at run time
    (the config file's are not counted) as the API does."""
    config_file.write_text(config_file.read_text() + "[delivery]\nmax_endpoints = 1\n")
    create(config_file, "mine")
    refused = run(
        config_file, "endpoints", "create", "more", "--url", "https://hooks.example.com/m", code=1
    )
    (line,) = refused.output.strip().splitlines()
    assert line.startswith("error: no more endpoints can be created at run time: "), line
    assert "delivery.max_endpoints is 1 (the store holds 1)" in line
    run(config_file, "endpoints", "delete", "mine")
    create(config_file, "more")


def test_a_template_over_its_size_budget_is_refused_and_nothing_stored(
    config_file: Path, tmp_path: Path
) -> None:
    """Issue 26 item 2: ``endpoints create`` checks a template as the API does, in a child
    process: the issue's template (25 doublings of a string) is refused naming the budget."""
    template = tmp_path / "big.j2"
    template.write_text(
        '{% set ns = namespace(s="12345678") %}{% for i in range(25) %}'
        '{% set ns.s = ns.s ~ ns.s %}{% endfor %}{"n": {{ ns.s | length }}}'
    )
    refused = run(
        config_file,
        "endpoints",
        "create",
        "big",
        "--url",
        "https://hooks.example.com/big",
        "--template-file",
        str(template),
        code=1,
    )
    (line,) = refused.output.strip().splitlines()
    assert line.startswith("error: template over its size budget of"), line
    assert "error: no endpoint" in run(config_file, "endpoints", "test", "big", code=2).output
