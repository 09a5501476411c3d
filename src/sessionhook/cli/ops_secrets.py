"""``sessionhook secret generate|token`` and ``sessionhook verify``: secrets and signatures
for the operator and for consumers; nothing here touches the store."""

from __future__ import annotations

from typing import IO

import click

from . import cli
from ._output import CliError
from .ops import parse_headers

__all__ = ["secret", "verify_command"]


@cli.group("secret")
def secret() -> None:
    """Webhook signing secrets and the relay's bearer token: generate, token."""


@secret.command("generate")
@click.option(
    "--asymmetric",
    is_flag=True,
    help='An ed25519 pair for signature = "v1a": the whsk_ signing key on stdout (the '
    "endpoint's secret), its whpk_ public key for consumers on stderr.",
)
def secret_generate(asymmetric: bool) -> None:
    """Print a new random `whsec_` secret (for an endpoint's secret file)."""
    from ..relay.domain.signing import generate_keypair, generate_secret

    if asymmetric:
        signing_key, public_key = generate_keypair()
        click.echo(signing_key)
        click.echo(f"public key for consumers: {public_key}", err=True)
        return
    click.echo(generate_secret())


@secret.command("token")
def secret_token() -> None:
    """Print a new random bearer token for the web console and the event stream
    (`[server] token_file` / `token_env`): 43 URL-safe characters, 256 bits."""
    import secrets

    click.echo(secrets.token_urlsafe(32))


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
