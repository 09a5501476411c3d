"""``--url``: an operator command against a running relay's management API instead of its
store, with ``--token``, ``--token-file`` or ``$SESSIONHOOK_WEB_TOKEN`` as
``Authorization: Bearer``. Every failure is one line (:func:`call`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

from ._output import CliError, http_client, run

if TYPE_CHECKING:
    import httpx
    from pydantic import BaseModel, ValidationError

    from ..relay.domain.api_models import ApiPage

#: The environment variable the token is read from when ``--token`` is not given.
ENV_TOKEN: Final = "SESSIONHOOK_WEB_TOKEN"
#: Seconds one request to the relay may take.
TIMEOUT: Final = 30.0

_F = TypeVar("_F", bound=Callable[..., Any])
_M = TypeVar("_M", bound="BaseModel")


def token_options(flag: str, whose: str = "relay") -> Callable[[_F], _F]:
    """``--token`` (or ``$SESSIONHOOK_WEB_TOKEN``) and ``--token-file`` for ``flag``; the
    command receives one ``token``: the file's (a secret file: read only when its group
    and other users cannot, as the relay reads its own), else the option's or the
    variable's. ``--token`` and ``--token-file`` together are a usage error."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def merged(*args: Any, token: str | None, token_file: str | None, **kwargs: Any) -> Any:
            return fn(*args, token=_token(token, token_file), **kwargs)

        with_file = click.option(
            "--token-file",
            metavar="FILE",
            help=f"Read the {whose}'s [server] token for {flag} from FILE (mode 600): "
            "it stays out of the process list and the environment.",
        )(merged)
        return click.option(  # type: ignore[return-value]
            "--token",
            envvar=ENV_TOKEN,
            metavar="TOKEN",
            help=f"The {whose}'s [server] token for {flag} (or ${ENV_TOKEN}).",
        )(with_file)

    return decorate


def _token(token: str | None, token_file: str | None) -> str | None:
    context = click.get_current_context()
    if token_file is None or context.invoked_subcommand is not None:
        return token  # a group's own call: its subcommand reads the file
    if _on_command_line(context, "token"):
        raise click.UsageError("--token and --token-file: give one of them")
    from ..relay.config.secret_files import SecretFileError, read_secret_file

    try:
        return read_secret_file(Path(token_file))
    except SecretFileError as exc:
        raise CliError(f"--token-file: {exc}") from None


def _on_command_line(context: click.Context | None, name: str) -> bool:
    """Whether ``name`` was given on the command line, to this command or to a group
    above it (which hands it down)."""
    while context is not None:
        if name in context.params:
            source = context.get_parameter_source(name)
            if source is click.core.ParameterSource.COMMANDLINE:
                return True
        context = context.parent
    return False


def remote_option_pair(flag: str, name: str) -> Callable[[_F], _F]:
    """``flag`` (the relay's address, argument ``name``), ``--token`` and ``--token-file``
    (:func:`token_options`)."""

    def decorate(fn: _F) -> _F:
        fn = token_options(flag)(fn)
        return click.option(
            flag,
            name,
            metavar="URL",
            help="A running relay's [server] address, e.g. http://127.0.0.1:9187: ask its "
            "API instead of reading the store.",
        )(fn)

    return decorate


def refuse_store_options(config_path: str | None, db_path: str | None) -> None:
    """A usage error when ``--config`` or ``--db`` comes with ``--url``."""
    if config_path is not None or db_path is not None:
        raise click.UsageError("--url asks a relay, --config and --db read a store: one of them")


def error_message(answer: httpx.Response) -> str:
    """The one line of a relay's error body (``{"error": {"message": ...}}``), else the
    start of the text."""
    error = _error_of(answer)
    return answer.text[:200] if error is None else error


def _error_of(answer: httpx.Response) -> str | None:
    from pydantic import ValidationError

    from ..relay.domain.api_models import ApiError

    try:
        return ApiError.model_validate_json(answer.content).error.message
    except ValidationError:
        return None


def need_token(token: str | None) -> str:
    """``token``, or the one-line error that says where it comes from."""
    if not token:
        raise CliError(
            "--url needs the relay's token", hint=f"set ${ENV_TOKEN}, --token or --token-file"
        )
    return token


def check_url(url: str) -> str:
    """``url`` (``--url``), or a usage error unless it is an http(s) URL."""
    if not url.lower().startswith(("http://", "https://")):
        raise click.UsageError("--url must be an http:// or https:// URL")
    return url


def get(
    url: str, token: str | None, path: str, answer: type[_M], params: dict[str, str] | None = None
) -> _M:
    """``GET`` ``path`` (``/v1/...``) of the relay at ``url``, read as ``answer``."""
    return call(url, token, "GET", path, answer, params=params)


def post(
    url: str, token: str | None, path: str, answer: type[_M], body: dict[str, Any] | None = None
) -> _M:
    """``POST`` ``body`` to ``path`` of the relay at ``url``, read as ``answer``."""
    return call(url, token, "POST", path, answer, body=body if body is not None else {})


def call(
    url: str,
    token: str | None,
    method: str,
    path: str,
    answer: type[_M],
    *,
    body: dict[str, Any] | None = None,
    params: dict[str, str] | None = None,
) -> _M:
    """``method`` ``path`` of the relay at ``url``, its answer read as the model ``answer``;
    every failure a :class:`~sessionhook.cli._output.CliError` of one line (the API's
    refusal of the request as the local command says it, anything else naming the URL)."""
    token = need_token(token)
    endpoint = check_url(url).rstrip("/") + path

    async def ask() -> httpx.Response:
        import httpx

        headers = {"authorization": f"Bearer {token}", "accept": "application/json"}
        try:
            async with http_client(timeout=TIMEOUT, base_url=url) as http:
                return await http.request(
                    method, endpoint, headers=headers, json=body, params=params
                )
        except httpx.HTTPError as exc:
            raise CliError(f"{endpoint}: {type(exc).__name__}: {exc}") from None

    got = run(ask)
    error = _error_of(got) if got.status_code in (400, 404, 409) else None
    if error is not None:
        # An unknown endpoint is a typo (exit 2, as locally); what the relay refused
        # otherwise is what the local command refuses with exit 1 (its own checks of
        # the command line ran before the request, as they do locally).
        unknown = got.status_code == 404 and error.startswith("no endpoint named")
        raise CliError(error, exit_code=2 if unknown else 1)
    if not 200 <= got.status_code < 300:
        hint = None
        if got.status_code == 401:
            hint = f"is ${ENV_TOKEN} the relay's [server] token?"
        raise CliError(f"{endpoint}: {got.status_code} {error_message(got)}", hint=hint)
    from pydantic import ValidationError

    try:
        return answer.model_validate_json(got.content)
    except ValidationError as exc:
        raise CliError(f"{endpoint}: {_unreadable(exc)}") from None


def _unreadable(exc: ValidationError) -> str:
    """Why an answer does not read as its model, in one line."""
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return "the answer is not JSON"
    where = ".".join(str(part) for part in first["loc"]) or "the answer"
    return f"an answer of an unknown shape ({where}: {first['msg']})"[:300]


def get_pages(
    url: str,
    token: str | None,
    path: str,
    page: type[ApiPage],
    params: dict[str, str],
    limit: int,
) -> list[Any]:
    """At most ``limit`` items of a paged list, following ``nextPageToken`` (pages of at
    most 200, the API's largest)."""
    return list(islice(iter_pages(url, token, path, page, params, limit), limit))


def iter_pages(
    url: str,
    token: str | None,
    path: str,
    page: type[ApiPage],
    params: dict[str, str],
    limit: int | None = None,
) -> Iterator[Any]:
    """The items of a paged list, a ``page`` at a time as they are read (at most
    ``limit``, if given, are asked for)."""
    query = dict(params)
    given = 0
    while limit is None or given < limit:
        query["pageSize"] = str(200 if limit is None else min(200, limit - given))
        read = get(url, token, path, page, query)
        items = read.listed()
        given += len(items)
        yield from items
        after = read.next_page()
        if not after:
            return
        query["pageToken"] = after


def refuse_with_url(**given: object) -> None:
    """A usage error naming the first option that has no API equivalent (``None``,
    ``False`` or empty when not given)."""
    for name, value in given.items():
        if value not in (None, False, ()):
            option = "--" + name.removesuffix("_").replace("_", "-")
            raise click.UsageError(f"{option} is not available with --url (the API has none)")
