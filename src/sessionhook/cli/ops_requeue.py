"""``sessionhook deliveries retry ID`` and ``deliveries recover --endpoint E --since T``:
send again now what failed (:mod:`sessionhook.relay.ops.requeue`, as the API's ``:retry``
and ``:recover``), in one short write transaction."""

from __future__ import annotations

import click

from .ops import Where, json_option, operator_options, show, time_option
from .ops_deliveries import deliveries
from .remote import post


@deliveries.command("retry")
@click.argument("delivery", metavar="ID")
@operator_options
@json_option
def retry(delivery: str, where: Where, as_json: bool) -> None:
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
    if (url := where.relay()) is not None:
        answer = post(url, where.token, f"/v1/deliveries/{key}:retry", ApiRetried)
    else:
        with where.writing() as store:
            answer = retry_now(store, int(key)).answer()
    show(answer, as_json, answer.message)


@deliveries.command("recover")
@operator_options
@click.option("--endpoint", required=True, metavar="NAME", help="The endpoint that was fixed.")
@click.option(
    "--since",
    required=True,
    metavar="TIME",
    help="Deliveries of events from this time (RFC 3339 or 2h, 7d ago).",
)
@json_option
def recover(where: Where, endpoint: str, since: str, as_json: bool) -> None:
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
    if (url := where.relay()) is not None:
        # The text as typed: an age is counted from the relay's clock.
        body = {"endpoint": endpoint, "since": since}
        answer = post(url, where.token, "/v1/deliveries:recover", ApiRecovered, body)
    else:
        with where.writing() as store:
            answer = recover_now(store, endpoint, moment).answer()
    show(answer, as_json, answer.message)


def _since_param() -> click.Parameter:
    params = {p.name: p for p in click.get_current_context().command.params}
    return params["since"]
