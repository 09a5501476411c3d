"""``sessionhook endpoints list|enable|disable|test``.

Views of :mod:`sessionhook.relay.ops` (the web console's actions are the same
functions); the plumbing is :mod:`.ops`'s.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from ..redact import redact_userinfo
from . import cli
from ._output import CliError, current_runtime, echo_json, render_fields, render_table
from ._output import run as run_async
from .ops import (
    age,
    json_option,
    reading_store,
    reported,
    stamp,
    store_options,
    store_target,
    writing_store,
)

if TYPE_CHECKING:
    from ..relay.domain.retry import AttemptResult

__all__ = ["endpoints"]


@cli.group("endpoints")
def endpoints() -> None:
    """Webhook endpoints: list, enable, disable, test."""


@endpoints.command("list")
@store_options
@json_option
@reported
def endpoints_list(config_path: str | None, db_path: str | None, as_json: bool) -> None:
    """Every endpoint the daemon knows, with its state and backlog."""
    from ..relay import ops as operator

    now = time.time()
    with reading_store(config_path, db_path) as store:
        known = operator.endpoints(store)
        claims = operator.endpoints_in_flight(store, now)  # per endpoint: replica -> n
    if as_json:
        from ..relay.ops.wire import endpoint_json

        echo_json([endpoint_json(s, pending, claims.get(s.name)) for s, pending in known])
        return
    if not known:
        click.echo("no endpoints yet (the daemon adds them from its config when it starts)")
        return
    rows = []
    for s, pending in known:
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
                pending,
                " ".join(f"{n} on {r}" for r, n in sorted(claims.get(s.name, {}).items())),
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
@store_options
@reported
def endpoints_enable(name: str, config_path: str | None, db_path: str | None) -> None:
    """Enable NAME again; what waited for it (and replays) is delivered."""
    from ..relay import ops as operator

    with writing_store(config_path, db_path) as store:
        waiting = operator.enable_endpoint(store, name)
    click.echo(f"endpoint {name} enabled; {waiting} deliveries waiting")


@endpoints.command("disable")
@click.argument("name")
@click.option("--reason", default="disabled by an operator", show_default=True)
@store_options
@reported
def endpoints_disable(name: str, reason: str, config_path: str | None, db_path: str | None) -> None:
    """Stop delivering to NAME; its events keep being archived (replay them later)."""
    from ..relay import ops as operator

    with writing_store(config_path, db_path) as store:
        operator.disable_endpoint(store, name, reason)
    click.echo(f"endpoint {name} disabled: {reason}")


@endpoints.command("test")
@click.argument("name")
@click.option("--config", "config_path", metavar="FILE", help="The daemon's config.")
@reported
def endpoints_test(name: str, config_path: str | None) -> None:
    """Send NAME a signed `ping` event and show the answer (exit 1 unless 2xx).

    Signed with the endpoint's secret(s) from the config (or the store, for one created
    at run time), like every delivery, shaped by
    its payload/format/template, and subject to the same address check. The ping does not
    enter the outbox.
    """
    from ..relay import ops as operator

    target = store_target(config_path, None, need_config=True)
    assert target.config is not None
    config = target.config
    endpoint = config.endpoint_by_name(name)
    if endpoint is None:  # one created at run time, in the store
        from ..relay.ops import endpoint_edits

        with reading_store(config_path, None) as store:
            endpoint = endpoint_edits.endpoint_config(store, config, name, time.time())
    runtime = current_runtime()
    # The daemon's transport: the name is resolved once, every address vetted, and the
    # connection made to a vetted address (a literal private URL failed loading the config).
    transport = runtime.transport or operator.ping_transport(
        config, resolve=runtime.resolve, policy=runtime.address_policy
    )

    async def send() -> tuple[str, AttemptResult]:
        return await operator.test_endpoint(
            config, name, transport=transport, now=time.time(), endpoint=endpoint
        )

    event_id, result = run_async(send)
    answer = "no answer" if result.status_code is None else str(result.status_code)
    click.echo(f"POST {redact_userinfo(endpoint.url)}  webhook-id {event_id}")
    click.echo(
        render_fields(
            [
                ("answer", answer),
                ("duration", f"{result.duration_ms:.0f} ms"),
                ("error", result.error),
                ("response", result.response_body),
            ]
        )
    )
    if not result.ok:
        raise CliError(f"{name} did not accept the ping ({result.error or answer})")
