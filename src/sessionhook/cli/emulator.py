"""``sessionhook emulator``: serve the Sessions API emulator with uvicorn."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, Final, TypeVar

import click

from . import cli

API_KEY_ENV = "SESSIONHOOK_API_KEY"


def _accounts(values: tuple[str, ...]) -> list[tuple[str, ...]]:
    """One account per value; ``K1,K2`` gives several keys of one account."""
    return [tuple(k.strip() for k in value.split(",") if k.strip()) for value in values]


_F = TypeVar("_F", bound=Callable[..., Any])
_CHANCE: Final = click.FloatRange(0, 1)


def _shown(flag: str, default: object, kind: Any, text: str, **more: Any) -> Callable[[_F], _F]:
    """An option with a default shown in ``--help``."""
    return click.option(flag, default=default, show_default=True, type=kind, help=text, **more)


@cli.command("emulator")
@_shown("--host", "127.0.0.1", str, "Address to listen on.")
@_shown(
    "--port",
    8080,
    click.IntRange(0, 65535),
    "Port to listen on; 0 picks a free one (printed at start).",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    metavar="KEY[,KEY...]",
    help=f"An account's API key(s); repeat for more accounts. Default: ${API_KEY_ENV}.",
)
@_shown(
    "--step-delay", 0.5, click.FloatRange(min=0), "Seconds between two steps of the scripted agent."
)
@click.option("--seed", type=int, default=None, help="Make ids and content reproducible.")
@_shown("--fault-rate-limit", 0.0, _CHANCE, "Probability of answering 429 (Retry-After: 1).")
@_shown("--fault-error", 0.0, _CHANCE, "Probability of answering 500.")
@_shown("--latency-ms", 0, click.IntRange(min=0), "Delay before every answer, in milliseconds.")
@_shown(
    "--create-time-filter",
    "exclusive",
    click.Choice(["exclusive", "inclusive", "ignore"]),
    "How list-activities reads createTime: after, at-or-after, or not at all.",
)
@_shown(
    "--consistency-delay",
    0.0,
    click.FloatRange(min=0),
    "A new session and its activities answer 404 this long (eventual consistency).",
    metavar="SECONDS",
)
def emulator_command(host: str, port: int, api_keys: tuple[str, ...], **settings: Any) -> None:
    """Serve a local emulator of the Sessions API (/v1alpha) with a scripted agent.

    Prompt words drive the agent: "[ask]" makes it ask a question and wait for a message,
    "[fail]" makes the session fail.
    """
    import uvicorn

    from ..emulator.app import create_app
    from ..sockets import listening_socket

    from_env = os.environ.get(API_KEY_ENV, "").strip()
    accounts = _accounts(api_keys or ((from_env,) if from_env else ()))
    if not accounts or not all(accounts):
        click.echo(f"error: no API key: pass --api-key KEY or set ${API_KEY_ENV}", err=True)
        sys.exit(2)
    try:
        # The other options are create_app's keyword arguments, by name.
        app = create_app(api_keys=accounts, **settings)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        click.echo(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        # Covers a signal arriving before uvicorn installs its handlers; uvicorn also
        # re-raises the signal it handled after shutdown, and this makes that a no-op,
        # so the process exits 0 instead of dying by the signal.
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    shown = f"[{host}]" if ":" in host else host
    plural = "account" if len(accounts) == 1 else "accounts"
    click.echo(
        f"sessionhook emulator listening on http://{shown}:{sock.getsockname()[1]} "
        f"({len(accounts)} {plural}, step delay {settings['step_delay']:g}s)"
    )
    server.run(sockets=[sock])
