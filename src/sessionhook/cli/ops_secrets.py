"""``sessionhook secret generate|token`` and ``sessionhook verify``: secrets and signatures
for the operator and for consumers; nothing here touches the store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

import click

from . import cli
from ._output import CliError
from .ops import parse_headers


@cli.group("secret")
def secret() -> None:
    """Webhook signing secrets and the relay's bearer token: generate, token."""


_F = TypeVar("_F", bound=Callable[..., Any])


def _out_options(fn: _F) -> _F:
    """``--out FILE`` and ``--force`` (``out`` and ``force`` arguments)."""
    fn = click.option(
        "--force", is_flag=True, help="With --out: replace FILE if it exists (its secret is lost)."
    )(fn)
    return click.option(
        "--out",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        help="Write it to FILE, mode 0600 (refused if FILE exists), instead of printing it.",
    )(fn)


def _emit(text: str, out: Path | None, force: bool, what: str) -> None:
    """Print ``text``, or write it to the secret file ``out`` (mode 0600)."""
    if out is None:
        if force:
            raise click.UsageError("--force goes with --out")
        click.echo(text)
        return
    from ..relay.config.secret_files import write_secret_file

    try:
        write_secret_file(out, text + "\n", replace=force)
    except FileExistsError:
        raise CliError(
            f"{out} exists: not replaced", hint="--force replaces it (its secret is lost)"
        ) from None
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror or exc}") from None
    click.echo(f"{what} written to {out} (mode 600)", err=True)


@secret.command("generate")
@click.option(
    "--asymmetric",
    is_flag=True,
    help='An ed25519 pair for signature = "v1a": the whsk_ signing key on stdout (the '
    "endpoint's secret), its whpk_ public key for consumers on stderr.",
)
@_out_options
def secret_generate(asymmetric: bool, out: Path | None, force: bool) -> None:
    """Print a new random `whsec_` secret (for an endpoint's secret file), or write it to
    FILE with --out."""
    from ..relay.domain.signing import generate_keypair, generate_secret

    if asymmetric:
        signing_key, public_key = generate_keypair()
        _emit(signing_key, out, force, "a new whsk_ signing key")
        click.echo(f"public key for consumers: {public_key}", err=True)
        return
    _emit(generate_secret(), out, force, "a new whsec_ secret")


@secret.command("token")
@_out_options
def secret_token(out: Path | None, force: bool) -> None:
    """Print a new random bearer token for the web console and the event stream
    (`[server] token_file` / `token_env`): 43 URL-safe characters, 256 bits; or write it to
    FILE with --out."""
    import secrets

    _emit(secrets.token_urlsafe(32), out, force, "a new token")


@cli.command("verify")
@click.option(
    "--secret",
    "secret_text",
    required=True,
    envvar="SESSIONHOOK_SECRET",
    metavar="S",
    help="The endpoint's whsec_ secret or whpk_ public key (or $SESSIONHOOK_SECRET, kept "
    "out of shell history).",
)
@click.option(
    "--headers",
    "headers_file",
    required=True,
    type=click.File("r"),
    metavar="FILE",
    help="The request's headers: 'name: value' lines or a JSON object.",
)
@click.option("--tolerance", default=300, show_default=True, help="Seconds of clock skew allowed.")
@click.option(
    "--ignore-timestamp", is_flag=True, help="Check only the signature (an old captured request)."
)
@click.argument("body", type=click.File("rb"))
def verify_command(
    secret_text: str,
    headers_file: IO[str],
    tolerance: int,
    ignore_timestamp: bool,
    body: IO[bytes],
) -> None:
    """Check a captured webhook request as a consumer should: print `signature ok` (exit 0)
    or the reason it fails (exit 1). BODY is the raw body file, or - for standard input."""
    from ..relay.domain.signing import SignatureError, verify

    try:
        headers = parse_headers(headers_file.read())
    except ValueError as exc:
        raise CliError(str(exc), exit_code=2) from None
    raw = body.read()
    now: float | None = None
    if ignore_timestamp:
        try:
            now = float(headers.get("webhook-timestamp", ""))
        except ValueError:
            now = None  # verify reports the malformed timestamp itself
    try:
        verify(secret_text, headers, raw, tolerance=tolerance, now=now)
    except SignatureError as exc:
        hint = None
        if exc.reason.startswith("timestamp too"):
            hint = "--ignore-timestamp checks only the signature of an old capture"
        elif exc.reason == "no matching signature":
            hint = "wrong secret, or the body was altered (even a trailing newline counts)"
        raise CliError(f"signature invalid: {exc.reason}", hint=hint) from None
    except ValueError as exc:  # a secret that is not whsec_ + base64
        raise CliError(f"bad secret: {exc}", exit_code=2) from None
    click.echo("signature ok")
