"""``sessionhook listen``: a local verifying webhook receiver
(:class:`sessionhook.receiver.Receiver`) that prints each accepted event on stdout and each
refusal on stderr; or, with ``--url`` and ``--forward-to``, a relay's events forwarded to a
local consumer (:mod:`.listen_forward`). Ctrl-C ends either with exit status 130 (the entry
point's); a closed pipe (``| head``) quietly.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

import click

from ..wording import counted
from . import cli
from ._output import CliError, handle_errors, quiet_on_closed_pipe, register_user_error
from .remote import token_options

if TYPE_CHECKING:
    from ..receiver import Delivery, Refusal

#: ``--port`` when none is given.
DEFAULT_PORT: Final = 8000
#: The environment variable ``--secret`` is read from when not given.
ENV_SECRET: Final = "SESSIONHOOK_LISTEN_SECRET"


@cli.command("listen")
@click.option(
    "--port", type=click.IntRange(0, 65535), help=f"Receive on this port [{DEFAULT_PORT}]."
)
@click.option("--host", help="Receive on this address [127.0.0.1].")
@click.option(
    "--secret",
    "secrets",
    multiple=True,
    envvar=ENV_SECRET,
    metavar="whsec_...",
    help="The endpoint's secret to verify with (repeat during a rotation; or "
    f"${ENV_SECRET}); with --forward-to, the secret to sign with (default: a new one).",
)
@click.option(
    "--secret-file",
    "secret_files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="As --secret, read from FILE (chmod 600: a file its group or other users can read "
    "is refused), out of the process list and shell history.",
)
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    metavar="whpk_...",
    help="Verify v1a (ed25519) signatures with this public key.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option(
    "--max-body",
    type=click.IntRange(1024),
    metavar="BYTES",
    help="Refuse larger bodies (413) [8 MiB].",
)
@click.option("--url", metavar="URL", help="A relay's [server] address: forward its events.")
@token_options("--url")
@click.option("--forward-to", metavar="URL", help="With --url: POST each event here.")
@click.option(
    "--events",
    "event_types",
    metavar="TYPE,...",
    help="With --url: only these event types (globs, e.g. 'session.*').",
)
@click.option(
    "--last-event-id",
    metavar="ID",
    help="With --url: start right after this event (instead of where the state file says).",
)
@click.option(
    "--state-file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="With --url: where the position and the secret are kept "
    "[$XDG_STATE_HOME/sessionhook/listen/...].",
)
@click.option(
    "--new-secret", is_flag=True, help="With --url: sign with a new secret (kept from then on)."
)
@click.option(
    "--respond",
    type=click.IntRange(200, 599),
    metavar="STATUS",
    help="Answer every accepted message with STATUS (e.g. 500 or 429) to watch the relay retry.",
)
@click.option(
    "--retry-after",
    type=click.IntRange(0, 86400),
    metavar="SECONDS",
    help="With --respond: send Retry-After: SECONDS too.",
)
def listen(
    port: int | None,
    host: str | None,
    secrets: tuple[str, ...],
    secret_files: tuple[Path, ...],
    public_keys: tuple[str, ...],
    as_json: bool,
    max_body: int | None,
    url: str | None,
    token: str | None,
    forward_to: str | None,
    event_types: str | None,
    last_event_id: str | None,
    state_file: Path | None,
    new_secret: bool,
    respond: int | None,
    retry_after: int | None,
) -> None:
    """Receive signed webhooks on this machine and print them, verified; or, with --url and
    --forward-to, forward a relay's events to a local consumer, signed, resuming after a
    restart where it stopped."""
    if (url is None) != (forward_to is None):
        raise click.UsageError("--url and --forward-to go together (forward a relay's events)")
    with handle_errors(), quiet_on_closed_pipe():
        secrets = (*secrets, *(_read_secret(file) for file in secret_files))
        if url is not None and forward_to is not None:
            receiving = (
                (port, "--port"),
                (host, "--host"),
                (max_body, "--max-body"),
                (respond, "--respond"),
                (retry_after, "--retry-after"),
            )
            for given, flag in receiving:
                if given is not None:
                    raise click.UsageError(f"{flag} is for receiving; --forward-to sends")
            if public_keys:
                raise click.UsageError("--forward-to signs with a whsec_ secret, not a key")
            from .listen_forward import forward

            forward(
                url,
                forward_to,
                token,
                secrets,
                event_types,
                last_event_id,
                as_json,
                state_file=state_file,
                new_secret=new_secret,
            )
            return
        forwarding: tuple[tuple[object, str], ...] = (
            (last_event_id, "--last-event-id"),
            (state_file, "--state-file"),
            (new_secret or None, "--new-secret"),
        )
        for option, flag in forwarding:
            if option is not None:
                raise click.UsageError(f"{flag} goes with --url (forwarding)")
        if retry_after is not None and respond is None:
            raise click.UsageError("--retry-after goes with --respond")
        _receive(
            host or "127.0.0.1",
            DEFAULT_PORT if port is None else port,
            [*secrets, *public_keys],
            as_json,
            max_body,
            Answering(respond or 204, retry_after, _globs(event_types)),
        )


def _read_secret(file: Path) -> str:
    """The secret in ``file``, by the rule of every secret file (one line if refused)."""
    from ..relay.config.secret_files import SecretFileError, read_secret_file

    try:
        return read_secret_file(file)
    except SecretFileError as exc:
        raise CliError(f"--secret-file: {exc}", exit_code=2) from None


@dataclass(frozen=True)
class Answering:
    """How the receiver answers: ``respond`` to what it prints, with ``retry_after``; only
    the types matching ``events`` printed (the others answered 204 and counted)."""

    respond: int = 204
    retry_after: int | None = None
    events: tuple[str, ...] = ()

    def wanted(self) -> Callable[[str], bool] | None:
        if not self.events:
            return None
        from fnmatch import fnmatchcase

        return lambda kind: any(fnmatchcase(kind, glob) for glob in self.events)


def _globs(event_types: str | None) -> tuple[str, ...]:
    return tuple(g.strip() for g in (event_types or "").split(",") if g.strip())


def _receive(
    host: str,
    port: int,
    keys: list[str],
    as_json: bool,
    max_body: int | None,
    answering: Answering,
) -> None:
    import anyio

    from ..receiver import MAX_BODY, ListenError, Receiver, serve_receiver
    from ..relay.domain import signing
    from ..relay.telemetry import logs

    if not keys:
        raise CliError(
            "nothing to verify with",
            hint=f"give the endpoint's secret (--secret-file, --secret or ${ENV_SECRET}) "
            "or --public-key",
            exit_code=2,
        )
    printer = _Printer(as_json, answering.respond)
    try:
        receiver = Receiver(
            keys,
            printer.delivery,
            printer.refusal,
            max_body=max_body or MAX_BODY,
            respond=answering.respond,
            retry_after=answering.retry_after,
            wanted=answering.wanted(),
        )
    except ValueError as exc:
        raise CliError(str(exc), exit_code=2) from None
    # The listener's own records (warnings only) go to stderr; stdout is for the events.
    logs.configure("warning", "console")

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            printer.stop = tg.cancel_scope.cancel
            bound_host, bound_port = await tg.start(serve_receiver, host, port, receiver)
            held = receiver.keys  # a file or --secret may hold several, space-separated
            kinds = "v1a signatures" if all(k.startswith("whpk_") for k in held) else "signatures"
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            click.echo(
                f"listening on http://{shown}:{bound_port} (any path): {kinds} checked with "
                f"{len(held)} key{'s' if len(held) > 1 else ''}, timestamps within "
                f"{signing.DEFAULT_TOLERANCE // 60} min; Ctrl-C stops",
                err=True,
            )
            if answering.respond != 204 or answering.events:
                only = f"only {', '.join(answering.events)} printed (others answered 204); "
                after = (
                    f", Retry-After: {answering.retry_after}"
                    if answering.retry_after is not None
                    else ""
                )
                click.echo(
                    f"{only if answering.events else ''}answering {answering.respond}{after}",
                    err=True,
                )

    register_user_error(ListenError, exit_code=1)  # one line, also out of the task group
    try:
        anyio.run(main, backend="asyncio")
    finally:
        if receiver.unwanted:
            click.echo(
                f"{counted(receiver.unwanted, 'message')} of other types answered 204, not printed",
                err=True,
            )
    if printer.pipe_closed:
        raise BrokenPipeError


class _Printer:
    """Prints what the receiver accepts (stdout) and refuses (stderr), one line each."""

    def __init__(self, as_json: bool, respond: int = 204) -> None:
        self.as_json = as_json
        self.respond = respond
        self.stop: Callable[[], None] = lambda: None
        self.pipe_closed = False

    async def delivery(self, delivery: Delivery) -> None:
        from ..api.models import format_timestamp
        from ..receiver import event_line, json_line

        if self.as_json:
            record = {
                "received_at": format_timestamp(datetime.fromtimestamp(delivery.received_at, UTC)),
                "path": delivery.path,
                "duplicate": delivery.duplicate,
                "headers": delivery.headers,
                "body": delivery.body,
            }
            self._out(json_line(record))
        else:
            note = "signature ok" + (" (duplicate)" if delivery.duplicate else "")
            if self.respond != 204:
                note += f", answered {self.respond}"
            self._out(event_line(delivery.body, note=note))

    async def refusal(self, refusal: Refusal) -> None:
        from ..receiver import clip

        about = f" {clip(refusal.webhook_id, 80)}" if refusal.webhook_id else ""
        click.echo(
            f"{time.strftime('%H:%M:%S')}  refused {refusal.method} {clip(refusal.path, 80)}"
            f"{about} from {refusal.client or '?'}: {refusal.status} {clip(refusal.reason, 200)}",
            err=True,
        )

    def _out(self, line: str) -> None:
        try:
            click.echo(line)
            sys.stdout.flush()
        except BrokenPipeError:  # `listen | head`: nobody reads any more
            self.pipe_closed = True
            self.stop()
