"""``--url``: an operator command against a running relay's management API instead of its
store.

``--url http://host:9187`` names the relay's ``[server] listen`` address; the token is
``--token`` or ``$SESSIONHOOK_WEB_TOKEN`` (kept out of shell history), sent as
``Authorization: Bearer``. :func:`get_json` makes one request and turns every failure into
one line: the relay out of reach, a refused token (401), an error body of the API
(``{"error": {"message": ...}}``), or an answer that is not JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

from ._output import CliError, http_client, run

if TYPE_CHECKING:
    import httpx

__all__ = [
    "ENV_TOKEN",
    "error_message",
    "get_json",
    "need_token",
    "refuse_store_options",
    "remote_options",
]

#: The environment variable the token is read from when ``--token`` is not given.
ENV_TOKEN: Final = "SESSIONHOOK_WEB_TOKEN"
#: Seconds one request to the relay may take.
TIMEOUT: Final = 30.0

_F = TypeVar("_F", bound=Callable[..., Any])


def remote_options(fn: _F) -> _F:
    """``--url URL`` and ``--token TOKEN`` (``url`` and ``token`` arguments)."""
    fn = click.option(
        "--token",
        envvar=ENV_TOKEN,
        metavar="TOKEN",
        help=f"The relay's [server] token for --url (or ${ENV_TOKEN}).",
    )(fn)
    return click.option(
        "--url",
        metavar="URL",
        help="A running relay's [server] address, e.g. http://127.0.0.1:9187: ask its API "
        "instead of reading the store.",
    )(fn)


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


def get_json(url: str, token: str | None, path: str) -> Any:
    """``GET`` ``path`` (``/v1/...``) of the relay at ``url``; its JSON, or a
    :class:`~sessionhook.cli._output.CliError` of one line."""
    token = need_token(token)
    if not url.lower().startswith(("http://", "https://")):
        raise click.UsageError("--url must be an http:// or https:// URL")
    endpoint = url.rstrip("/") + path

    async def call() -> Any:
        import httpx

        headers = {"authorization": f"Bearer {token}", "accept": "application/json"}
        try:
            async with http_client(timeout=TIMEOUT, base_url=url) as http:
                answer = await http.get(endpoint, headers=headers)
        except httpx.HTTPError as exc:
            raise CliError(f"{endpoint}: {type(exc).__name__}: {exc}") from None
        if answer.status_code != 200:
            hint = None
            if answer.status_code == 401:
                hint = f"is ${ENV_TOKEN} the relay's [server] token?"
            raise CliError(f"{endpoint}: {answer.status_code} {error_message(answer)}", hint=hint)
        try:
            return answer.json()
        except ValueError:
            raise CliError(f"{endpoint}: the answer is not JSON") from None

    return run(call)
