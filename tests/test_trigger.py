"""``sessionhook trigger``: a signed sample of every event type, through every shape an endpoint
can have (the standard body, thin, CloudEvents, each chat preset, a template), or to any URL
(``--to``). Run with click's CliRunner; the network is an httpx MockTransport that records
each request (the CLI's Runtime seam), and every request is verified with the reference
``standardwebhooks`` package and validated against the shipped OpenAPI document (what
``/openapi.json`` serves) or the chat service's documented shape."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from click.testing import CliRunner, Result
from standardwebhooks.webhooks import Webhook

from sessionhook.cli import cli
from sessionhook.cli._output import Runtime
from sessionhook.relay.domain.contract import shipped_document
from sessionhook.relay.domain.signing import generate_secret
from tests.support.chat_schemas import CHAT, CHAT_FORMATS
from tests.support.daemon_setup import token_server, write_config

pytestmark = pytest.mark.app

DOCUMENT = shipped_document()
TYPES = sorted(DOCUMENT["webhooks"])
TEMPLATE = '{"text": {{ (type ~ ": " ~ session.title) | tojson }}}'
#: Endpoint name -> its keys beyond name, url and secret.
SHAPES: dict[str, str] = {
    "std": "",
    "thin": 'payload = "thin"',
    "ce": 'format = "cloudevents"',
    **{name: f'format = "{fmt}"' for name, fmt in CHAT_FORMATS.items()},
    "tpl": f"template = {json.dumps(TEMPLATE)}",
    "plans": 'events = ["session.action_required"]',
    "acme": 'filter = {"data.session.source" = "sources/github/acme/*"}',
    "other": 'filter = {"data.session.source" = "sources/github/other/*"}',
}


@dataclass
class Network:
    """Records every request and answers ``status``."""

    status: int = 200
    requests: list[httpx.Request] = field(default_factory=list)

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.status, text="ok")


@dataclass
class Rig:
    config: Path
    secret: str
    network: Network

    def run(self, *args: str, env: dict[str, str] | None = None) -> Result:
        runtime = Runtime(transport=httpx.MockTransport(self.network.handler))
        return CliRunner().invoke(cli, ["trigger", *args], obj=runtime, env=env)

    def send(self, event_type: str, endpoint: str) -> httpx.Request:
        before = len(self.network.requests)
        result = self.run(event_type, "--endpoint", endpoint, "--config", str(self.config))
        assert result.exit_code == 0, (result.output, result.exception)
        (line,) = result.stdout.splitlines()
        assert line.startswith("200 in ") and f": {event_type} to {endpoint} " in line
        (request,) = self.network.requests[before:]
        assert f"(webhook-id {request.headers['webhook-id']})" in line
        return request


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    secret = generate_secret()
    extra = "\n".join(
        f'[[endpoints]]\nname = "{name}"\nurl = "http://rx.test/{name}"\n'
        f"secret = {json.dumps(secret)}\n{keys}"
        for name, keys in SHAPES.items()
    )
    return Rig(write_config(tmp_path, secret=secret, extra=extra), secret, Network())


def verified(rig: Rig, request: httpx.Request) -> Any:
    """The body, once the reference implementation verified its signature."""
    headers = {k: v for k, v in request.headers.items() if k.startswith("webhook-")}
    assert headers["webhook-id"].startswith("msg_trigger_")
    assert len(headers["webhook-id"]) == len("msg_trigger_") + 32
    return Webhook(rig.secret).verify(request.content, headers)


def schema_of(event_type: str, content: str, choice: int | None = None) -> dict[str, Any]:
    body = DOCUMENT["webhooks"][event_type]["post"]["requestBody"]["content"][content]["schema"]
    schema = body if choice is None else body["anyOf"][choice]
    return {**schema, "components": DOCUMENT["components"]}


# --------------------------------------------------------------------- every type, every shape


def test_list_names_every_type_of_the_contract(rig: Rig) -> None:
    result = rig.run("--list")
    assert result.exit_code == 0, result.output
    rows = result.stdout.splitlines()[1:]
    assert sorted(row.split()[0] for row in rows) == TYPES
    assert all(len(row.split()) > 1 for row in rows), "a line each says what the sample shows"


@pytest.mark.parametrize("event_type", TYPES)
def test_every_type_through_every_shape(rig: Rig, event_type: str) -> None:
    standard = verified(rig, rig.send(event_type, "std"))
    assert standard["type"] == event_type and standard["data"]["sample"] is True
    jsonschema.validate(standard, schema_of(event_type, "application/json", 0))
    thin = verified(rig, rig.send(event_type, "thin"))
    assert thin["data"]["sample"] is True
    jsonschema.validate(thin, schema_of(event_type, "application/json", 1))
    cloud = rig.send(event_type, "ce")
    assert cloud.headers["content-type"].startswith("application/cloudevents+json")
    event = verified(rig, cloud)
    assert event["id"] == cloud.headers["webhook-id"] and event["data"]["sample"] is True
    jsonschema.validate(event, schema_of(event_type, "application/cloudevents+json"))
    for name, schema in CHAT.items():
        jsonschema.validate(verified(rig, rig.send(event_type, name)), schema)
    rendered = verified(rig, rig.send(event_type, "tpl"))
    assert rendered == {"text": f"{event_type}: Fix the flaky login test"}


def test_the_samples_are_realistic(rig: Rig) -> None:
    required = verified(rig, rig.send("session.action_required", "std"))["data"]
    assert required["action"] == "approve_plan" and len(required["plan"]["steps"]) == 2
    assert "links" not in required  # [actions] is off in this config
    completed = verified(rig, rig.send("session.completed", "std"))["data"]
    assert completed["outputs"]["pull_requests"][0]["url"].startswith("https://github.com/")
    assert completed["outputs"]["change_set"]["files"]


def test_an_endpoint_s_filters_apply_as_to_a_delivery(rig: Rig) -> None:
    assert verified(rig, rig.send("session.action_required", "plans"))["type"]
    assert verified(rig, rig.send("session.completed", "acme"))["type"]
    for endpoint, event_type, why in (
        ("plans", "session.completed", "its events (session.action_required) leave it out"),
        ("other", "session.completed", "its filter leaves it out"),
    ):
        result = rig.run(event_type, "--endpoint", endpoint, "--config", str(rig.config))
        assert result.exit_code != 0 and why in result.stderr
        assert result.stderr.count("\n") == 1 and "nothing was sent" in result.stderr
    assert len(rig.network.requests) == 2


def test_a_refusal_of_the_consumer_is_exit_1_with_its_status(rig: Rig) -> None:
    rig.network.status = 500
    result = rig.run("session.failed", "--endpoint", "std", "--config", str(rig.config))
    assert result.exit_code == 1
    assert result.stdout.startswith("500 in ")
    assert result.stderr.startswith("error: the sample was not accepted (500)")


# --------------------------------------------------------------------------- --to


def test_to_any_url_with_a_secret_from_the_environment(rig: Rig) -> None:
    env = {"HOOK_SECRET": rig.secret}
    result = rig.run(
        "session.completed", "--to", "http://127.0.0.1:9/hook", "--secret-env", "HOOK_SECRET",
        env=env,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (request,) = rig.network.requests
    assert str(request.url) == "http://127.0.0.1:9/hook"
    body = verified(rig, request)
    jsonschema.validate(body, schema_of("session.completed", "application/json", 0))
    again = rig.run(
        "activity.plan_generated", "--to", "http://127.0.0.1:9/", "--secret", rig.secret
    )
    assert again.exit_code == 0 and verified(rig, rig.network.requests[1])["data"]["sample"]


# --------------------------------------------------------------------------- hostile


def one_line(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "event_type",
    ["session.nope", "x" * 10_240, "session.completed\n", "ping", "*", "\u202esession.failed"],
)
def test_a_type_the_contract_does_not_have_is_one_line(rig: Rig, event_type: str) -> None:
    result = rig.run(event_type, "--endpoint", "std", "--config", str(rig.config))
    line = one_line(result, 1)
    assert line.startswith("error: unknown event type ") and "trigger --list" in line
    assert len(line) < 1000
    assert rig.network.requests == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--endpoint", "std", "--to", "http://127.0.0.1:9/"], "one of them"),
        ([], "--endpoint NAME or --to URL"),
        (["--to", "http://127.0.0.1:9/"], "--secret SECRET or --secret-env VAR"),
        (["--to", "http://127.0.0.1:9/", "--secret", "whsec_AA==", "--secret-env", "X"], "one"),
        (["--to", "http://127.0.0.1:9/", "--secret", "s", "--session", "1"], "--session"),
        (["--endpoint", "std", "--secret", "whsec_AA=="], "--secret"),
        (["--endpoint", "std", "--url", "http://127.0.0.1:9", "--config", "x"], "--config"),
    ],
)
def test_usage_errors(rig: Rig, args: list[str], says: str) -> None:
    result = rig.run("session.failed", *args)
    assert result.exit_code == 2 and says in result.stderr and "Traceback" not in result.output
    assert rig.network.requests == []


@pytest.mark.parametrize(
    ("target", "secret", "says"),
    [
        ("http://127.0.0.1:9/", "not-a-secret", "the secret is not usable"),
        ("http://127.0.0.1:9/", "whsec_!!!", "the secret is not usable"),
        ("ftp://127.0.0.1/", "whsec_" + "A" * 40, "--to: refused"),
        ("http://[::1", "whsec_" + "A" * 40, "--to: refused"),
    ],
)
def test_to_refuses_what_it_cannot_use(rig: Rig, target: str, secret: str, says: str) -> None:
    line = one_line(rig.run("session.failed", "--to", target, "--secret", secret), 1)
    assert says in line
    assert rig.network.requests == []


def test_list_takes_nothing_else_and_a_missing_type_is_a_usage_error(rig: Rig) -> None:
    assert rig.run("--list", "--endpoint", "std").exit_code == 2
    assert rig.run("session.failed", "--list").exit_code == 2
    missing = rig.run("--endpoint", "std")
    assert missing.exit_code == 2 and "trigger --list" in missing.stderr


def test_an_unknown_endpoint_names_the_known(rig: Rig) -> None:
    line = one_line(rig.run("session.failed", "--endpoint", "nope", "--config", str(rig.config)), 1)
    assert "no endpoint named 'nope'" in line


def test_local_samples_carry_links_of_the_relay_s_key_once_it_exists(tmp_path: Path) -> None:
    """With [actions] on, the sample's links are signed with the relay's key for the sample
    account (their pages say it is a sample); before the daemon made the key, the command
    makes none (a key file of another owner would lock the daemon out) and says so."""
    from sessionhook.relay.config.action_keys import ActionKeys
    from sessionhook.relay.domain.action_links import SAMPLE_ACCOUNT, verify_link

    secret, key_file = generate_secret(), tmp_path / "links.key"
    public = "http://127.0.0.1:9187"
    actions = {"enabled": True, "public_url": public, "key_file": str(key_file)}
    server = token_server(tmp_path, "trigger-test-token-0123456789abcdef0123")
    config = write_config(tmp_path, secret=secret, actions=actions, server=server)
    rig = Rig(config, secret, Network())
    args = ("session.action_required", "--endpoint", "rx", "--config", str(rig.config))
    before = rig.run(*args)
    assert before.exit_code == 0, before.output
    assert "no action-link key" in before.stderr and not key_file.exists()
    assert "links" not in verified(rig, rig.network.requests[0])["data"]
    keys = ActionKeys(key_file).ring()  # what the daemon makes at its start
    after = rig.run(*args)
    assert after.exit_code == 0, after.output
    links = verified(rig, rig.network.requests[1])["data"]["links"]
    assert links["approve"].startswith(public + "/actions/")
    token = links["approve"].rsplit("/", 1)[1]
    claims = verify_link([keys.current], token, time.time())
    assert claims.account == SAMPLE_ACCOUNT and claims.action == "approve_plan"
