"""``sessionhook endpoints list|enable|disable|test``: views of :mod:`sessionhook.relay.ops`
(the console's actions are the same functions); the plumbing is :mod:`.ops`'s."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote

import click

from ..redact import redact_userinfo
from . import cli
from ._output import CliError, consumer_poster, current_runtime, render_fields, render_table
from ._output import run as run_async
from .ops import (
    Where,
    age,
    json_option,
    opened_store,
    operator_options,
    reported,
    show,
    stamp,
    store_target,
)
from .remote import get, get_pages, post, refuse_store_options, remote_option_pair

if TYPE_CHECKING:
    from ..relay.domain.api_models import ApiEndpointState, ApiPing
    from ..relay.domain.retry import AttemptResult


@cli.group("endpoints")
def endpoints() -> None:
    """Webhook endpoints: list, create, update, delete, enable, disable, test,
    rotate-secret."""


@endpoints.command("list")
@operator_options
@json_option
def endpoints_list(where: Where, as_json: bool) -> None:
    """Every endpoint the daemon knows, with its state and backlog."""
    now = time.time()
    if (url := where.relay()) is not None:
        from ..relay.domain.api_models import ApiEndpointStatePage

        # The API's answer has each endpoint's definition too: left out, as the local
        # command has none.
        known = get_pages(url, where.token, "/v1/endpoints", ApiEndpointStatePage, {}, 10_000)
    else:
        from ..relay import ops as operator
        from ..relay.ops.wire import endpoint_state_answer

        with where.reading() as store:
            listed = operator.endpoints(store)
            claims = operator.endpoints_in_flight(store, now)  # per endpoint: replica -> n
        known = [endpoint_state_answer(s, n, claims.get(s.name)) for s, n in listed]
    empty = "no endpoints yet (the daemon adds them from its config when it starts)"
    show(known, as_json, lambda: _print_endpoints(known, now), empty=empty)


def _print_endpoints(known: Sequence[ApiEndpointState], now: float) -> None:
    """The table of ``endpoints list``: state, backlog, in flight per replica."""
    rows = []
    for s in known:
        if not s.configured:
            state = "not in config"
        elif s.enabled:
            state = "enabled"
        else:
            state = f"disabled {age(now - s.disabled_at) + ' ago' if s.disabled_at else ''}"
        rows.append(
            [
                s.name,
                state.strip(),
                s.pending,
                " ".join(f"{n} on {r}" for r, n in sorted(s.in_flight.items())),
                stamp(s.last_success_at) or "never",
                f"{age(now - s.failing_since)}" if s.failing_since else "",
                s.disabled_reason,
                s.url,
            ]
        )
    headers = ["NAME", "STATE", "PENDING", "IN FLIGHT", "LAST SUCCESS", "FAILING FOR", "REASON"]
    headers.append("URL")
    click.echo(render_table(headers, rows))


@endpoints.command("enable")
@click.argument("name")
@operator_options
def endpoints_enable(name: str, where: Where) -> None:
    """Enable NAME again; what waited for it (and replays) is delivered."""
    from ..relay import ops as operator

    if (url := where.relay()) is not None:
        from ..relay.domain.api_models import ApiEndpoint

        path = f"/v1/endpoints/{quote(name, safe='')}:enable"
        waiting = post(url, where.token, path, ApiEndpoint).pending
    else:
        with where.writing() as store:
            waiting = operator.enable_endpoint(store, name)
    click.echo(operator.enabled_line(name, waiting))


@endpoints.command("disable")
@click.argument("name")
@click.option("--reason", default="disabled by an operator", show_default=True)
@operator_options
def endpoints_disable(name: str, reason: str, where: Where) -> None:
    """Stop delivering to NAME; its events keep being archived (replay them later)."""
    from ..relay import ops as operator

    if (url := where.relay()) is not None:
        from ..relay.domain.api_models import ApiEndpoint

        path = f"/v1/endpoints/{quote(name, safe='')}:disable"
        post(url, where.token, path, ApiEndpoint, {"reason": reason})
    else:
        with where.writing() as store:
            operator.disable_endpoint(store, name, reason)
    click.echo(f"endpoint {name} disabled: {reason}")


@endpoints.command("test")
@click.argument("name")
@click.option("--config", "config_path", metavar="FILE", help="The daemon's config.")
@remote_option_pair("--url", "url")
@reported
def endpoints_test(name: str, config_path: str | None, url: str | None, token: str | None) -> None:
    """Send NAME a signed `ping` event and show the answer (exit 1 unless 2xx).

    Signed with the endpoint's secret(s) from the config (or the store, for one created
    at run time), like every delivery, shaped by
    its payload/format/template, and subject to the same address check. The ping does not
    enter the outbox. With --url the relay sends it (its answer has no webhook-id).
    """
    if url is not None:
        from ..relay.domain.api_models import ApiEndpoint, ApiPing

        refuse_store_options(config_path, None)
        path = f"/v1/endpoints/{quote(name, safe='')}"
        target_url = get(url, token, path, ApiEndpoint).url
        _print_ping(name, target_url, None, post(url, token, path + ":test", ApiPing))
        return
    from ..relay import ops as operator

    target = store_target(config_path, None, secrets_of=name)
    assert target.config is not None
    config = target.config
    endpoint = config.endpoint_by_name(name)
    if endpoint is None:  # one created at run time, in the store
        from ..relay.ops import endpoint_edits

        with opened_store(config_path, None, readonly=True) as store:
            endpoint = endpoint_edits.endpoint_config(store, config, name, time.time())
    runtime = current_runtime()

    async def send() -> tuple[str, AttemptResult]:
        async with consumer_poster(config) as poster:
            return await operator.test_endpoint(
                config,
                name,
                poster=poster,
                now=time.time(),
                endpoint=endpoint,
                policy=runtime.address_policy,
            )

    event_id, result = run_async(send)
    _print_ping(name, endpoint.url, event_id, result)


def _print_ping(name: str, url: str, event_id: str | None, result: AttemptResult | ApiPing) -> None:
    """What ``endpoints test`` prints; a :class:`CliError` unless the answer was 2xx."""
    status_code, error = result.status_code, result.error
    answer = "no answer" if status_code is None else str(status_code)
    sent = f"  webhook-id {event_id}" if event_id is not None else ""
    click.echo(f"POST {redact_userinfo(url)}{sent}")
    click.echo(
        render_fields(
            [
                ("answer", answer),
                ("duration", f"{result.duration_ms:.0f} ms"),
                ("error", error),
                ("response", result.response_body),
            ]
        )
    )
    if status_code is None or not 200 <= status_code < 300:
        raise CliError(f"{name} did not accept the ping ({error or answer})")
