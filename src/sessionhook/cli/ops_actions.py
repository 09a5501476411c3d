"""``sessionhook actions rotate-key``: a new key for the signed action links (``[actions]``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import click

from . import cli
from ._output import CliError, load_daemon_config
from .ops import reported


@cli.group("actions")
def actions() -> None:
    """Signed action links (approve a plan, answer the agent from a chat message):
    rotate-key."""


@actions.command("rotate-key")
@click.option("--config", "config_path", metavar="PATH", help="The daemon's config file.")
@click.option(
    "--no-overlap",
    is_flag=True,
    help="Keep no old key: every link sent so far stops working now (revokes a leaked link).",
)
@reported
def rotate_key(config_path: str | None, no_overlap: bool) -> None:
    """Make a new key for `actions.key_file`. Links signed with the old one keep working
    until they expire (`actions.link_ttl`), unless --no-overlap. A running daemon, and every
    replica sharing the file, sign with the new key from their next link on."""
    from ..relay.config.action_keys import rotate_key_file

    config, _ = load_daemon_config(config_path, resolve_secrets=False, need_api_key=False)
    file = config.actions.key_file
    if file is None:  # load_config always resolves it
        raise CliError("actions.key_file is not set", exit_code=2)
    now = time.time()
    overlap = 0.0 if no_overlap else config.actions.link_ttl
    try:
        ring = rotate_key_file(file, overlap=overlap, now=now)
    except OSError as exc:
        raise CliError(f"cannot write {file}: {exc.strerror or exc}") from None
    click.echo(f"new action-link key in {file}")
    if no_overlap:
        click.echo("links sent before no longer work")
    else:
        until = datetime.fromtimestamp(now + overlap, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        click.echo(f"links sent before keep working until they expire (at the latest {until})")
    if len(ring.retiring) > 1:
        click.echo(f"{len(ring.retiring)} older keys are kept until their links expire")
