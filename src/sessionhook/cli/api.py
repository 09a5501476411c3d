"""``sessionhook sessions|activities|sources``: every call of the Sessions API, by hand.

The service is named as the daemon names it (:func:`service`): ``--base-url`` >
``$SESSIONHOOK_BASE_URL`` > the config's ``api.base_url`` > ``http://127.0.0.1:8080``;
the API key is ``$SESSIONHOOK_API_KEY``, else the config's, never argv. A failed call is one
line on stderr and exit status 1; a configuration problem exit status 2.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

from . import cli
from ._output import (
    DEFAULT_CONFIG,
    ENV_CONFIG,
    CliError,
    config_path,
    current_runtime,
    echo_json,
    handle_errors,
    http_client,
    load_daemon_config,
    register_user_error,
)
from ._output import run as run_async
from .api_text import (
    activity_details,
    activity_table,
    session_details,
    session_table,
    source_details,
    source_table,
)

if TYPE_CHECKING:
    # The client (httpx, pydantic: about 0.3 s of CPU) is imported when a command calls
    # the service, not by `--help` or a usage error.
    from ..api.client import SessionsClient

ENV_BASE_URL: Final = "SESSIONHOOK_BASE_URL"
ENV_API_KEY: Final = "SESSIONHOOK_API_KEY"
DEFAULT_BASE_URL: Final = "http://127.0.0.1:8080"
#: Someone waits at a terminal: give up after about 3 s of backoff, not the library's 15.
CLI_ATTEMPTS: Final = 3

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- plumbing


@dataclass(frozen=True)
class ApiOptions:
    """The options every API command takes (``None``: not given)."""

    base_url: str | None  # --base-url or $SESSIONHOOK_BASE_URL
    api_key_header: str | None
    config_path: str | None
    account: str | None
    timeout: float
    as_json: bool


@dataclass(frozen=True)
class Service:
    """The service a command calls, and how: see :func:`service`."""

    base_url: str
    api_key: str
    api_key_header: str


def service(api: ApiOptions) -> Service:
    """The address, the key and its header: flag > environment > config file > default
    (the key: environment > config file). The config is read when ``--config`` names it,
    or when the address or the key is left to find and a config is found."""
    from ..api.client import DEFAULT_API_KEY_HEADER

    key = os.environ.get(ENV_API_KEY, "").strip() or None
    wanted = api.base_url is None or key is None or api.account is not None
    found = bool(os.environ.get(ENV_CONFIG)) or os.path.isfile(config_path(None))
    if api.config_path is None and not (wanted and found):
        if api.account is not None:
            raise click.UsageError(
                f"--account names one of a config's [[accounts]]: give --config FILE or "
                f"set ${ENV_CONFIG} (no {DEFAULT_CONFIG})"
            )
        return Service(
            api.base_url or DEFAULT_BASE_URL,
            key or _no_key(),
            api.api_key_header or DEFAULT_API_KEY_HEADER,
        )
    from ..relay.config import ConfigError, upstream_account

    register_user_error(ConfigError, exit_code=2)
    config, path = load_daemon_config(api.config_path, resolve_secrets=False)
    if api.account is None and len(config.accounts) > 1:
        names = ", ".join(a.name for a in config.accounts)
        raise click.UsageError(
            f"{path} has {len(config.accounts)} accounts: give --account NAME ({names})"
        )
    account = upstream_account(config, path, api.account, resolve_key=key is None)
    return Service(
        api.base_url or account.base_url,
        key or account.api_key.get_secret_value(),
        api.api_key_header or account.api_key_header,
    )


def _no_key() -> str:
    raise CliError(
        f"${ENV_API_KEY} is not set",
        hint=f"export {ENV_API_KEY}=<your API key> (generated in the service's settings), "
        "or give --config FILE whose [api] names it",
        exit_code=2,
    )


def _check_base_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from ..api.client import api_root

    if value is None:
        return None
    try:
        api_root(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


def api_options(func: Callable[..., None]) -> Callable[..., None]:
    """The options every API command takes, given to it as one ``api: ApiOptions``."""

    @click.option(
        "--config",
        "config_path",
        metavar="FILE",
        help=f"The daemon's config: its api.base_url and API key (default: ${ENV_CONFIG}, "
        f"else {DEFAULT_CONFIG} if it exists).",
    )
    @click.option("--account", metavar="NAME", help="One of the config's [[accounts]].")
    @click.option(
        "--base-url",
        envvar=ENV_BASE_URL,
        show_envvar=True,
        callback=_check_base_url,
        metavar="URL",
        help="Service address; /v1alpha is appended  [default: the config's api.base_url, "
        f"else {DEFAULT_BASE_URL}]",
    )
    @click.option(
        "--api-key-header",
        metavar="NAME",
        # The client's DEFAULT_API_KEY_HEADER, spelled out so that --help needs no client
        # (tests/test_cli_api.py holds the two together).
        help="Header that carries the key  [default: the config's api.api_key_header, else "
        "x-vendor-api-key]",
    )
    @click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=30.0,
        show_default=True,
        help="Seconds to wait for each answer.",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print the wire JSON (for scripts).")
    @functools.wraps(func)
    def wrapper(
        *args: Any,
        config_path: str | None,
        account: str | None,
        base_url: str | None,
        api_key_header: str | None,
        timeout: float,
        as_json: bool,
        **kwargs: Any,
    ) -> None:
        options = ApiOptions(base_url, api_key_header, config_path, account, timeout, as_json)
        func(*args, api=options, **kwargs)

    return wrapper


def _call(api: ApiOptions, action: Callable[[SessionsClient], Awaitable[_T]]) -> _T:
    """Run ``action`` with a client in a fresh event loop; errors become one line."""
    import anyio

    from ..api import RetryPolicy
    from ..api.client import SessionsClient

    with handle_errors():
        named = service(api)
    runtime = current_runtime()

    async def main() -> _T:
        async with http_client(timeout=api.timeout, base_url=named.base_url) as http:
            client = SessionsClient(
                http,
                base_url=named.base_url,
                api_key=named.api_key,
                api_key_header=named.api_key_header,
                timeout=api.timeout,
                retry=RetryPolicy(max_attempts=CLI_ATTEMPTS),
                sleep=runtime.sleep or anyio.sleep,
            )
            return await action(client)

    return run_async(main)


async def _collect(items: AsyncIterator[_T]) -> list[_T]:
    return [item async for item in items]


def _name_arg(kind: str) -> Callable[[click.Context, click.Parameter, str], str]:
    """A click callback making ``value`` the full name of a ``session`` or a ``source``."""

    def callback(ctx: click.Context, param: click.Parameter, value: str) -> str:
        from ..api.client import session_name, source_name

        parse = session_name if kind == "session" else source_name
        try:
            return parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return callback


def _check_time(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from ..api.models import parse_timestamp

    try:
        parse_timestamp(value)
    except ValueError:
        raise click.BadParameter(
            f"not an RFC 3339 timestamp (like 2025-01-31T12:00:00.000000Z): {value!r}",
            ctx=ctx,
            param=param,
        ) from None
    return value


def _text_arg(value: str) -> str:
    """``-`` reads the text from stdin (long prompts, heredocs)."""
    return sys.stdin.read() if value == "-" else value


def _page_options(func: _F) -> _F:
    func = click.option(
        "--all",
        "walk_all",
        is_flag=True,
        help="Walk every page (default: one page, then the next page token).",
    )(func)
    func = click.option("--page-token", help="Token printed by the previous page.")(func)
    return click.option(
        "--page-size",
        type=click.IntRange(1, 100),
        help="Items per page, 1-100 (the service's default when absent).",
    )(func)


def _print_list(
    api: ApiOptions,
    walk_all: bool,
    page_token: str | None,
    key: str,
    table: Callable[[list[Any]], str],
    walk: Callable[[SessionsClient], AsyncIterator[Any]],
    one_page: Callable[[SessionsClient], Awaitable[Any]],
) -> None:
    """Print every item (``--all``: ``walk``) or one page (``one_page``) of a list (the wire
    JSON's ``key``)."""
    if walk_all and page_token:
        raise click.UsageError("--all walks every page from the first; drop --page-token")
    if walk_all:
        items = _call(api, lambda c: _collect(walk(c)))
        if api.as_json:
            echo_json({key: [item.to_wire() for item in items]})
        else:
            click.echo(table(items))
        return
    page = _call(api, one_page)
    if api.as_json:
        echo_json(page.to_wire())
        return
    click.echo(table(getattr(page, key)))
    if page.next_page_token:
        click.echo(f"next page: --page-token {page.next_page_token}")


def _print_one(api: ApiOptions, found: Any, details: Callable[[Any], str]) -> None:
    if api.as_json:
        echo_json(found.to_wire())
    else:
        click.echo(details(found))


def _print_done(api: ApiOptions, line: str) -> None:
    """What a call that answers nothing prints: ``{}`` for ``--json``, else ``line``."""
    if api.as_json:
        echo_json({})
    else:
        click.echo(line)


# --------------------------------------------------------------------------- sessions


@cli.group()
def sessions() -> None:
    """Sessions of the account: list, get, create, delete; message one; approve its plan;
    archive or unarchive one."""


@sessions.command("list")
@_page_options
@click.option(
    "--archived", is_flag=True, help="List the archived sessions (the default list omits them)."
)
@api_options
def sessions_list(
    page_size: int | None,
    page_token: str | None,
    walk_all: bool,
    archived: bool,
    api: ApiOptions,
) -> None:
    """List the sessions of the account (newest first)."""
    from ..api.client import ARCHIVED_FILTER

    found = ARCHIVED_FILTER if archived else None
    _print_list(
        api,
        walk_all,
        page_token,
        "sessions",
        session_table,
        lambda c: c.iter_sessions(page_size=page_size, filter=found),
        lambda c: c.list_sessions(page_size=page_size, page_token=page_token, filter=found),
    )


@sessions.command("get")
@click.argument("session", callback=_name_arg("session"))
@api_options
def sessions_get(session: str, api: ApiOptions) -> None:
    """Show one session: SESSION is sessions/<id> or <id>."""
    _print_one(api, _call(api, lambda c: c.get_session(session)), session_details)


@sessions.command("create")
@click.argument("prompt_arg", metavar="[PROMPT]", required=False)
@click.option("--prompt", "prompt_opt", help="The task (instead of the PROMPT argument).")
@click.option("--title", help="Title (generated by the service when absent).")
@click.option("--source", help="Source to work on: sources/github/<owner>/<repo> or its id.")
@click.option("--branch", help="Starting branch (needs --source).")
@click.option(
    "--require-plan-approval", is_flag=True, help="Wait for `sessions approve` before working."
)
@click.option("--auto-pr", is_flag=True, help="Open a pull request when the changes are ready.")
@api_options
def sessions_create(
    prompt_arg: str | None,
    prompt_opt: str | None,
    title: str | None,
    source: str | None,
    branch: str | None,
    require_plan_approval: bool,
    auto_pr: bool,
    api: ApiOptions,
) -> None:
    """Start a session on PROMPT (or --prompt; "-" reads it from stdin)."""
    if prompt_arg is not None and prompt_opt is not None:
        raise click.UsageError("give the prompt once: as PROMPT or as --prompt")
    given = prompt_arg if prompt_arg is not None else prompt_opt
    prompt = _text_arg(given).strip() if given is not None else ""
    if not prompt:
        raise click.UsageError("a prompt is required: PROMPT, --prompt TEXT or --prompt -")
    if branch and not source:
        raise click.UsageError("--branch needs --source")
    from ..api.client import source_name
    from ..api.models import AUTO_CREATE_PR

    if source is not None:
        try:
            source = source_name(source)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--source") from None
    created = _call(
        api,
        lambda c: c.create_session(
            prompt,
            title=title,
            source=source,
            starting_branch=branch,
            require_plan_approval=True if require_plan_approval else None,
            automation_mode=AUTO_CREATE_PR if auto_pr else None,
        ),
    )
    if api.as_json:
        echo_json(created.to_wire())
        return
    click.echo(f"created {created.name}" + (f" ({created.state})" if created.state else ""))
    if created.url:
        click.echo(created.url)


@sessions.command("message")
@click.argument("session", callback=_name_arg("session"))
@click.argument("prompt")
@api_options
def sessions_message(session: str, prompt: str, api: ApiOptions) -> None:
    """Send PROMPT to SESSION ("-" reads it from stdin); the answer comes as an activity."""
    text = _text_arg(prompt).strip()
    if not text:
        raise click.UsageError("the message is empty")
    _call(api, lambda c: c.send_message(session, text))
    _print_done(api, f"sent to {session}")


def _session_call(
    verb: str, help: str, call: Callable[[SessionsClient, str], Awaitable[None]], done: str
) -> None:
    """``sessions VERB SESSION``: ``call`` (whose answer carries nothing), then ``done``
    and the session's name."""

    @sessions.command(verb, help=help)
    @click.argument("session", callback=_name_arg("session"))
    @api_options
    def command(session: str, api: ApiOptions) -> None:
        _call(api, lambda c: call(c, session))
        _print_done(api, f"{done} {session}")


_session_call(
    "delete", "Delete SESSION (sessions/<id> or <id>).", lambda c, s: c.delete_session(s), "deleted"
)


def _archive_call(verb: str, help: str, archived: bool) -> None:
    """``sessions archive|unarchive SESSION``: prints the session's name and flag."""

    @sessions.command(verb, help=help)
    @click.argument("session", callback=_name_arg("session"))
    @api_options
    def command(session: str, api: ApiOptions) -> None:
        found = _call(api, lambda c: c.archive(session) if archived else c.unarchive(session))
        if api.as_json:
            echo_json(found.to_wire())
        else:
            click.echo(f"{verb}d {found.name}" + (f" ({found.state})" if found.state else ""))


_archive_call("archive", "Archive SESSION: it leaves the default list; a working one pauses.", True)
_archive_call("unarchive", "Unarchive SESSION: it is back in the default list.", False)
_session_call(
    "approve",
    "Approve the pending plan of SESSION.",
    lambda c, s: c.approve_plan(s),
    "approved the plan of",
)


# --------------------------------------------------------------------------- activities


@cli.group()
def activities() -> None:
    """The activities (events) of a session: list, get."""


@activities.command("list")
@click.argument("session", callback=_name_arg("session"))
@_page_options
@click.option(
    "--create-time",
    callback=_check_time,
    help="Only activities from this RFC 3339 time on (the service decides if inclusive).",
)
@api_options
def activities_list(
    session: str,
    page_size: int | None,
    page_token: str | None,
    walk_all: bool,
    create_time: str | None,
    api: ApiOptions,
) -> None:
    """List the activities of SESSION, oldest first."""
    _print_list(
        api,
        walk_all,
        page_token,
        "activities",
        activity_table,
        lambda c: c.iter_activities(session, page_size=page_size, create_time=create_time),
        lambda c: c.list_activities(
            session, page_size=page_size, page_token=page_token, create_time=create_time
        ),
    )


@activities.command("get")
@click.argument("name")
@click.argument("activity_id", required=False)
@api_options
def activities_get(name: str, activity_id: str | None, api: ApiOptions) -> None:
    """Show one activity: NAME is sessions/<id>/activities/<id>, or SESSION ACTIVITY_ID."""
    from ..api.client import activity_name

    try:
        full_name = activity_name(name, activity_id)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    _print_one(api, _call(api, lambda c: c.get_activity(full_name)), activity_details)


# --------------------------------------------------------------------------- sources


@cli.group()
def sources() -> None:
    """The repositories connected to the account: list, get."""


@sources.command("list")
@_page_options
@click.option(
    "--filter",
    "filter_",
    help="AIP-160 filter, e.g. 'name=sources/github/o/a OR name=sources/github/o/b'.",
)
@api_options
def sources_list(
    page_size: int | None,
    page_token: str | None,
    walk_all: bool,
    filter_: str | None,
    api: ApiOptions,
) -> None:
    """List the sources connected to the account."""
    _print_list(
        api,
        walk_all,
        page_token,
        "sources",
        source_table,
        lambda c: c.iter_sources(page_size=page_size, filter=filter_),
        lambda c: c.list_sources(page_size=page_size, page_token=page_token, filter=filter_),
    )


@sources.command("get")
@click.argument("source", callback=_name_arg("source"))
@api_options
def sources_get(source: str, api: ApiOptions) -> None:
    """Show one source and its branches: SOURCE is sources/github/<o>/<r> or github/<o>/<r>."""
    _print_one(api, _call(api, lambda c: c.get_source(source)), source_details)
