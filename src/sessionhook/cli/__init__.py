"""The ``sessionhook`` command. One module per command group; each registers itself here."""

from __future__ import annotations

import click

from .. import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sessionhook")
def cli() -> None:
    """sessionhook: push delivery (signed webhooks) for coding-agent sessions."""


def _register() -> None:
    # Imported for their side effect of adding commands to ``cli``. A module that does not
    # exist yet is skipped so the command keeps working while groups are being built.
    import importlib

    for name in ("api", "emulator", "relay", "ops"):
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise


_register()


def main() -> None:
    """Console entry point."""
    cli()
