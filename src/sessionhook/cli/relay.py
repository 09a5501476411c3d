"""``sessionhook run`` (the relay daemon) and ``sessionhook demo`` (everything on loopback).

``run`` exits 0 after a clean stop or a complete ``--once`` pass; 2 for a bad
configuration or a store held by another daemon; 1 for any other failure, one line each.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import NoReturn

import click

from . import cli
from ._output import DEFAULT_CONFIG, ENV_CONFIG, CliError, load_daemon_config

#: Net allocations of tracked objects between young collections (Python's default: 700).
YOUNG_THRESHOLD = 10_000


def tune_collector() -> None:
    """Set up the cyclic garbage collector for a long run (``sessionhook run``, not ``--once``).

    What exists by now lives as long as the process: :func:`gc.freeze` takes it out of the
    collector's walks. A delivery or a page of activities makes thousands of short-lived
    objects, so the young generation is collected every :data:`YOUNG_THRESHOLD` net
    allocations, not 700; only cycles wait longer. (``bench/throughput.py``: the CPU per
    event fell from 0.77 to 0.62 ms.)
    """
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)


def _fail(message: str, code: int) -> NoReturn:
    """Report a failure the way every sessionhook command does: one line, then exit."""
    CliError(message, exit_code=code).show()
    sys.exit(code)


@cli.command("run")
@click.option(
    "--config",
    "config_flag",
    metavar="FILE",
    help=f"The TOML configuration (default: ${ENV_CONFIG}, else {DEFAULT_CONFIG}).",
)
@click.option("--once", is_flag=True, help="One full poll-and-deliver pass, then exit.")
def run(config_flag: str | None, once: bool) -> None:
    """Run the relay in the foreground until SIGTERM or SIGINT.

    Polls the Sessions API, archives every activity, and delivers signed webhooks. On
    SIGTERM/SIGINT deliveries in flight get 10 s to finish; SIGHUP re-reads the config.
    """
    # Imported here so that `sessionhook --help` stays fast and never touches the relay.
    import anyio

    from sessionhook.relay.config import ConfigError
    from sessionhook.relay.daemon.daemon import Daemon
    from sessionhook.relay.daemon.errors import DaemonError
    from sessionhook.relay.telemetry import logs as relay_logging

    try:
        # The daemon checks the templates itself, in a child process: none runs in its own.
        config, path = load_daemon_config(config_flag, templates_here=False)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    relay_logging.configure(config.log.level, config.log.format)
    daemon = Daemon(config, config_path=Path(path))
    try:
        if once:
            code = anyio.run(daemon.run_once, backend="asyncio")
        else:
            tune_collector()
            anyio.run(daemon.run, backend="asyncio")
            code = 0
    except DaemonError as exc:
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C before the signal handler was installed
        code = 0
    except Exception as exc:  # the daemon logged the traceback; one line here
        _fail(f"the relay stopped on an error: {_first_leaf(exc)!r}", 1)
    sys.exit(code)


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


@cli.command("demo")
@click.option(
    "--sessions",
    default=3,
    show_default=True,
    help="Sessions to create (the three kinds take turns).",
)
@click.option(
    "--step-delay",
    default=1.0,
    show_default=True,
    help="Seconds between the emulated agent's steps.",
)
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
@click.option("--seed", type=int, default=None, help="Make the emulated agent deterministic.")
@click.option("--port", type=int, default=0, show_default=True, help="Emulator port (0: any).")
def demo(
    sessions: int, step_delay: float, duration: float | None, seed: int | None, port: int
) -> None:
    """Emulator + relay + a verifying webhook consumer, on loopback; Ctrl-C stops.

    Creates a few sessions (one opens a pull request, one waits for plan approval, which
    the demo gives, one asks a question, which the demo answers) and prints every event as
    the consumer receives it, with its signature checked, and the Slack-formatted messages
    of a second endpoint; stops once every session completed or failed.
    """
    import anyio

    from sessionhook.demo import DemoError, run_demo

    if sessions < 1:
        _fail("--sessions must be at least 1", 2)
    try:
        anyio.run(
            lambda: run_demo(
                sessions=sessions,
                step_delay=step_delay,
                duration=duration,
                seed=seed,
                emulator_port=port,
            ),
            backend="asyncio",
        )
    except DemoError as exc:
        _fail(str(exc), 1)
    except KeyboardInterrupt:
        pass
