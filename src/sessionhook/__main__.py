"""The ``sessionhook`` command's entry point (also ``python -m sessionhook``).

It imports nothing before it can catch Ctrl-C: an interrupt at any moment ends the command
with exit status 130 (128 + SIGINT) and no traceback. Commands whose way to stop is Ctrl-C
(``run``, ``events --follow``, ``demo``) catch it themselves and exit 0.
"""

from __future__ import annotations

import sys

#: The exit status after Ctrl-C: 128 + SIGINT (2). (Spelled out: even the signal module
#: is imported only inside main's try, where an interrupt is caught.)
INTERRUPTED = 130


def main() -> None:
    """Run the ``sessionhook`` command line on ``sys.argv`` and exit with its status."""
    try:
        code = _run()
    except KeyboardInterrupt:
        import signal

        # A second Ctrl-C while the interpreter shuts down (joining a worker thread, say)
        # would print a traceback of its own: from now on SIGINT simply ends the process.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        code = INTERRUPTED
    sys.exit(code)


def _run() -> int:
    import click

    from .cli import cli

    try:
        # Not click's standalone mode: it reports Ctrl-C as "Aborted!" with status 1.
        result = cli.main(prog_name="sessionhook", standalone_mode=False)
    except click.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):
            raise exc.__cause__ from None
        click.echo("Aborted!", err=True)
        return 1
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    # A command returns None; --help, --version and ctx.exit(n) return their status.
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    main()
