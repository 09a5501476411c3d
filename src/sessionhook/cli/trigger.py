"""``sessionhook trigger TYPE``: one signed sample event, to a configured endpoint (as its
delivery would be), to a running relay's endpoint (``--url``), or to any URL (``--to``);
the work is :mod:`sessionhook.relay.ops.trigger`'s."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING
from urllib.parse import quote

import click

from ..redact import redact_userinfo
from . import cli
from ._output import CliError, consumer_poster, current_runtime, render_table
from ._output import run as run_async
from .ops import StoreTarget, opened_store, reported, store_target
from .remote import post, refuse_store_options, remote_option_pair

if TYPE_CHECKING:
    from ..relay.config import Config
    from ..relay.domain.action_links import ActionLinks
    from ..relay.domain.api_models import ApiTriggered
    from ..relay.domain.retry import AttemptResult

#: How long ``--to`` waits for the whole exchange (an endpoint's: its ``[delivery] timeout``).
TO_TIMEOUT = 15.0


@cli.command("trigger")
@click.argument("event_type", metavar="[TYPE]", required=False)
@click.option("--list", "list_types", is_flag=True, help="List the types, a line each.")
@click.option("--endpoint", "name", metavar="NAME", help="The endpoint to send it to.")
@click.option("--config", "config_path", metavar="FILE", help="The daemon's config.")
@remote_option_pair("--url", "url")
@click.option("--to", "to", metavar="URL", help="Send it to this URL instead of an endpoint.")
@click.option("--secret", metavar="SECRET", help="--to's signing secret (whsec_...).")
@click.option("--secret-env", metavar="VAR", help="--to: the variable holding the signing secret.")
@click.option(
    "--session",
    metavar="SESSION",
    help="Make the sample from this archived session's data (sessions/<id> or <id>).",
)
@reported
def trigger(
    event_type: str | None,
    list_types: bool,
    name: str | None,
    config_path: str | None,
    url: str | None,
    token: str | None,
    to: str | None,
    secret: str | None,
    secret_env: str | None,
    session: str | None,
) -> None:
    """Send a signed sample event of TYPE now and show the answer (exit 1 unless 2xx).

    To the endpoint NAME of the config (--endpoint NAME --config FILE), rendered through
    its format, template, payload and filters as its delivery would be and signed with its
    secret(s); through a running relay (--endpoint NAME --url RELAY); or to any URL
    (--to URL with --secret or --secret-env). The sample is marked: webhook-id
    msg_trigger_..., data.sample true; it is never archived, retried or counted as a
    delivery. --list shows every type.
    """
    from ..relay.ops import trigger as triggering

    if list_types:
        given = [event_type, name, config_path, url, to, secret, secret_env, session]
        if any(v is not None for v in given):
            raise click.UsageError("--list takes no other argument or option")
        click.echo(render_table(("TYPE", "THE SAMPLE"), triggering.trigger_types()))
        return
    if event_type is None:
        raise click.UsageError("give an event type (sessionhook trigger --list shows them)")
    triggering.check_type(event_type)
    if (name is None) == (to is None):
        raise click.UsageError("give --endpoint NAME or --to URL (one of them)")
    if to is not None:
        _refuse_beside("--to", config_path=config_path, url=url, session=session)
        _print_answer(event_type, to, *_send_to(event_type, to, secret, secret_env))
        return
    assert name is not None
    _refuse_beside("--endpoint", secret=secret, secret_env=secret_env)
    from ..api.client import session_name

    try:
        session = session_name(session) if session is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--session") from None
    if url is not None:
        from ..relay.domain.api_models import ApiTriggered

        refuse_store_options(config_path, None)
        path = f"/v1/endpoints/{quote(name, safe='')}:trigger"
        answer = post(url, token, path, ApiTriggered, {"type": event_type, "session": session})
        _print_answer(event_type, name, answer.webhook_id, answer)
        return
    _print_answer(event_type, name, *_send_local(event_type, name, config_path, session))


def _refuse_beside(flag: str, **given: str | None) -> None:
    """A usage error naming the options given that ``flag`` does not take."""
    for option, value in given.items():
        if value is not None:
            raise click.UsageError(f"{flag} does not take --{option.replace('_', '-')}")


def _send_to(
    event_type: str, to: str, secret: str | None, secret_env: str | None
) -> tuple[str, AttemptResult]:
    """``--to``: the sample, signed with ``--secret`` or the variable ``--secret-env``."""
    from ..relay.ops import trigger as triggering

    if (secret is None) == (secret_env is None):
        raise click.UsageError("--to needs --secret SECRET or --secret-env VAR (one of them)")
    if secret_env is not None:
        secret = os.environ.get(secret_env)
        if not secret:
            raise CliError(f"--secret-env: ${secret_env} is not set or empty")
    assert secret is not None
    runtime = current_runtime()

    async def send() -> tuple[str, AttemptResult]:
        from ..relay.ops import forwarding

        async with forwarding.forward_poster(runtime.transport) as poster:
            return await triggering.trigger_url(
                to, secret, event_type, poster=poster, now=time.time(), timeout=TO_TIMEOUT
            )

    return run_async(send)


def _send_local(
    event_type: str, name: str, config_path: str | None, session: str | None
) -> tuple[str, AttemptResult]:
    """``--endpoint NAME`` on the config: its endpoint (or one created at run time, in the
    store), its action-link key with ``[actions]`` on, the archived ``session``."""
    from ..relay.ops import trigger as triggering
    from ..relay.ops.ping import configured_endpoint

    target = store_target(config_path, None, secrets_of=name)
    assert target.config is not None
    config = target.config
    endpoint = config.endpoint_by_name(name)
    if endpoint is None and session is None and not _has_store(target):
        configured_endpoint(config, name, None)  # no store to hold one: names the known
    real = None
    if endpoint is None or session is not None:
        with opened_store(config_path, None, readonly=True) as store:
            if endpoint is None:  # one created at run time, in the store
                from ..relay.ops import endpoint_edits

                endpoint = endpoint_edits.endpoint_config(store, config, name, time.time())
            if session is not None:
                real = triggering.archived_session(store, session)
    links = _links(config)
    runtime = current_runtime()

    async def send() -> tuple[str, AttemptResult]:
        async with consumer_poster(config) as poster:
            return await triggering.trigger_endpoint(
                config,
                name,
                event_type,
                poster=poster,
                now=time.time(),
                links=links,
                endpoint=endpoint,
                session=real,
                policy=runtime.address_policy,
            )

    return run_async(send)


def _has_store(target: StoreTarget) -> bool:
    return target.database_url() is not None or target.path.is_file()


def _links(config: Config) -> ActionLinks | None:
    """What signs the sample's action links: the relay's own key with ``[actions]`` on, so
    that they open its pages (which say it is a sample). The key file is the daemon's to
    make: before it exists, the sample goes without links (and says so)."""
    if not config.actions.enabled:
        return None
    key_file = config.actions.key_file
    if key_file is None or not key_file.exists():
        click.echo(
            f"note: no action-link key at {key_file} yet (the daemon makes it when it "
            "starts): the sample has no links",
            err=True,
        )
        return None
    from ..relay.config.action_keys import LinkKeys

    return LinkKeys(lambda: config).links()


def _print_answer(
    event_type: str, where: str, webhook_id: str, result: AttemptResult | ApiTriggered
) -> None:
    """One line: the answer's status and time; a :class:`CliError` unless it was 2xx."""
    status_code, error, duration = result.status_code, result.error, result.duration_ms
    answer = "no answer" if status_code is None else str(status_code)
    click.echo(
        f"{answer} in {duration:.0f} ms: {event_type} to {redact_userinfo(where)} "
        f"(webhook-id {webhook_id})"
    )
    if status_code is None or not 200 <= status_code < 300:
        raise CliError(f"the sample was not accepted ({error or answer})")
