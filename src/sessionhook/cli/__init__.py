"""The ``sessionhook`` command. One module per command group; each registers itself on ``cli``."""

from __future__ import annotations

import click

from .. import __version__
from .groups import Group


# Group: every group under it is one, and every command a groups.Command (an option given
# to a group reaches its subcommand or is refused).
@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sessionhook")
def cli() -> None:
    """sessionhook: push delivery (signed webhooks) for coding-agent sessions."""


# Imported for their side effect of adding their commands to ``cli``; they import ``cli``
# from here, so these imports come after its definition.
from . import (  # noqa: E402, F401
    api,
    emulator,
    listen,
    mcp,
    ops,
    ops_actions,
    ops_deliveries,
    ops_endpoints,
    ops_endpoints_edit,
    ops_events,
    ops_replay,
    ops_requeue,
    ops_secrets,
    relay,
    store_copy,
    trigger,
)


def main() -> None:
    """The ``sessionhook`` command (see :func:`sessionhook.__main__.main`, which installs
    as the console script and also catches a Ctrl-C while this package is imported)."""
    from ..__main__ import main as entry

    entry()
