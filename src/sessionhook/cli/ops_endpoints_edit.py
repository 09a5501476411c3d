"""``sessionhook endpoints create|update|delete|rotate-secret``: endpoints created at run
time, in the store (:mod:`sessionhook.relay.ops.endpoint_edits`). A secret is printed once;
one chosen by the operator comes from the environment (``--secret-env``), never argv.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import click

from ..wording import counted
from ._output import CliError
from .ops import (
    Where,
    json_option,
    operator_options,
    relay_url_operator_options,
    show,
    store_target,
)
from .ops_endpoints import endpoints
from .remote import call

if TYPE_CHECKING:
    from ..relay.config import Config
    from ..relay.domain.api_models import ApiEndpoint


def _definition_options(fn: Any) -> Any:
    """The keys of ``[[endpoints]]`` an endpoint created at run time may set."""
    options = [
        click.option("--url", help="Where to POST (http or https)."),
        click.option(
            "--events",
            "--event",
            "events",
            multiple=True,
            metavar="TYPE,...",
            help="Event types (globs: 'session.*'), comma-separated or repeated.",
        ),
        click.option("--account", "accounts", multiple=True, help="Only this account's events."),
        click.option("--payload", type=click.Choice(["full", "thin"])),
        click.option(
            "--format",
            "shape",
            type=click.Choice(
                ["standard", "cloudevents", "slack", "discord", "google_chat", "teams"]
            ),
        ),
        click.option(
            "--template-file",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help="A Jinja2 template of the body (instead of --format).",
        ),
        click.option("--content-type", help="What --template-file renders."),
        click.option(
            "--filter",
            "filters",
            multiple=True,
            metavar="PATH=GLOB",
            help="Only events whose payload matches (repeat; all must match).",
        ),
        click.option("--rate-limit", type=float, help="At most this many deliveries a second."),
        click.option("--disable-after", help="Disabled after failing this long (5d)."),
        click.option("--description", help="What the endpoint is for."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _spec(
    url: str | None,
    events: tuple[str, ...],
    accounts: tuple[str, ...],
    payload: str | None,
    shape: str | None,
    template_file: Path | None,
    content_type: str | None,
    filters: tuple[str, ...],
    rate_limit: float | None,
    disable_after: str | None,
) -> dict[str, Any]:
    """The keys the options set (those not given are left out)."""
    conditions: dict[str, list[str]] = {}
    for item in filters:
        path, sep, glob = item.partition("=")
        if not sep or not path or not glob:
            raise click.BadParameter(f"{item!r} is not PATH=GLOB", param_hint="--filter")
        conditions.setdefault(path, []).append(glob)
    values: dict[str, Any] = {
        "url": url,
        "events": [glob.strip() for item in events for glob in item.split(",") if glob.strip()]
        or None,
        "accounts": list(accounts) or None,
        "payload": payload,
        "format": shape,
        "template": None if template_file is None else template_file.read_text("utf-8"),
        "content_type": content_type,
        "filter": conditions or None,
        "rate_limit": rate_limit,
        "disable_after": disable_after,
    }
    return {key: value for key, value in values.items() if value is not None}


def _config(where: Where) -> Config:
    """The daemon's config (its endpoints' names, accounts, address rule); with ``--db``
    alone, the defaults (the store's names are checked all the same)."""
    from ..relay.config import Config

    if where.db_path is not None and where.config_path is None:
        return Config.model_validate({})
    target = store_target(where.config_path, None)
    assert target.config is not None
    return target.config


def _secret_from(env: str | None) -> str | None:
    if env is None:
        return None
    value = os.environ.get(env)
    if not value:
        raise CliError(f"--secret-env {env}: the variable is not set", exit_code=2)
    return value.strip()


def _given(answer: ApiEndpoint, key: str, url: str, path: str) -> Any:
    """``key`` of a create's or a rotation's answer (a one-line error without it)."""
    if (value := getattr(answer, key)) is None:
        raise CliError(f"{url.rstrip('/')}{path}: the answer has no {key}")
    return value


@endpoints.command("create")
@click.argument("name")
@_definition_options
@click.option("--secret-env", metavar="VAR", help="Sign with the secret in $VAR (default: new).")
@relay_url_operator_options
@json_option
def endpoints_create(
    name: str,
    description: str | None,
    secret_env: str | None,
    where: Where,
    as_json: bool,
    **options: Any,
) -> None:
    """Create endpoint NAME in the store (every replica delivers to it); its secret is
    printed once. With --relay-url, through a running relay (POST /v1/endpoints)."""
    from ..relay.domain.api_models import ApiEndpoint
    from ..relay.ops import endpoint_edits as edits

    if options.get("url") is None:
        raise click.UsageError("give --url")
    if (relay_url := where.relay()) is not None:
        body = {"name": name, **_spec(**options), "description": description or ""}
        if secret_env is not None:
            body["secret"] = _secret_from(secret_env)
        answer = call(relay_url, where.token, "POST", "/v1/endpoints", ApiEndpoint, body=body)
        shown = str(_given(answer, "secret", relay_url, "/v1/endpoints"))
        show(answer, as_json, _created_line(name, shown))
        return
    config = _config(where)
    definition, secret = edits.define_endpoint(
        config,
        name,
        _spec(**options),
        description=description or "",
        secret=_secret_from(secret_env),
    )
    with where.writing() as store:
        edits.create_endpoint(store, config, definition, secret)
        (answer,) = edits.endpoint_answers(store, config, time.time(), name)
    show(answer.model_copy(update={"secret": secret}), as_json, _created_line(name, secret))


def _created_line(name: str, secret: str) -> str:
    return f"endpoint {name} created\nsecret (shown once, keep it): {secret}"


@endpoints.command("update")
@click.argument("name")
@_definition_options
@click.option("--unset", "unset", multiple=True, metavar="KEY", help="Back to the default.")
@relay_url_operator_options
@json_option
def endpoints_update(
    name: str,
    description: str | None,
    unset: tuple[str, ...],
    where: Where,
    as_json: bool,
    **options: Any,
) -> None:
    """Change endpoint NAME (one created at run time; the config file's are the file's).
    With --relay-url, through a running relay (PATCH /v1/endpoints/NAME)."""
    from ..relay.domain.api_models import ApiEndpoint
    from ..relay.ops import endpoint_edits as edits

    changes: dict[str, Any] = {**_spec(**options), **{key: None for key in unset}}
    if (relay_url := where.relay()) is not None:
        body = changes if description is None else {**changes, "description": description}
        answer = call(relay_url, where.token, "PATCH", _path(name), ApiEndpoint, body=body)
    else:
        config = _config(where)
        with where.writing() as store:
            current = edits.stored_or_refused(store, config, name)
            definition = edits.redefine_endpoint(config, current, changes, description=description)
            edits.update_endpoint(store, definition)
            (answer,) = edits.endpoint_answers(store, config, time.time(), name)
    show(answer, as_json, f"endpoint {name} updated")


@endpoints.command("delete")
@click.argument("name")
@operator_options
@json_option
def endpoints_delete(name: str, where: Where, as_json: bool) -> None:
    """Delete endpoint NAME (created at run time): its open deliveries become dead, its
    history stays."""
    from ..relay.domain.api_models import ApiEndpointDeleted
    from ..relay.ops import endpoint_edits as edits

    if (url := where.relay()) is not None:
        deleted = call(url, where.token, "DELETE", _path(name), ApiEndpointDeleted)
        closed, reason = deleted.deliveries_closed, deleted.deliveries_closed_reason
    else:
        config = _config(where)
        with where.writing() as store:
            closed = edits.delete_endpoint(store, config, name)
        reason = edits.DELETED_REASON
    show(
        {"name": name, "deleted": True, "deliveries_closed": closed},
        as_json,
        f"endpoint {name} deleted; {counted(closed, 'open delivery', 'open deliveries')} "
        f"{'is' if closed == 1 else 'are'} now dead ({reason})",
    )


def _path(name: str) -> str:
    return f"/v1/endpoints/{quote(name, safe='')}"


@endpoints.command("rotate-secret")
@click.argument("name")
@click.option(
    "--overlap", default="24h", show_default=True, help="How long the old secret signs too."
)
@click.option("--secret-env", metavar="VAR", help="The new secret from $VAR (default: new).")
@operator_options
@json_option
def endpoints_rotate(
    name: str, overlap: str, secret_env: str | None, where: Where, as_json: bool
) -> None:
    """Give endpoint NAME a new secret; the old one signs beside it for --overlap."""
    from ..relay.config import parse_duration
    from ..relay.domain.api_models import ApiEndpoint, json_stamp
    from ..relay.ops import endpoint_edits as edits

    try:
        seconds = parse_duration(overlap)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--overlap") from None
    if (url := where.relay()) is not None:
        body: dict[str, Any] = {"overlap": seconds}
        if secret_env is not None:
            body["secret"] = _secret_from(secret_env)
        path = _path(name) + ":rotateSecret"
        answer = call(url, where.token, "POST", path, ApiEndpoint, body=body)
        secret = str(_given(answer, "secret", url, path))
        until = json_stamp(_given(answer, "previous_secret_expires_at", url, path))
    else:
        config = _config(where)
        with where.writing() as store:
            done = edits.rotate_secret(
                store,
                config,
                name,
                now=time.time(),
                overlap=seconds,
                secret=_secret_from(secret_env),
            )
        secret, until = done.secret, json_stamp(done.previous_until)
    show(
        {"name": name, "secret": secret, "previous_secret_expires_at": until},
        as_json,
        f"endpoint {name}: new secret (shown once, keep it): {secret}\n"
        f"the previous secret signs too until {until}",
    )
