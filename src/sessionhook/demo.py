"""``sessionhook demo``: the emulator, the relay and a verifying consumer, on loopback, in
one process and one task group (the only place where the emulator and the relay meet).

The relay runs with a throwaway store and a real TOML config; a few sessions (one opens a
pull request, one waits for plan approval, one asks a question) are created, and each
``session.action_required``'s signed link is followed as a person would (GET the page,
then POST its form). A second, Slack-formatted endpoint's messages are printed as the
channel would show them. It stops once every session completed or failed.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import re
import secrets
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.abc
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream

from sessionhook.api.client import SessionsClient
from sessionhook.api.models import AUTO_CREATE_PR
from sessionhook.emulator.app import create_app
from sessionhook.receiver import (
    Delivery,
    Receiver,
    clip,
    event_line,
    printable,
    short_session,
)
from sessionhook.relay.config import load_config
from sessionhook.relay.config.secret_files import write_secret_file
from sessionhook.relay.daemon.daemon import Daemon
from sessionhook.relay.domain import signing
from sessionhook.relay.telemetry import logs as relay_logging
from sessionhook.relay.web.server import serve
from sessionhook.wording import counted

#: The console's token, in the demo's directory (``[server] token_file``).
TOKEN_FILE = "web.token"


class DemoError(Exception):
    """The demo could not start; ``str()`` is one line."""


def _session_name(body: dict[str, Any]) -> str:
    """An event body's ``data.session.name`` (empty when it has none)."""
    session = (body.get("data") or {}).get("session")
    return str(session.get("name", "")) if isinstance(session, dict) else ""


@dataclass(frozen=True)
class SessionPlan:
    """One demo session to create."""

    prompt: str
    title: str
    auto_pr: bool = False
    require_plan_approval: bool = False


#: The kinds of session the demo creates, in turn.
SESSION_PLANS: tuple[SessionPlan, ...] = (
    SessionPlan(
        "Add input validation to the signup form",
        "Validate the signup form",
        auto_pr=True,
    ),
    SessionPlan(
        "Refactor the billing module into smaller functions",
        "Refactor billing (needs plan approval)",
        require_plan_approval=True,
    ),
    SessionPlan(
        "[ask] Make the CSV export stream rows instead of building a list",
        "Stream the CSV export (asks a question)",
    ),
)


_LIFECYCLE = ("session.action_required", "session.completed", "session.failed")


def slack_lines(body: dict[str, Any]) -> list[str]:
    """A Slack message body as the channel would show it: the text of its blocks, one
    line each (links as ``text <url>``)."""
    lines: list[str] = []
    for block in body.get("blocks") or []:
        texts = [block.get("text")] if "text" in block else block.get("elements") or []
        for item in texts:
            if isinstance(item, dict) and item.get("type") == "button":
                shown = item.get("text")
                label = shown.get("text", "") if isinstance(shown, dict) else ""
                lines.append(f"[{label}] <{item.get('url', '')}>")
            elif isinstance(item, dict):
                lines += [_slack_plain(line) for line in str(item.get("text", "")).splitlines()]
    return [line for line in lines if line.strip()] or [_slack_plain(str(body.get("text", "")))]


def _message_line(line: str) -> str:
    """A line of a chat message for one terminal line: its text cut short, but a link
    (``text <url>``) whole, as the channel would let a person open it."""
    text, sep, link = line.rpartition(" <")
    if sep and link.endswith(">") and link.startswith(("https://", "http://")):
        return f"{clip(text, 60)} <{printable(link)}"
    return clip(line, 100)


def _slack_plain(text: str) -> str:
    for old, new in (("&lt;", "\x00"), ("&gt;", "\x01")):
        text = text.replace(old, new)
    out, rest = "", text
    while "<" in rest and ">" in rest.split("<", 1)[1]:
        before, _, after = rest.partition("<")
        link, _, rest = after.partition(">")
        url, _, label = link.partition("|")
        out += before + (f"{label} <{url}>" if label else url)
    out += rest
    return out.replace("\x00", "<").replace("\x01", ">").replace("&amp;", "&").replace("*", "")


def _write_config(
    directory: Path, *, base_url: str, api_key: str, hook_url: str, secret: str, listen: str
) -> Path:
    """The demo's config in ``directory``, every secret in a file of its own beside it
    (mode 0600, as the README's first run keeps them): ``api_key``, ``endpoint.secret``
    and ``web.token``, the console's and the event stream's token."""
    for name, text in (
        ("api_key", api_key),
        ("endpoint.secret", secret),
        (TOKEN_FILE, secrets.token_urlsafe(32)),
    ):
        write_secret_file(directory / name, text + "\n")
    config = directory / "config.toml"
    config.write_text(
        "\n".join(
            [
                "[api]",
                f"base_url = {json.dumps(base_url)}",
                'api_key_file = "api_key"',
                "requests_per_minute = 600",
                "[store]",
                f"path = {json.dumps(str(directory / 'demo.db'))}",
                "[poll]",
                "active_interval = 0.5",
                "idle_interval = 2.0",
                "discovery_interval = 1.0",
                "[delivery]",
                "retry_delays = [1, 5, 30]",
                "timeout = 5.0",
                "allow_private_networks = true  # everything in the demo is on loopback",
                "[[endpoints]]",
                'name = "demo-consumer"',
                f"url = {json.dumps(hook_url)}",
                'secret_file = "endpoint.secret"',
                "[[endpoints]]",
                'name = "demo-slack"',
                f"url = {json.dumps(hook_url.removesuffix('/hook') + '/chat')}",
                'secret_file = "endpoint.secret"',
                f"events = {json.dumps(list(_LIFECYCLE))}",
                'format = "slack"',
                "rate_limit = 1.0  # chat webhooks allow about one message a second",
                "[server]",
                f"listen = {json.dumps(listen)}",
                f'token_file = "{TOKEN_FILE}"',
                "[actions]",
                "enabled = true",
                f"public_url = {json.dumps('http://' + listen)}",
                "[log]",
                'level = "warning"',
                'format = "console"',
                "",
            ]
        ),
        encoding="utf-8",
    )
    return config


async def _create_sessions(api: SessionsClient, count: int) -> list[str]:
    sources = (await api.list_sources(page_size=10)).sources
    source = sources[0].name if sources else None
    names = []
    for i in range(count):
        plan = SESSION_PLANS[i % len(SESSION_PLANS)]
        session = await api.create_session(
            plan.prompt,
            title=plan.title,
            source=source,
            starting_branch="main" if source else None,
            automation_mode=AUTO_CREATE_PR if plan.auto_pr and source else None,
            require_plan_approval=plan.require_plan_approval or None,
        )
        names.append(session.name)
    return names


_FORM_TOKEN = re.compile(r'name="form_token" value="([^"]+)"')


async def _react(http: httpx.AsyncClient, event: Delivery, say: Callable[[str], None]) -> None:
    """Do what a person in the chat would on ``session.action_required``: open the link the
    message carries (GET shows the plan or the question), then confirm on that page, or type
    the answer there (POST with the page's form)."""
    if event.body.get("type") != "session.action_required" or event.duplicate:
        return
    name = _session_name(event.body)
    data = event.body.get("data") or {}
    links = data.get("links") or {}
    answer = "Raising an error on empty values is fine; no need for compatibility."
    url = links.get("approve") or links.get("reply")
    if not isinstance(url, str):
        say(f"{'':10}-> no link to follow for {short_session(name)}")
        return
    try:
        page = await http.get(url)
        found = _FORM_TOKEN.search(page.text)
        if page.status_code != 200 or found is None:
            shown = page.status_code
            say(f"{'':10}-> the link of {short_session(name)} shows nothing to do ({shown})")
            return
        form = {"form_token": html.unescape(found.group(1))}
        if "reply" in links:
            form["text"] = answer
        done = await http.post(url, data=form)
    except httpx.HTTPError as exc:
        say(f"{'':10}-> could not follow the link of {short_session(name)}: {exc}")
        return
    if done.status_code != 200:
        say(f"{'':10}-> the link of {short_session(name)} did nothing ({done.status_code})")
    elif "approve" in links:
        say(f"{'':10}-> opened the approve link and approved the plan of {short_session(name)}")
    else:
        say(f"{'':10}-> opened the reply link and answered the question of {short_session(name)}")


async def _print_events(
    events: MemoryObjectReceiveStream[Delivery],
    http: httpx.AsyncClient,
    out: TextIO,
    counts: dict[str, int],
    stop: anyio.Event,
    created: set[str],
) -> None:
    def say(line: str) -> None:
        print(line, file=out, flush=True)

    finished: dict[str, str] = {}
    # The Slack endpoint gets every lifecycle event the standard one gets; the demo stops
    # once every session is done and each of those messages arrived.
    lifecycle = chats = 0
    announced = False
    try:
        async with events:
            async for event in events:
                stamp = time.strftime("%H:%M:%S")
                if event.path == "/chat":  # the Slack-formatted endpoint
                    chats += 0 if event.duplicate else 1
                    lines = slack_lines(event.body)
                    say(f"{stamp}  slack message  {printable(lines[0])}")
                    for line in lines[1:]:
                        say(f"{'':25}{_message_line(line)}")
                    if announced and chats >= lifecycle:
                        stop.set()
                    continue
                counts["duplicates" if event.duplicate else "events"] += 1
                kind = str(event.body.get("type", ""))
                if kind in _LIFECYCLE and not event.duplicate:
                    lifecycle += 1
                    if kind != "session.action_required":
                        finished[_session_name(event.body)] = kind.removeprefix("session.")
                note = "signature ok" + (" (duplicate)" if event.duplicate else "")
                say(event_line(event.body, stamp=stamp, note=note))
                await _react(http, event, say)
                if not announced and created and set(finished) >= created:
                    announced = True
                    done = [finished[n] for n in created]
                    tally = ", ".join(f"{done.count(k)} {k}" for k in sorted(set(done)))
                    say(
                        f"{stamp}  all {len(created)} demo sessions are done ({tally}); "
                        "stopping once their chat messages arrived"
                    )
                if announced and chats >= lifecycle:
                    stop.set()
    except BrokenPipeError:  # `sessionhook demo | head`: nobody reads any more
        stop.set()


def _free_port() -> int:
    """A loopback port free now, for the relay's [server] listen (its action pages)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _until_stopped(stop: anyio.Event, duration: float | None) -> None:
    """Until SIGINT/SIGTERM, ``stop`` or ``duration`` seconds, whichever comes first."""

    async def on_signal(scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                scope.cancel()

    with anyio.move_on_after(duration if duration is not None else math.inf) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(on_signal, scope)
            await stop.wait()
            tg.cancel_scope.cancel()


async def run_demo(
    *,
    sessions: int = 3,
    step_delay: float = 1.0,
    duration: float | None = None,
    seed: int | None = None,
    emulator_port: int = 0,
    out: TextIO | None = None,
) -> dict[str, int]:
    """Run the demo until SIGINT/SIGTERM or ``duration`` seconds; return event counts.

    The counts are ``events`` (distinct events received), ``duplicates`` and ``rejected``
    (requests whose signature failed: always 0 unless something is badly wrong).
    """
    stream = sys.stdout if out is None else out
    api_key = "demo-" + secrets.token_hex(16)
    secret = signing.generate_secret()
    counts = {"events": 0, "duplicates": 0, "rejected": 0}
    stop = anyio.Event()
    send, receive = anyio.create_memory_object_stream[Delivery](100)
    consumer = Receiver([secret], send.send)  # every signature verified, 401 otherwise
    # Only warnings and errors of the relay, on stderr: stdout is for the events.
    relay_logging.configure("warning", "console")
    with tempfile.TemporaryDirectory(prefix="sessionhook-demo-") as tmp:
        emulator = create_app(api_keys=(api_key,), step_delay=step_delay, seed=seed)
        async with anyio.create_task_group() as tg, httpx.AsyncClient() as http:
            try:
                _, emu_port = await tg.start(serve, f"127.0.0.1:{emulator_port}", emulator)
                _, hook_port = await tg.start(serve, "127.0.0.1:0", consumer)
            except Exception as exc:
                raise DemoError(f"cannot start the demo servers: {exc}") from None
            base_url = f"http://127.0.0.1:{emu_port}"
            listen = f"127.0.0.1:{_free_port()}"
            config_path = _write_config(
                Path(tmp),
                base_url=base_url,
                api_key=api_key,
                hook_url=f"http://127.0.0.1:{hook_port}/hook",
                secret=secret,
                listen=listen,
            )
            daemon = Daemon(load_config(config_path, templates_here=False), config_path=config_path)
            api = SessionsClient(http, base_url=base_url, api_key=api_key)
            print(
                f"emulator on {base_url}, consumer on 127.0.0.1:{hook_port}, "
                f"store in {tmp}; Ctrl-C stops",
                file=stream,
                flush=True,
            )
            created_names: set[str] = set()
            tg.start_soon(_print_events, receive, http, stream, counts, stop, created_names)

            relay_done = anyio.Event()

            async def relay() -> None:
                try:
                    await daemon.run(handle_signals=False)
                finally:
                    relay_done.set()

            tg.start_soon(relay)
            # Sessions created before the relay's first start would be history to it
            # (backfill = false): create them once it runs.
            with anyio.fail_after(30):
                await daemon.ready.wait()
            print(
                f"console on http://{listen}/console, its token in {Path(tmp) / TOKEN_FILE}",
                file=stream,
                flush=True,
            )
            created = await _create_sessions(api, sessions)
            created_names.update(created)
            print(f"created {counted(len(created), 'session')}", file=stream, flush=True)
            await _until_stopped(stop, duration)
            daemon.stop()
            with anyio.move_on_after(15):
                await relay_done.wait()
            await send.aclose()
            tg.cancel_scope.cancel()
    counts["rejected"] = consumer.rejected
    with contextlib.suppress(BrokenPipeError):
        print(
            f"stopped: {counted(counts['events'], 'event')} received, "
            f"{counted(counts['duplicates'], 'duplicate')}, "
            f"{counted(counts['rejected'], 'failed signature check')}",
            file=stream,
            flush=True,
        )
    return counts
