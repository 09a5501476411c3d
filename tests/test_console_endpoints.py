"""The console's endpoint editor, in process on both store backends: create (the secret
shown once, in the POST's uncached answer, never in a cookie), edit, delete (confirmed),
rotate the secret with an overlap; every refusal of the operator layer one line with what
was typed kept; hostile input refused by name and escaped; an endpoint of the config file
read-only; every POST without its CSRF token a 403 that changes nothing."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sessionhook.relay.config import Config
from sessionhook.relay.domain.rows import EndpointSpec
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.ops import endpoint_edits as edits
from sessionhook.relay.store import AsyncStore, Store
from tests.support.backends import Backend
from tests.support.clock import T0, Clock
from tests.support.console_app import TOKEN, app_for, form, logged_in
from tests.support.store_rows import Ep

pytestmark = pytest.mark.app

NOW = T0 + 600  # the console app's clock
URL = "https://hooks.example.com/ci"
SECRET_OF = generate_secret()
SECRET = re.compile(r'<code id="secret" class="mono">(whsec_[A-Za-z0-9+/=]+)</code>')


@pytest.fixture
def store(backend: Backend) -> Iterator[Store]:
    with backend.open(clock=Clock(NOW)) as opened:
        yield opened


@pytest.fixture
async def http(store: Store) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    async with logged_in(app_for(AsyncStore(store))) as signed_in:
        yield signed_in


def flash_text(page: str) -> str:
    """The one-line flash message at the top of ``page``."""
    found = re.search(r'<p class="flash (?:ok|error)" id="flash" role="status">(.*?)</p>', page)
    assert found is not None, page[:2000]
    assert "\n" not in found.group(1)
    return html.unescape(found.group(1))


def field_value(page: str, name: str) -> str:
    """The value the form shows in its field ``name`` (input or textarea), unescaped."""
    found = re.search(rf'<input type="(?:text|url)" name="{name}" value="([^"]*)"', page)
    if found is None:
        found = re.search(rf'<textarea name="{name}"[^>]*>([^<]*)</textarea>', page)
    assert found is not None, name
    return html.unescape(found.group(1))


async def create(client: httpx.AsyncClient, token: str, name: str = "ci-bot") -> str:
    """Create ``name`` through the console; its secret, from the page that shows it."""
    answer = await client.post(
        "/console/endpoints/new",
        **form(token, name=name, url=URL, events="session.*", format="standard", payload="full"),
    )
    assert answer.status_code == 201, answer.text[:500]
    found = SECRET.search(answer.text)
    assert found is not None
    return found.group(1)


@pytest.fixture
async def created(http: Any) -> tuple[httpx.AsyncClient, str, str]:
    """The signed-in client, its CSRF token, and the secret of ci-bot it created."""
    client, token = http
    return client, token, await create(client, token)


# --------------------------------------------------------------------------- create


@pytest.mark.anyio
async def test_create_shows_the_secret_once_uncached_and_never_in_a_cookie(
    store: Store, http: Any
) -> None:
    client, token = http
    page = await client.get("/console/endpoints/new")
    assert page.status_code == 200 and 'name="csrf_token"' in page.text
    answer = await client.post(
        "/console/endpoints/new",
        **form(
            token,
            name="ci-bot",
            url=URL,
            events="session.action_required, session.state_changed",
            format="slack",
            payload="thin",
            description="the CI's bot",
        ),
    )
    assert answer.status_code == 201  # the page itself: no redirect to a URL that shows it
    assert answer.headers["cache-control"] == "no-store"
    assert "set-cookie" not in answer.headers  # no flash cookie carrying it
    found = SECRET.search(answer.text)
    assert found is not None
    secret = found.group(1)
    stored = store.endpoints.stored_endpoint("ci-bot")
    assert stored is not None and stored.secret == secret
    assert stored.spec == {
        "url": URL,
        "events": ["session.action_required", "session.state_changed"],
        "format": "slack",
        "payload": "thin",
    }
    assert stored.description == "the CI's bot"
    # Never again: not on the overview, not on its own page.
    overview = (await client.get("/console")).text
    assert 'href="/console/endpoints/ci-bot">Edit</a>' in overview
    edit = (await client.get("/console/endpoints/ci-bot")).text
    assert field_value(edit, "url") == URL
    assert secret not in overview and secret not in edit
    # A second endpoint of the same name: refused (409), the first one untouched.
    again = await client.post("/console/endpoints/new", **form(token, name="ci-bot", url=URL))
    assert again.status_code == 409 and "ci-bot" in flash_text(again.text)
    assert store.endpoints.stored_endpoint("ci-bot") == stored


HOSTILE_URL = 'https://hooks.example.com/x"><script>window.__pwned=1</script>'
BIG = "x" * 10_240


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"url": HOSTILE_URL}, "url:"),
        ({"name": "a/b/../c"}, "name:"),
        ({"name": "ci\x00bot"}, "name:"),
        ({"url": URL + "\x00"}, "url:"),
        ({"description": "note\x00"}, "description:"),
        ({"name": BIG}, "name: at most 64"),
        ({"url": "https://hooks.example.com/" + BIG}, "url: at most 2048"),
        ({"events": BIG}, "events: at most 2000"),
        ({"description": BIG}, "description: at most 1000"),
        ({"events": "no.such.type"}, "events:"),
        ({"format": "xml<b>"}, "format:"),
        ({"url": "http://127.0.0.1:9/"}, "url:"),
        ({"url": "http://１２７.0.0.1:9/"}, "url: １２７.0.0.1 (127.0.0.1) is a loopback"),  # noqa: RUF001
        ({"url": "http://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ:9/"}, "url: ⓛⓞⓒⓐⓛⓗⓞⓢⓣ (localhost) is a loopback"),
        ({"url": "http://a..b/"}, "url: the host a..b is no host name"),
        ({"name": ""}, "name:"),
    ],
)
@pytest.mark.anyio
async def test_a_refused_form_says_why_by_name_and_keeps_what_was_typed(
    store: Store, http: Any, fields: dict[str, str], named: str
) -> None:
    client, token = http
    typed = {"name": "ci-bot", "url": URL, "events": "", "format": "standard", "payload": "full"}
    typed |= {"description": "kept <b>as typed</b>"} | fields
    answer = await client.post("/console/endpoints/new", **form(token, **typed))
    assert answer.status_code == 400
    reason = flash_text(answer.text)
    assert reason.startswith(named), reason
    assert len(reason) <= 301
    assert "<script>" not in answer.text and "<b>" not in answer.text  # escaped, never markup
    assert "\x00" not in answer.text
    for key in ("url", "description"):
        if len(typed[key]) <= 2048:
            assert field_value(answer.text, key) == typed[key].replace("\x00", "\ufffd")
    assert store.endpoints.stored_endpoints() == []


@pytest.mark.anyio
async def test_a_create_past_delivery_max_endpoints_is_refused_in_one_line(store: Store) -> None:
    """Issue 26 item 6: the console's create is bounded as the API's is."""
    async with logged_in(app_for(AsyncStore(store), delivery={"max_endpoints": 1})) as http:
        client, token = http
        await create(client, token, "ci-bot")
        refused = await client.post(
            "/console/endpoints/new", **form(token, name="second", url=URL, events="session.*")
        )
        assert refused.status_code == 409
        reason = flash_text(refused.text)
        assert reason.startswith("no more endpoints can be created at run time: "), reason
        assert "delivery.max_endpoints is 1 (the store holds 1)" in reason
    assert [e.name for e in store.endpoints.stored_endpoints()] == ["ci-bot"]


# --------------------------------------------------------------------------- edit, delete


@pytest.mark.anyio
async def test_edit_changes_the_definition_and_a_refused_edit_changes_nothing(
    store: Store, created: Any
) -> None:
    client, token, secret = created
    answer = await client.post(
        "/console/endpoints/ci-bot/edit",
        **form(
            token,
            url="https://hooks.example.com/v2",
            events="",
            format="cloudevents",
            payload="full",
            description="moved",
        ),
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/endpoints/ci-bot"
    edited = store.endpoints.stored_endpoint("ci-bot")
    assert edited is not None
    assert edited.spec == {"url": "https://hooks.example.com/v2", "format": "cloudevents"}
    assert edited.description == "moved" and edited.secret == secret
    shown = await client.get("/console/endpoints/ci-bot")
    assert flash_text(shown.text) == "endpoint ci-bot saved"
    refused = await client.post(
        "/console/endpoints/ci-bot/edit",
        **form(token, url=HOSTILE_URL, events="", format="standard", payload="full"),
    )
    assert refused.status_code == 400 and flash_text(refused.text).startswith("url:")
    assert field_value(refused.text, "url") == HOSTILE_URL
    assert "<script>" not in refused.text
    assert store.endpoints.stored_endpoint("ci-bot") == edited


@pytest.mark.anyio
async def test_an_edit_checks_the_template_it_keeps_in_a_child_and_refuses_it_over_budget(
    store: Store, http: Any
) -> None:
    """Issue 26 item 2: the form does not show a template, but an edit checks the one it
    keeps against the samples, as a create through the API does (in a child process): one
    written into the store past that check (the issue's 25 doublings) is refused by name."""
    client, token = http
    doubling = (
        '{% set ns = namespace(s="12345678") %}{% for i in range(25) %}'
        '{% set ns.s = ns.s ~ ns.s %}{% endfor %}{"n": {{ ns.s | length }}}'
    )
    spec = {"url": URL, "template": doubling}
    store.endpoints.create_endpoint(EndpointSpec("big", URL, ("*",), {}, None, spec), SECRET_OF)
    before = store.endpoints.stored_endpoint("big")
    refused = await client.post(
        "/console/endpoints/big/edit",
        **form(token, url=URL, events="", format="standard", payload="full", description="x"),
    )
    assert refused.status_code == 400
    assert flash_text(refused.text).startswith("template over its size budget of")
    assert store.endpoints.stored_endpoint("big") == before


@pytest.mark.anyio
async def test_a_urls_user_info_is_never_shown_and_an_edit_keeps_it(
    store: Store, http: Any
) -> None:
    client, token = http
    with_password = "https://bot:hunter2-pass@hooks.example.com/ci"
    config = Config.model_validate({})
    definition, secret = edits.define_endpoint(config, "ci-bot", {"url": with_password})
    edits.create_endpoint(store, config, definition, secret)
    for page in ("/console", "/console/endpoints/ci-bot"):
        shown = (await client.get(page)).text
        assert "hunter2" not in shown and "[redacted]@hooks.example.com/ci" in shown, page
    redacted = field_value((await client.get("/console/endpoints/ci-bot")).text, "url")
    answer = await client.post(
        "/console/endpoints/ci-bot/edit",
        **form(token, url=redacted, events="", format="standard", payload="full", description="d"),
    )
    assert answer.status_code == 303
    kept = store.endpoints.stored_endpoint("ci-bot")
    assert kept is not None and kept.spec["url"] == with_password and kept.description == "d"


@pytest.mark.anyio
async def test_delete_needs_the_name_typed_again(store: Store, created: Any) -> None:
    client, token, _ = created
    unconfirmed = await client.post("/console/endpoints/ci-bot/delete", **form(token, confirm="y"))
    assert unconfirmed.status_code == 303
    page = await client.get(unconfirmed.headers["location"])
    assert flash_text(page.text) == "delete: type ci-bot to confirm"
    assert store.endpoints.stored_endpoint("ci-bot") is not None
    done = await client.post("/console/endpoints/ci-bot/delete", **form(token, confirm="ci-bot"))
    assert done.status_code == 303 and done.headers["location"] == "/console"
    assert store.endpoints.stored_endpoint("ci-bot") is None
    overview = (await client.get("/console")).text
    assert flash_text(overview) == "endpoint ci-bot deleted; 0 open deliveries closed"
    assert 'href="/console/endpoints/ci-bot"' not in overview


# --------------------------------------------------------------------------- rotate


@pytest.mark.anyio
async def test_rotate_shows_the_new_secret_once_and_keeps_the_old_for_the_overlap(
    store: Store, created: Any
) -> None:
    client, token, first = created
    answer = await client.post("/console/endpoints/ci-bot/rotate", **form(token, overlap="1h"))
    assert answer.status_code == 200
    assert answer.headers["cache-control"] == "no-store" and "set-cookie" not in answer.headers
    found = SECRET.search(answer.text)
    assert found is not None and found.group(1) != first
    stored = store.endpoints.stored_endpoint("ci-bot")
    assert stored is not None and stored.secret == found.group(1)
    assert stored.previous_secret == first and stored.previous_until == NOW + 3600
    assert stored.secrets_at(NOW + 3599) == (found.group(1), first)
    bad = await client.post("/console/endpoints/ci-bot/rotate", **form(token, overlap="forever"))
    assert bad.status_code == 303
    assert flash_text((await client.get(bad.headers["location"])).text).startswith("overlap:")
    too_long = await client.post("/console/endpoints/ci-bot/rotate", **form(token, overlap="90d"))
    assert too_long.status_code == 303
    assert store.endpoints.stored_endpoint("ci-bot") == stored


CACHE_HEADERS = ("cache-control", "pragma", "expires")


def cache_headers(answer: httpx.Response) -> dict[str, str | None]:
    return {name: answer.headers.get(name) for name in CACHE_HEADERS}


@pytest.mark.anyio
async def test_every_answer_that_shows_a_secret_is_kept_by_no_cache(http: Any) -> None:
    """The console's page of a new secret and the API's answers that carry one
    (``POST /v1/endpoints``, ``:rotateSecret``) say the same: no-store, no-cache."""
    client, token = http
    console = [
        await client.post(
            "/console/endpoints/new",
            **form(token, name="by-page", url=URL, events="session.*", format="standard"),
        ),
        await client.post("/console/endpoints/by-page/rotate", **form(token, overlap="1h")),
    ]
    bearer = {"authorization": f"Bearer {TOKEN}"}
    api = [
        await client.post(
            "/v1/endpoints",
            json={"name": "by-api", "url": URL, "events": ["session.*"]},
            headers=bearer,
        ),
        await client.post(
            "/v1/endpoints/by-api:rotateSecret", json={"overlap": "1h"}, headers=bearer
        ),
    ]
    assert [a.status_code for a in console + api] == [201, 200, 201, 200]
    assert all("secret" in a.json() for a in api)
    expected = cache_headers(console[0])
    assert expected["cache-control"] == "no-store" and expected["pragma"] == "no-cache"
    assert [cache_headers(a) for a in console + api] == [expected] * 4


# --------------------------------------------------------------------------- config file


@pytest.mark.anyio
async def test_an_endpoint_of_the_config_file_is_read_only(store: Store, http: Any) -> None:
    client, token = http
    store.endpoints.sync_endpoints([Ep("alpha")])
    overview = (await client.get("/console")).text
    row = re.search(r'<tr data-endpoint="alpha">(.*?)</tr>', overview, re.S)
    assert row is not None
    assert "from the config file: read-only" in row.group(1)
    assert "/console/endpoints/alpha" not in row.group(1)
    page = (await client.get("/console/endpoints/alpha")).text
    assert "from the config file: read-only" in page
    assert "<form" not in page.split("<main>")[1]
    before = store.endpoints.endpoint_states()
    for verb, fields in (
        ("edit", {"url": URL + "/x", "format": "standard", "payload": "full"}),
        ("rotate", {"overlap": "1h"}),
        ("delete", {"confirm": "alpha"}),
    ):
        answer = await client.post(f"/console/endpoints/alpha/{verb}", **form(token, **fields))
        if answer.status_code == 303:
            answer = await client.get(answer.headers["location"])
        assert "config file" in flash_text(answer.text), verb
    assert store.endpoints.endpoint_states() == before
    assert store.endpoints.stored_endpoints() == []


# --------------------------------------------------------------------------- CSRF


@pytest.mark.anyio
async def test_every_endpoint_post_without_its_csrf_token_is_refused_unchanged(
    store: Store, created: Any
) -> None:
    client, token, _ = created
    before = store.endpoints.stored_endpoint("ci-bot")
    posts = [
        ("/console/endpoints/new", {"name": "other", "url": URL}),
        ("/console/endpoints/ci-bot/edit", {"url": URL + "/x"}),
        ("/console/endpoints/ci-bot/rotate", {"overlap": "1h"}),
        ("/console/endpoints/ci-bot/delete", {"confirm": "ci-bot"}),
    ]
    for path, fields in posts:
        missing = await client.post(path, data=fields)
        wrong = await client.post(path, data={**fields, "csrf_token": token[:-2] + "xx"})
        assert (missing.status_code, wrong.status_code) == (403, 403), path
        assert "whsec_" not in missing.text + wrong.text
    assert store.endpoints.stored_endpoint("ci-bot") == before
    assert [e.name for e in store.endpoints.stored_endpoints()] == ["ci-bot"]
