"""``sessionhook deliveries retry ID`` and ``deliveries recover --endpoint E --since T``:
send again now what failed, once the endpoint is fixed.

Views of :mod:`sessionhook.relay.ops.requeue` (the management API's ``:retry`` and
``:recover`` do the same); the plumbing is :mod:`.ops`'s. Both write the daemon's store in
one short transaction; the running daemon picks the deliveries up within a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .ops import echo_answer, json_option, reported, store_options, time_option, writing_store
from .ops_deliveries import deliveries
from .remote import post, refuse_store_options, remote_options

if TYPE_CHECKING:
    from ..relay.domain.api_models import ApiRecovered, ApiRetried

__all__ = ["recover", "retry"]


@deliveries.command("retry")
@click.argument("delivery", metavar="ID")
@store_options
@remote_options
@json_option
@reported
def retry(
    delivery: str,
    config_path: str | None,
    db_path: str | None,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Send delivery ID again now: the same event, webhook-id and body.

    A failed or dead delivery is re-opened; later deliveries of its session wait behind
    it, and an earlier open one goes first (due now too). ID as `sessionhook deliveries`
    shows it (`12` or `#12`).
    """
    from ..relay.domain.api_models import ApiRetried
    from ..relay.ops.requeue import retry as retry_now

    key = delivery.strip().removeprefix("#")
    if not key.isascii() or not key.isdigit() or len(key) > 18:
        raise click.BadParameter(f"a delivery id is a whole number, not {delivery[:40]!r}")
    if url is not None:
        refuse_store_options(config_path, db_path)
        _echo_result(post(url, token, f"/v1/deliveries/{key}:retry", ApiRetried), as_json)
        return
    with writing_store(config_path, db_path) as store:
        result = retry_now(store, int(key))
    _echo_result(result.answer(), as_json)


@deliveries.command("recover")
@store_options
@remote_options
@click.option("--endpoint", required=True, metavar="NAME", help="The endpoint that was fixed.")
@click.option(
    "--since",
    required=True,
    metavar="TIME",
    help="Deliveries of events from this time (RFC 3339 or 2h, 7d ago).",
)
@json_option
@reported
def recover(
    config_path: str | None,
    db_path: str | None,
    url: str | None,
    token: str | None,
    endpoint: str,
    since: str,
    as_json: bool,
) -> None:
    """Send again now every failed or dead delivery of an endpoint whose event happened
    since TIME: the same webhook-ids and bodies, each session's in order.

    Says how many, and why none when none (e.g. they are older than TIME, or nothing
    failed: pending deliveries go out on their own).
    """
    from ..relay.domain.api_models import ApiRecovered
    from ..relay.ops.requeue import recover as recover_now

    # Checked here, as the relay checks it: a typo is a usage error before any request.
    moment = time_option(click.get_current_context(), _since_param(), since)
    assert moment is not None  # --since is required
    if url is not None:
        refuse_store_options(config_path, db_path)
        # The text as typed: an age is counted from the relay's clock.
        body = {"endpoint": endpoint, "since": since}
        _echo_result(post(url, token, "/v1/deliveries:recover", ApiRecovered, body), as_json)
        return
    with writing_store(config_path, db_path) as store:
        result = recover_now(store, endpoint, moment)
    _echo_result(result.answer(), as_json)


def _since_param() -> click.Parameter:
    params = {p.name: p for p in click.get_current_context().command.params}
    return params["since"]


def _echo_result(answer: ApiRetried | ApiRecovered, as_json: bool) -> None:
    """A retry's or recovery's answer: its JSON, or its one-line ``message``."""
    if as_json:
        echo_answer(answer)
        return
    click.echo(answer.message)
