"""``sessionhook listen --url RELAY --forward-to URL``: a relay's events, POSTed to a local
consumer as the relay would, signed with a local secret.

The events come from :func:`.ops_events.follow_stream` (nothing missed or repeated across
a cut). Each is POSTed in order with its exact body, ``webhook-id`` = the relay's, a fresh
``webhook-timestamp`` per attempt and a signature with the local secret, through the
deliveries' own sender (:mod:`sessionhook.relay.ops.forwarding`; loopback allowed). A
consumer that is down, times out, or answers 5xx or 429 is tried again after
:data:`RETRY_DELAYS`, then reported as given up; any other answer is final. Nothing is
dropped without a line saying so. Its state file (:mod:`.listen_state`) keeps the last
event the consumer acknowledged and the secret: a restart resumes there, signing alike.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

from ..redact import redact_userinfo
from ._output import CliError, one_line
from .listen_state import (
    ListenState,
    StateFileError,
    default_state_path,
    read_state,
    write_state,
)
from .remote import check_url, need_token

if TYPE_CHECKING:
    import httpx

    from ..relay.ops.forwarding import Poster
    from .sse import StreamEvent

#: Waits before the second, third and fourth attempt of one event.
RETRY_DELAYS: Final = (1.0, 2.0, 4.0)
#: Seconds one POST to the consumer may take.
FORWARD_TIMEOUT: Final = 10.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """How forwarding one event ended: the last answer's status (``None``: no answer), its
    time, the attempts made and, unless it was delivered, why not."""

    status: int | None
    millis: int
    attempts: int
    problem: str | None = None

    @property
    def delivered(self) -> bool:
        """Whether the consumer answered 2xx."""
        return self.problem is None

    def note(self) -> str:
        """The answer as the event's line ends: ``-> 204 in 12 ms``."""
        if self.delivered:
            return f"-> {self.status} in {self.millis} ms"
        tries = f" after {self.attempts} attempts" if self.attempts > 1 else ""
        return f"-> not delivered{tries}: {self.problem}"

    def json(self) -> dict[str, Any]:
        """The answer in ``--json`` output."""
        return {
            "status": self.status,
            "ms": self.millis,
            "attempts": self.attempts,
            "delivered": self.delivered,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class Forwarder:
    """POSTs events to ``target``, signed with ``secrets``, retried as the module says;
    ``http`` is the sender's poster (:func:`~sessionhook.relay.ops.forwarding.forward_poster`)
    or an ``httpx.AsyncClient`` (a stand-in for the network)."""

    http: Poster | httpx.AsyncClient
    target: str
    secrets: list[str]
    _: KW_ONLY
    note: Callable[[str], None]
    sleep: Callable[[float], Awaitable[None]]

    async def forward(self, event: StreamEvent) -> Outcome:
        """Deliver ``event`` (retrying a consumer that is down or failing); never raises
        for the consumer's answer."""
        from .. import __version__
        from ..receiver import printable
        from ..relay.ops.forwarding import forward_event

        attempts = len(RETRY_DELAYS) + 1
        for attempt in range(1, attempts + 1):
            # Signed with a fresh timestamp each attempt; only the answer's status is read.
            result = await forward_event(
                self.http,
                self.target,
                self.secrets,
                event.id,
                event.body,
                timeout=FORWARD_TIMEOUT,
                user_agent=f"sessionhook-listen/{__version__}",
            )
            status = result.status_code
            millis = int(result.duration_ms)
            if status is None:
                problem = printable(one_line(result.error or "no answer"))
            else:
                if 200 <= status < 300:
                    return Outcome(status, millis, attempt)
                problem = f"answered {status}"
                if status < 500 and status != 429:
                    return Outcome(status, millis, attempt, problem + " (not retried)")
            if attempt == attempts:
                return Outcome(status, millis, attempt, problem)
            delay = RETRY_DELAYS[attempt - 1]
            self.note(
                f"note: {printable(event.id)}: {problem}; trying again in {delay:g} s "
                f"(attempt {attempt + 1} of {attempts})"
            )
            await self.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns on its last attempt


def forward(
    url: str,
    target: str,
    token: str | None,
    secrets: tuple[str, ...],
    event_types: str | None,
    last_event_id: str | None,
    as_json: bool,
    *,
    state_file: Path | None = None,
    new_secret: bool = False,
) -> None:
    """The command's body in forward mode (see the module's docstring): resumed from its
    state file (:mod:`.listen_state`) unless ``last_event_id`` says where."""
    import anyio

    from ..receiver import event_line, json_line, printable
    from ..relay.domain import signing
    from ..relay.domain.addresses import UnusableUrlError
    from ..relay.ops import EventFilter
    from ..relay.ops.forwarding import forward_poster, forward_target
    from ._output import current_runtime
    from .ops_events import follow_stream, note_unknown_types, stream_client
    from .sse import SkippedEvent

    check_url(url)
    try:
        # Read once, as a delivery's URL is: every POST goes to this host.
        consumer = forward_target(target)
    except UnusableUrlError as exc:
        shown = printable(redact_userinfo(target))
        raise CliError(f"--forward-to {shown}: refused: {exc.reason}", exit_code=2) from None
    bearer = need_token(token)
    path = state_file or default_state_path(url, target)
    try:
        state = read_state(path, url=url, target=target)
    except StateFileError as exc:
        raise CliError(str(exc), exit_code=2) from None
    given = [key for text in secrets for key in text.split()]
    if given and new_secret:
        raise click.UsageError("--new-secret makes a secret: drop --secret and --secret-file")
    kept = state.secret if state is not None and not new_secret else None
    keys = given or [kept or signing.generate_secret()]
    for key in keys:
        try:
            signing.decode_secret(key)
        except ValueError as exc:
            raise CliError(f"--secret: {exc}", exit_code=2) from None
    start = last_event_id or (state.last_event_id if state is not None else None)
    globs = tuple(g.strip() for g in (event_types or "").split(",") if g.strip())
    note_unknown_types(globs)
    click.echo(
        f"forwarding the events of {redact_userinfo(url)} to {redact_userinfo(target)}\n"
        f"signing with {' '.join(keys)} (your consumer verifies with it); Ctrl-C stops",
        err=True,
    )
    resuming = f": resuming after {printable(start)}" if start else ""
    click.echo(f"state in {path}{resuming}", err=True)
    saver = _StateSaver(path, ListenState(url, target, keys[0], start))
    saver.save(start)  # the secret is kept from the first moment
    wanted = EventFilter(globs)
    taken: str | None = None  # the last event taken: where a resume starts

    async def run() -> None:
        nonlocal taken
        sleep = current_runtime().sleep or anyio.sleep
        async with stream_client() as stream_http, forward_poster() as poster:
            forwarder = Forwarder(poster, consumer, keys, note=_note, sleep=sleep)
            async for event in follow_stream(stream_http, url, bearer, wanted, start):
                if isinstance(event, SkippedEvent):
                    _note(event.note())  # nothing is dropped without a line saying so
                    taken = event.id or taken
                    saver.save(taken)
                    continue
                outcome = await forwarder.forward(event)
                taken = event.id
                if outcome.delivered:  # a restart resumes after what the consumer took
                    saver.save(event.id)
                body = event.payload()
                if as_json:
                    record = {"id": event.id, "type": event.type, "answer": outcome.json()}
                    line = json_line({**record, "body": body})
                else:
                    line = event_line(body, note=outcome.note())
                click.echo(line)
                sys.stdout.flush()

    try:
        anyio.run(run, backend="asyncio")
    except KeyboardInterrupt:
        if taken:
            click.echo(f"stopped; to resume: --last-event-id {taken}", err=True)
        raise


def _note(line: str) -> None:
    click.echo(line, err=True)


class _StateSaver:
    """Keeps the state file at the last event acknowledged; a failure to write is said
    once and forwarding goes on (a restart then resumes from an older event)."""

    def __init__(self, path: Path, state: ListenState) -> None:
        self._path = path
        self._state = state
        self._failed = False

    def save(self, last_event_id: str | None) -> None:
        from dataclasses import replace

        self._state = replace(self._state, last_event_id=last_event_id)
        try:
            write_state(self._path, self._state)
        except StateFileError as exc:
            if not self._failed:
                _note(f"note: {exc}; a restart resumes from an older event")
            self._failed = True
