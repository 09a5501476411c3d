"""``sessionhook sessions|activities|sources``: every call of the Sessions API, by hand.

The service address comes from ``--base-url`` (default ``$SESSIONHOOK_BASE_URL``, else
``http://127.0.0.1:8080``, where ``sessionhook emulator`` listens); the API key only from
``$SESSIONHOOK_API_KEY``, never from argv, where other users and shell history see it.
Human-readable tables by default; ``--json`` prints the wire JSON for scripts. A failed call
is one line on stderr (status, message, what to check) and exit status 1.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

from . import cli
from ._output import CliError, current_runtime, echo_json, http_client, render_fields, render_table
from ._output import run as run_async

if TYPE_CHECKING:
    # The client (httpx, pydantic: about 0.3 s of CPU) is imported when a command calls
    # the service, not by `--help` or a usage error.
    from ..api.client import SessionsClient
    from ..api.models import Activity, Artifact, Session, Source

__all__ = ["DEFAULT_BASE_URL", "ENV_API_KEY", "ENV_BASE_URL", "activities", "sessions", "sources"]

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
    """The options every API command takes."""

    base_url: str
    api_key_header: str | None  # None: the client's default
    timeout: float
    as_json: bool


def _check_base_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from ..api.client import api_root

    try:
        api_root(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


def api_options(func: Callable[..., None]) -> Callable[..., None]:
    """Add ``--base-url``, ``--api-key-header``, ``--timeout`` and ``--json``.

    The command receives them as one ``api: ApiOptions`` argument.
    """

    @click.option(
        "--base-url",
        envvar=ENV_BASE_URL,
        default=DEFAULT_BASE_URL,
        show_default=True,
        show_envvar=True,
        callback=_check_base_url,
        help="Service address; /v1alpha is appended.",
    )
    @click.option(
        "--api-key-header",
        metavar="NAME",
        # The client's DEFAULT_API_KEY_HEADER, spelled out so that --help needs no client
        # (tests/test_cli_api.py holds the two together).
        help="Header that carries the key from $SESSIONHOOK_API_KEY  [default: x-vendor-api-key]",
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
        base_url: str,
        api_key_header: str | None,
        timeout: float,
        as_json: bool,
        **kwargs: Any,
    ) -> None:
        func(*args, api=ApiOptions(base_url, api_key_header, timeout, as_json), **kwargs)

    return wrapper


def _api_key() -> str:
    key = os.environ.get(ENV_API_KEY, "").strip()
    if not key:
        raise CliError(
            f"${ENV_API_KEY} is not set",
            hint=f"export {ENV_API_KEY}=<your API key> (generated in the service's settings)",
            exit_code=2,
        )
    return key


def _call(api: ApiOptions, action: Callable[[SessionsClient], Awaitable[_T]]) -> _T:
    """Run ``action`` with a client in a fresh event loop; errors become one line."""
    import anyio

    from ..api import RetryPolicy
    from ..api.client import DEFAULT_API_KEY_HEADER, SessionsClient

    key = _api_key()
    runtime = current_runtime()

    async def main() -> _T:
        async with http_client(timeout=api.timeout, base_url=api.base_url) as http:
            client = SessionsClient(
                http,
                base_url=api.base_url,
                api_key=key,
                api_key_header=api.api_key_header or DEFAULT_API_KEY_HEADER,
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


def _when(timestamp: str) -> str:
    """A timestamp for people: RFC 3339 to the second, UTC (``2026-11-22T12:00:03Z``)."""
    if not timestamp:
        return ""
    from ..api.models import parse_timestamp

    try:
        return parse_timestamp(timestamp).strftime("%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return timestamp


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


def _check_paging(walk_all: bool, page_token: str | None) -> None:
    if walk_all and page_token:
        raise click.UsageError("--all walks every page from the first; drop --page-token")


def _print_next(token: str) -> None:
    if token:
        click.echo(f"next page: --page-token {token}")


# --------------------------------------------------------------------------- sessions


@cli.group()
def sessions() -> None:
    """Create, list, read, delete sessions; message them; approve their plans."""


def _session_rows(items: Sequence[Session]) -> list[tuple[str, ...]]:
    return [(s.session_id, s.state, _when(s.update_time), s.title) for s in items]


def _session_table(items: Sequence[Session]) -> str:
    if not items:
        return "no sessions"
    return render_table(("ID", "STATE", "UPDATED", "TITLE"), _session_rows(items))


def _session_details(session: Session) -> str:
    context = session.source_context
    branch = (
        context.host_repo_context.starting_branch if context and context.host_repo_context else ""
    )
    return render_fields(
        [
            ("name", session.name),
            ("title", session.title),
            ("state", session.state),
            ("url", session.url),
            ("created", _when(session.create_time)),
            ("updated", _when(session.update_time)),
            ("source", context.source if context else ""),
            ("branch", branch),
            ("automation", session.automation_mode),
            ("plan approval", "required" if session.require_plan_approval else ""),
            ("pull requests", "\n".join(pr.url for pr in session.pull_requests)),
            ("prompt", session.prompt),
        ]
    )


@sessions.command("list")
@_page_options
@api_options
def sessions_list(
    page_size: int | None, page_token: str | None, walk_all: bool, api: ApiOptions
) -> None:
    """List the sessions of the account (newest first)."""
    _check_paging(walk_all, page_token)
    if walk_all:
        items = _call(api, lambda c: _collect(c.iter_sessions(page_size=page_size)))
        if api.as_json:
            echo_json({"sessions": [s.to_wire() for s in items]})
        else:
            click.echo(_session_table(items))
        return
    page = _call(api, lambda c: c.list_sessions(page_size=page_size, page_token=page_token))
    if api.as_json:
        echo_json(page.to_wire())
        return
    click.echo(_session_table(page.sessions))
    _print_next(page.next_page_token)


@sessions.command("get")
@click.argument("session", callback=_name_arg("session"))
@api_options
def sessions_get(session: str, api: ApiOptions) -> None:
    """Show one session: SESSION is sessions/<id> or <id>."""
    found = _call(api, lambda c: c.get_session(session))
    if api.as_json:
        echo_json(found.to_wire())
    else:
        click.echo(_session_details(found))


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
    from ..api.client import AUTO_CREATE_PR, source_name

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


@sessions.command("delete")
@click.argument("session", callback=_name_arg("session"))
@api_options
def sessions_delete(session: str, api: ApiOptions) -> None:
    """Delete SESSION (sessions/<id> or <id>)."""
    _call(api, lambda c: c.delete_session(session))
    if api.as_json:
        echo_json({})
    else:
        click.echo(f"deleted {session}")


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
    if api.as_json:
        echo_json({})
    else:
        click.echo(f"sent to {session}")


@sessions.command("approve")
@click.argument("session", callback=_name_arg("session"))
@api_options
def sessions_approve(session: str, api: ApiOptions) -> None:
    """Approve the pending plan of SESSION."""
    _call(api, lambda c: c.approve_plan(session))
    if api.as_json:
        echo_json({})
    else:
        click.echo(f"approved the plan of {session}")


# --------------------------------------------------------------------------- activities


@cli.group()
def activities() -> None:
    """List and read the activities (events) of a session."""


def _event_summary(activity: Activity) -> tuple[str, str]:
    """(kind, one-line summary) of an activity, also for unknown or missing members."""
    if activity.plan_generated is not None:
        steps = activity.plan_generated.plan.steps
        return "planGenerated", f"plan of {len(steps)} step(s)"
    if activity.plan_approved is not None:
        plan_id = activity.plan_approved.plan_id
        return "planApproved", f"plan {plan_id} approved" if plan_id else "plan approved"
    if activity.user_messaged is not None:
        return "userMessaged", activity.user_messaged.user_message
    if activity.agent_messaged is not None:
        return "agentMessaged", activity.agent_messaged.agent_message
    if activity.progress_updated is not None:
        update = activity.progress_updated
        return "progressUpdated", " - ".join(t for t in (update.title, update.description) if t)
    if activity.session_completed is not None:
        return "sessionCompleted", activity.description or "session completed"
    if activity.session_failed is not None:
        return "sessionFailed", activity.session_failed.reason or activity.description
    unknown = activity.unknown_members
    return (unknown[0] if unknown else "-"), activity.description


def _artifact_summary(artifact: Artifact) -> str:
    if artifact.change_set is not None:
        patch = artifact.change_set.git_patch
        lines = len(patch.unidiff_patch.splitlines()) if patch else 0
        message = (
            patch.suggested_commit_message.splitlines()[0]
            if patch and patch.suggested_commit_message
            else ""
        )
        return f"change set on {artifact.change_set.source or '-'}: {lines} diff line(s)" + (
            f", commit message: {message}" if message else ""
        )
    if artifact.bash_output is not None:
        out = artifact.bash_output
        return f"$ {out.command} (exit {out.exit_code}, {len(out.output)} chars of output)"
    if artifact.media is not None:
        return f"media {artifact.media.mime_type or '?'} ({len(artifact.media.data)} base64 chars)"
    return "artifact of an unknown kind"


def _activity_table(items: Sequence[Activity]) -> str:
    if not items:
        return "no activities"
    rows = []
    for activity in items:
        kind, summary = _event_summary(activity)
        if activity.artifacts:
            summary = f"{summary} [+{len(activity.artifacts)} artifact(s)]".strip()
        ident = activity.id or activity.name.rsplit("/", 1)[-1]
        rows.append((ident, _when(activity.create_time), activity.originator, kind, summary))
    return render_table(("ID", "CREATED", "BY", "EVENT", "SUMMARY"), rows)


def _activity_details(activity: Activity) -> str:
    kind, summary = _event_summary(activity)
    plan = activity.plan_generated.plan if activity.plan_generated else None
    steps = "\n".join(f"{step.index + 1}. {step.title}" for step in plan.steps) if plan else ""
    return render_fields(
        [
            ("name", activity.name),
            ("created", _when(activity.create_time)),
            ("by", activity.originator),
            ("event", kind),
            ("summary", summary),
            ("description", activity.description if activity.description != summary else ""),
            ("plan", steps),
            ("artifacts", "\n".join(_artifact_summary(a) for a in activity.artifacts)),
        ]
    )


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
    _check_paging(walk_all, page_token)
    if walk_all:
        items = _call(
            api,
            lambda c: _collect(
                c.iter_activities(session, page_size=page_size, create_time=create_time)
            ),
        )
        if api.as_json:
            echo_json({"activities": [a.to_wire() for a in items]})
        else:
            click.echo(_activity_table(items))
        return
    page = _call(
        api,
        lambda c: c.list_activities(
            session, page_size=page_size, page_token=page_token, create_time=create_time
        ),
    )
    if api.as_json:
        echo_json(page.to_wire())
        return
    click.echo(_activity_table(page.activities))
    _print_next(page.next_page_token)


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
    found = _call(api, lambda c: c.get_activity(full_name))
    if api.as_json:
        echo_json(found.to_wire())
    else:
        click.echo(_activity_details(found))


# --------------------------------------------------------------------------- sources


@cli.group()
def sources() -> None:
    """List and read the repositories connected to the account."""


def _source_table(items: Sequence[Source]) -> str:
    if not items:
        return "no sources"
    rows = []
    for source in items:
        repo = source.host_repo
        # List items may leave out privacy and branches (spec 2.7): blank, not "no".
        private = ""
        if repo is not None and "isPrivate" in repo.to_wire():
            private = "yes" if repo.is_private else "no"
        default = repo.default_branch.display_name if repo and repo.default_branch else ""
        rows.append((source.name, f"{repo.owner}/{repo.repo}" if repo else "", private, default))
    headers = ("NAME", "REPOSITORY", "PRIVATE", "DEFAULT BRANCH")
    # Columns no row fills (what list items omit) are left out rather than shown blank.
    keep = [i for i in range(len(headers)) if i < 2 or any(row[i] for row in rows)]
    return render_table([headers[i] for i in keep], [[row[i] for i in keep] for row in rows])


def _source_details(source: Source) -> str:
    repo = source.host_repo
    return render_fields(
        [
            ("name", source.name),
            ("repository", f"{repo.owner}/{repo.repo}" if repo else ""),
            ("private", ("yes" if repo.is_private else "no") if repo else ""),
            (
                "default branch",
                repo.default_branch.display_name if repo and repo.default_branch else "",
            ),
            ("branches", "\n".join(b.display_name for b in repo.branches) if repo else ""),
        ]
    )


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
    _check_paging(walk_all, page_token)
    if walk_all:
        items = _call(api, lambda c: _collect(c.iter_sources(page_size=page_size, filter=filter_)))
        if api.as_json:
            echo_json({"sources": [s.to_wire() for s in items]})
        else:
            click.echo(_source_table(items))
        return
    page = _call(
        api,
        lambda c: c.list_sources(page_size=page_size, page_token=page_token, filter=filter_),
    )
    if api.as_json:
        echo_json(page.to_wire())
        return
    click.echo(_source_table(page.sources))
    _print_next(page.next_page_token)


@sources.command("get")
@click.argument("source", callback=_name_arg("source"))
@api_options
def sources_get(source: str, api: ApiOptions) -> None:
    """Show one source and its branches: SOURCE is sources/github/<o>/<r> or github/<o>/<r>."""
    found = _call(api, lambda c: c.get_source(source))
    if api.as_json:
        echo_json(found.to_wire())
    else:
        click.echo(_source_details(found))
