"""``sessionhook mcp --url RELAY``: the relay's MCP server over stdio, for MCP clients that
spawn a command (:mod:`.mcp_bridge`; docs/mcp.md). The token is read from the environment
variable ``--token-env`` names, never from the command line."""

from __future__ import annotations

import os
from typing import Final
from urllib.parse import urlsplit

import click

from . import cli
from ._output import CliError

#: Where the relay's token is read from, unless ``--token-env`` names another variable.
DEFAULT_TOKEN_ENV: Final = "SESSIONHOOK_WEB_TOKEN"


@cli.command("mcp")
@click.option(
    "--url", required=True, metavar="URL", help="The relay's [server] address (http(s)://...)."
)
@click.option(
    "--token-env",
    default=DEFAULT_TOKEN_ENV,
    show_default=True,
    metavar="NAME",
    help="The environment variable holding the relay's [server] token.",
)
def mcp_command(url: str, token_env: str) -> None:
    """Serve the relay's MCP tools and resources over stdin and stdout."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"--url: {url[:200]!r} is not an http(s) URL", exit_code=2)
    token = os.environ.get(token_env, "").strip()
    if not token:
        raise CliError(f"set ${token_env} to the relay's [server] token", exit_code=2)
    import anyio

    from .mcp_bridge import Bridge

    anyio.run(Bridge(url, token).serve_stdio)
