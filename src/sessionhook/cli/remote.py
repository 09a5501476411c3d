"""``--url``: an operator command against a running relay's management API instead of its
store.

``--url http://host:9187`` names the relay's ``[server] listen`` address; the token is
``--token`` or ``$SESSIONHOOK_WEB_TOKEN`` (kept out of shell history), sent as
``Authorization: Bearer``. :func:`get_json` makes one request and turns every failure into
one line: the relay out of reach, a refused token (401), an error body of the API
(``{"error": {"message": ...}}``), or an answer that is not JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

from ._output import CliError, http_client, run

if TYPE_CHECKING:
    import httpx

__all__ = [
    "ENV_TOKEN",
    "call_json",
    "error_message",
    "get_json",
    "get_pages",
    "iter_pages",
    "need_token",
    "post_json",
    "refuse_store_options",
    "refuse_with_url",
    "relay_url_options",
    "remote_options",
    "unknown_shape",
]

#: The environment variable the token is read from when ``--token`` is not given.
ENV_TOKEN: Final = "SESSIONHOOK_WEB_TOKEN"
#: Seconds one request to the relay may take.
TIMEOUT: Final = 30.0

_F = TypeVar("_F", bound=Callable[..., Any])


def remote_options(fn: _F) -> _F:
    """``--url URL`` and ``--token TOKEN`` (``url`` and ``token`` arguments)."""
    return _remote_options("--url", "url")(fn)


def relay_url_options(fn: _F) -> _F:
    """``--relay-url URL`` and ``--token TOKEN`` (``relay_url`` and ``token`` arguments):
    :func:`remote_options` of ``endpoints create|update``, whose ``--url`` is the
    endpoint's."""
    return _remote_options("--relay-url", "relay_url")(fn)


def _remote_options(flag: str, name: str) -> Callable[[_F], _F]:
    def decorate(fn: _F) -> _F:
        fn = click.option(
            "--token",
            envvar=ENV_TOKEN,
            metavar="TOKEN",
            help=f"The relay's [server] token for {flag} (or ${ENV_TOKEN}).",
        )(fn)
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
    try:
        error = answer.json().get("error", answer.text[:200])
    except (ValueError, AttributeError):
        return answer.text[:200]
    return str(error.get("message", error) if isinstance(error, dict) else error)


def need_token(token: str | None) -> str:
    """``token``, or the one-line error that says where it comes from."""
    if not token:
        raise CliError("--url needs the relay's token", hint=f"set ${ENV_TOKEN} or --token")
    return token


def get_json(url: str, token: str | None, path: str, params: dict[str, str] | None = None) -> Any:
    """``GET`` ``path`` (``/v1/...``) of the relay at ``url``; its JSON, or a
    :class:`~sessionhook.cli._output.CliError` of one line."""
    return call_json(url, token, "GET", path, params=params)


def post_json(url: str, token: str | None, path: str, body: dict[str, Any] | None = None) -> Any:
    """``POST`` ``body`` to ``path`` of the relay at ``url``; its JSON (as :func:`call_json`)."""
    return call_json(url, token, "POST", path, body=body if body is not None else {})


def call_json(
    url: str,
    token: str | None,
    method: str,
    path: str,
    *,
    body: dict[str, Any] | None = None,
    params: dict[str, str] | None = None,
) -> Any:
    """``method`` ``path`` of the relay at ``url``; its JSON, or a
    :class:`~sessionhook.cli._output.CliError` of one line.

    An error the API answers for the request itself (400, 404, 409) is printed as the
    local command prints it: its message alone, exit status 2 for an unknown endpoint as
    the local command's, else 1. The relay out of reach, a refused
    token, a server error or an answer that is not JSON name the URL."""
    token = need_token(token)
    if not url.lower().startswith(("http://", "https://")):
        raise click.UsageError("--url must be an http:// or https:// URL")
    endpoint = url.rstrip("/") + path

    async def call() -> Any:
        import httpx

        headers = {"authorization": f"Bearer {token}", "accept": "application/json"}
        try:
            async with http_client(timeout=TIMEOUT, base_url=url) as http:
                answer = await http.request(
                    method, endpoint, headers=headers, json=body, params=params
                )
        except httpx.HTTPError as exc:
            raise CliError(f"{endpoint}: {type(exc).__name__}: {exc}") from None
        if answer.status_code in (400, 404, 409) and _is_error_body(answer):
            message = error_message(answer)
            # An unknown endpoint is a typo (exit 2, as locally); what the relay refused
            # otherwise is what the local command refuses with exit 1 (its own checks of
            # the command line ran before the request, as they do locally).
            unknown = answer.status_code == 404 and message.startswith("no endpoint named")
            raise CliError(message, exit_code=2 if unknown else 1)
        if not 200 <= answer.status_code < 300:
            hint = None
            if answer.status_code == 401:
                hint = f"is ${ENV_TOKEN} the relay's [server] token?"
            raise CliError(f"{endpoint}: {answer.status_code} {error_message(answer)}", hint=hint)
        try:
            return answer.json()
        except ValueError:
            raise CliError(f"{endpoint}: the answer is not JSON") from None

    return run(call)


def get_pages(
    url: str, token: str | None, path: str, key: str, params: dict[str, str], limit: int
) -> list[Any]:
    """At most ``limit`` items of a paged list (``key`` of each answer), following
    ``nextPageToken`` (pages of at most 200, the API's largest)."""
    items: list[Any] = []
    for item in iter_pages(url, token, path, key, params, limit):
        items.append(item)
        if len(items) >= limit:
            break
    return items


def iter_pages(
    url: str,
    token: str | None,
    path: str,
    key: str,
    params: dict[str, str],
    limit: int | None = None,
) -> Iterator[Any]:
    """The items of a paged list, a page at a time as they are read (at most ``limit``,
    if given, are asked for)."""
    query = dict(params)
    given = 0
    while limit is None or given < limit:
        query["pageSize"] = str(200 if limit is None else min(200, limit - given))
        data = get_json(url, token, path, query)
        page = data.get(key) or []
        given += len(page)
        yield from page
        after = data.get("nextPageToken")
        if not after:
            return
        query["pageToken"] = str(after)


def unknown_shape(url: str, path: str, exc: Exception) -> CliError:
    """The one line for an answer that does not read back into the command's rows."""
    return CliError(f"{url}: {path} answered in an unknown shape ({exc!r})")


def refuse_with_url(**given: object) -> None:
    """A usage error naming the first option that has no API equivalent (``None``,
    ``False`` or empty when not given)."""
    for name, value in given.items():
        if value not in (None, False, ()):
            option = "--" + name.removesuffix("_").replace("_", "-")
            raise click.UsageError(f"{option} is not available with --url (the API has none)")


def _is_error_body(answer: httpx.Response) -> bool:
    try:
        data = answer.json()
    except ValueError:
        return False
    return isinstance(data, dict) and isinstance(data.get("error"), dict)
