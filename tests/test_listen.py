"""``sessionhook listen``, the local receiver: a real subprocess on a free loopback port,
fed requests signed by the ``standardwebhooks`` reference package (good, forged, stale,
unsigned, oversized, not JSON, hostile text), its output read as a user sees it, and
Ctrl-C. The printing helpers of :mod:`sessionhook.receiver` in process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from sessionhook import receiver as receiver_module
from sessionhook.receiver import Delivery, Receiver, event_line, json_line, printable
from sessionhook.relay.domain import signing
from sessionhook.relay.domain.events import EVENT_TYPES
from tests.support import forked_cli
from tests.support.relay_process import Endpoint, Harness, read_store, wait_ready, wait_until

pytestmark = pytest.mark.process

SESSIONHOOK = Path(sys.executable).parent / "sessionhook"
SECRET = signing.generate_secret()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    return {**env, **extra}


@dataclass
class Listener:
    proc: subprocess.Popen[bytes] | forked_cli.Forked
    url: str
    out: Path
    err: Path

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def stop(self) -> int:
        """Ctrl-C, and the exit status."""
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=20)


@contextmanager
def listening(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, fresh: bool = False
) -> Iterator[Listener]:
    """``sessionhook listen --port 0 ARGS`` until the block ends; yields it once it answers.
    Forked from the warm interpreter (tests/support/forked_cli.py); ``fresh``: the installed
    script, for what the process list shows."""
    out, err = tmp_path / "listen.out", tmp_path / "listen.err"
    argv = ["listen", "--port", "0", *args]
    proc: subprocess.Popen[bytes] | forked_cli.Forked
    if fresh:
        with out.open("wb") as out_file, err.open("wb") as err_file:
            proc = subprocess.Popen(
                [str(SESSIONHOOK), *argv],
                stdout=out_file,
                stderr=err_file,
                stdin=subprocess.DEVNULL,
                env=env or _env(),
            )
    else:
        out.touch()
        err.touch()
        proc = forked_cli.spawn(*argv, env=env or _env(), cwd=tmp_path, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(r"listening on (http://\S+) ", err.read_text())):
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "listen did not start within 30 s"
            time.sleep(0.05)
        yield Listener(proc, found.group(1), out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def signed(
    body: str, *, msg_id: str = "msg_1", secret: str = SECRET, age: float = 0
) -> dict[str, str]:
    """Standard Webhooks headers for ``body``, signed by the reference implementation."""
    when = datetime.now(tz=UTC) - timedelta(seconds=age)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, when, body),
        "content-type": "application/json",
    }


def event(kind: str = "session.discovered", title: str = "Add a health check") -> str:
    session = {"name": "sessions/12345678901234567890", "title": title, "state": "QUEUED"}
    body = {"type": kind, "timestamp": "2026-11-26T10:00:00Z", "data": {"session": session}}
    return json.dumps(body)


def wait_for_lines(read: Any, count: int) -> list[str]:
    deadline = time.monotonic() + 20
    while len(lines := read().splitlines()) < count:
        assert time.monotonic() < deadline, f"only {lines}"
        time.sleep(0.05)
    return lines


def test_listen_accepts_only_valid_signatures_and_prints_each_event(tmp_path: Path) -> None:
    hostile = "evil \x1b[2J\x1b]0;owned\x07 title \u202e"
    good = event(title=hostile)
    with listening(tmp_path, "--secret", SECRET) as listener:
        url = listener.url + "/hooks"
        answers = {
            "good": httpx.post(url, content=good, headers=signed(good)),
            "again": httpx.post(url, content=good, headers=signed(good)),
            "forged": httpx.post(
                url, content=good, headers=signed(good, secret=signing.generate_secret())
            ),
            "stale": httpx.post(url, content=good, headers=signed(good, age=600)),
            "from the future": httpx.post(url, content=good, headers=signed(good, age=-600)),
            "unsigned": httpx.post(url, content=good, headers={"webhook-id": "msg_2"}),
            "not json": httpx.post(url, content="{nope", headers=signed("{nope")),
            "a list": httpx.post(url, content="[1, 2]", headers=signed("[1, 2]")),
            "get": httpx.get(url),
        }
        wait_for_lines(listener.stderr, 1 + 7)
        assert listener.stop() == 130
        out, err = listener.stdout(), listener.stderr()
    assert {k: a.status_code for k, a in answers.items()} == {
        "good": 204,
        "again": 204,
        "forged": 401,
        "stale": 401,
        "from the future": 401,
        "unsigned": 401,
        "not json": 400,
        "a list": 400,
        "get": 405,
    }
    # Each refusal answered with its one-line reason, and printed.
    assert answers["forged"].text == "signature check failed: no matching signature\n"
    assert answers["stale"].text.startswith("signature check failed: timestamp too old")
    assert answers["from the future"].text.startswith("signature check failed: timestamp too new")
    assert "missing header webhook-timestamp" in answers["unsigned"].text
    assert answers["not json"].text.startswith("body is not JSON")
    assert answers["a list"].text == "body is JSON but not an object (list)\n"
    refusals = [line for line in err.splitlines()[1:] if line]  # click ends ^C with a \n
    assert len(refusals) == 7, err
    assert all(" refused " in line for line in refusals)
    assert "refused POST /hooks msg_1 from 127.0.0.1: 401 signature check failed" in refusals[0]
    assert "400 body is not JSON" in err and "405 method GET" in err
    # The accepted events, readably; the repeat marked; the upstream text escaped.
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert re.match(r"\d\d:\d\d:\d\d  session\.discovered +sessions/123456… ", lines[0])
    assert lines[0].endswith("signature ok") and lines[1].endswith("signature ok (duplicate)")
    assert r'"evil \x1b[2J\x1b]0;owned\x07 title \u202e" (QUEUED)' in lines[0]
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_listen_json_prints_headers_and_body_and_bounds_bodies(tmp_path: Path) -> None:
    body = event("session.completed", title="with C1 \x9b31m and é")
    big = json.dumps({"type": "x", "pad": "p" * 5000})
    with listening(
        tmp_path, "--json", "--max-body", "4096", env=_env(SESSIONHOOK_LISTEN_SECRET=SECRET)
    ) as listener:
        url = listener.url + "/any/path"
        ok = httpx.post(url, content=body, headers=signed(body, msg_id="msg_json"))
        too_big = httpx.post(url, content=big, headers=signed(big))
        deep = '{"a":' + "[" * 2000 + "]" * 2000 + "}"  # under --max-body
        too_deep = httpx.post(url, content=deep, headers=signed(deep))
        wait_for_lines(listener.stderr, 3)
        assert listener.stop() == 130
        out, err = listener.stdout(), listener.stderr()
    assert ok.status_code == 204 and too_big.status_code == 413
    assert too_deep.status_code == 400
    assert too_deep.text == "body is JSON nested too deeply to read\n"
    assert too_big.text == "body larger than 4096 bytes\n"
    [line] = out.splitlines()
    record = json.loads(line)
    assert record["path"] == "/any/path" and record["duplicate"] is False
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", record["received_at"])
    assert record["body"] == json.loads(body)
    assert record["headers"]["webhook-id"] == "msg_json"
    assert record["headers"]["webhook-signature"].startswith("v1,")
    assert set(record["headers"]) >= {"webhook-timestamp", "content-type", "user-agent"}
    assert "\x9b" not in line and "é" in line  # C1 escaped, the rest kept
    assert "413 body larger than 4096 bytes" in err and "Traceback" not in err


def test_listen_verifies_v1a_with_a_public_key(tmp_path: Path) -> None:
    signing_key, public_key = signing.generate_keypair()
    body = event()
    stamp = int(time.time())
    v1a = {
        "webhook-id": "msg_a",
        "webhook-timestamp": str(stamp),
        "webhook-signature": signing.sign_v1a(signing_key, "msg_a", stamp, body.encode()),
    }
    with listening(tmp_path, "--public-key", public_key) as listener:
        good = httpx.post(listener.url, content=body, headers=v1a)
        hmac_only = httpx.post(listener.url, content=body, headers=signed(body))
        wait_for_lines(listener.stdout, 1)
        assert listener.stop() == 130
    assert (good.status_code, hmac_only.status_code) == (204, 401)
    assert "v1a signatures checked" in listener.stderr()


def test_listen_refuses_to_start_without_a_key_or_on_a_taken_port(tmp_path: Path) -> None:
    nothing = forked_cli.run("listen", env=_env(), timeout=60)
    assert nothing.returncode == 2
    assert nothing.stderr.startswith("error: nothing to verify with — give the endpoint's")
    bad = forked_cli.run("listen", "--secret", "whsec_!!", env=_env(), timeout=60)
    assert bad.returncode == 2 and "cannot verify with whsec_!!" in bad.stderr
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        busy = forked_cli.run(
            "listen", "--port", str(port), "--secret", SECRET, env=_env(), timeout=60
        )
    assert busy.returncode == 1, busy.stderr
    assert (
        len(busy.stderr.splitlines()) == 1 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    )


def action_required(links: dict[str, str], action: str = "approve_plan") -> str:
    session = {"name": "sessions/12345678901234567890", "title": "t", "state": "QUEUED"}
    data = {"session": session, "action": action, "question": "Go on?", "links": links}
    return json.dumps({"type": "session.action_required", "data": data})


def test_listen_reads_its_secret_from_a_private_file_and_prints_links_whole(
    tmp_path: Path,
) -> None:
    """``--secret-file``: the secret never on the command line; the approve link of an
    action printed whole (a person clicks it)."""
    secret = tmp_path / "ci-bot.secret"
    secret.write_text(f"{signing.generate_secret()} {SECRET}\n")  # a rotation: two secrets
    secret.chmod(0o600)
    link = "http://127.0.0.1:9187/actions/" + "WzEsInNlc3Npb25zLzEyMzQ1Njc4OTAiXQ" * 4
    body = action_required({"approve": link, "open": "http://127.0.0.1:9187/console/x"})
    with listening(tmp_path, "--secret-file", str(secret), fresh=True) as listener:
        cmdline = Path(f"/proc/{listener.proc.pid}/cmdline").read_bytes()
        answer = httpx.post(listener.url, content=body, headers=signed(body))
        [line] = wait_for_lines(listener.stdout, 1)
        assert listener.stop() == 130
    assert answer.status_code == 204
    assert SECRET.encode() not in cmdline and b"--secret-file" in cmdline
    assert f"approve the plan (0 steps): {link} " in line and line.endswith("signature ok")
    assert "2 keys" in listener.stderr()


@pytest.mark.parametrize(
    ("mode", "text", "problem"),
    [
        (0o644, SECRET, "holds a secret but its group and other users can access it (mode 644)"),
        (0o640, SECRET, "holds a secret but its group can access it (mode 640)"),
        (0o604, SECRET, "holds a secret but other users can access it (mode 604)"),
        (0o600, "", "is empty"),
        (0o600, "whsec_!!", "cannot verify with whsec_!!"),
        (None, "", "cannot read"),
    ],
    ids=["644", "640", "604", "empty", "not a secret", "missing"],
)
def test_listen_refuses_a_secret_file_with_one_line(
    tmp_path: Path, mode: int | None, text: str, problem: str
) -> None:
    """The rule of every secret file (config/secret_files.py): a file its group or other
    users can read is refused, as the relay refuses it, in one line that says the fix."""
    secret = tmp_path / "s"
    if mode is not None:
        secret.write_text(text)
        secret.chmod(mode)
    done = forked_cli.run(
        "listen", "--port", "0", "--secret-file", str(secret), env=_env(), timeout=60
    )
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and problem in line, line
    assert SECRET not in done.stderr
    if mode is not None and mode & 0o077:
        assert line == f"error: --secret-file: {secret} {problem}: chmod 600 {secret}"


def test_action_links_are_printed_whole_and_escaped() -> None:
    long = "https://relay.example.com/actions/" + "x" * 300
    for action, key in (("approve_plan", "approve"), ("answer", "reply")):
        line = event_line(json.loads(action_required({key: long}, action)), stamp="10:00:00")
        assert f" {long} " in line or line.endswith(f" {long}"), line
    hostile = "https://relay.example.com/actions/\x1b]8;;http://evil\x07x"
    line = event_line(json.loads(action_required({"approve": hostile})), stamp="10:00:00")
    assert "\x1b" not in line and r"actions/\x1b]8;;http://evil\x07x" in line
    # Anything but an http(s) URL is no link to print: the API call is shown instead.
    for odd in ("javascript:alert(1)", 5, None, ["http://x"]):
        body = json.loads(action_required({}))
        body["data"]["links"] = {"approve": odd}
        body["data"]["call"] = {"path": "/v1alpha/sessions/1:approvePlan"}
        line = event_line(body, stamp="10:00:00")
        assert "approve the plan (0 steps): POST …:approvePlan" in line, line


def test_printable_escapes_terminal_controls_and_keeps_the_rest() -> None:
    assert printable("a\x1b[31mb\x07\r\x9b\u202e\u2066é✓") == (
        r"a\x1b[31mb\x07\x0d\x9b\u202e\u2066é✓"
    )
    line = json_line({"t": "\x1b\x85\u2028é"})
    assert json.loads(line) == {"t": "\x1b\x85\u2028é"}
    assert not re.search("[\x00-\x1f\x7f-\x9f\u2028]", line)
    body = {
        "type": "activity.agent_messaged",
        "data": {
            "session": {"name": "sessions/1\x1b"},
            "activity": {"agentMessaged": {"agentMessage": "hi\x1b]8;;http://x\x07"}},
        },
    }
    shown = event_line(body, stamp="10:00:00")
    assert "\x1b" not in shown and "\x07" not in shown
    assert r"hi\x1b]8;;http://x\x07" in shown and r"sessions/1\x1b" in shown
    assert event_line({"type": "x.\x1b[1m"}, stamp="10:00:00").startswith(r"10:00:00  x.\x1b[1m")


@pytest.mark.parametrize("kind", sorted(EVENT_TYPES))
def test_event_line_reads_any_shape_of_body(kind: str) -> None:
    """Whatever a signed body holds where an event has its fields (a number, a string, a
    list, null, another object), its line is printed, never an exception."""
    paths = [
        ("data", "session"),
        ("data", "activity"),
        ("data", "call"),
        ("data", "plan"),
        ("data", "plan", "steps"),
        ("data", "outputs"),
        ("data", "outputs", "pull_requests"),
        ("data", "outputs", "change_set"),
        ("data", "pull_request"),
        ("data", "activity", "planGenerated", "plan", "steps"),
        ("data", "activity", "agentMessaged"),
    ]
    for path in paths:
        for odd in (5, "s\x1b", [1, "x"], None, {"url": 3}, [{"url": ["\x1b"]}], True, 1.5):
            body: dict[str, Any] = {"type": kind, "data": {"action": "approve_plan"}}
            node = body
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = odd
            line = event_line(body, stamp="10:00:00")
            assert line.startswith(f"10:00:00  {kind}") and "\x1b" not in line


def test_listen_stops_quietly_when_its_reader_goes_away() -> None:
    """``sessionhook listen | head -1``: once stdout is closed, the next event ends the
    command with status 0 and nothing on stderr but the banner."""
    body = json.dumps({"type": "x.y", "data": {}})
    answers: list[int] = []
    with subprocess.Popen(
        [str(SESSIONHOOK), "listen", "--port", "0", "--secret", SECRET],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=_env(),
    ) as proc:
        try:
            assert proc.stderr is not None and proc.stdout is not None
            banner = proc.stderr.readline().decode()
            found = re.search(r"listening on (http://\S+) ", banner)
            assert found is not None, banner
            for n in range(1, 10):
                try:
                    answer = httpx.post(
                        found.group(1), content=body, headers=signed(body, msg_id=f"m{n}")
                    )
                except httpx.ConnectError:
                    break  # the listener stopped: its port is closed
                answers.append(answer.status_code)
                if n == 1:
                    assert b"  x.y  " in proc.stdout.readline()
                    proc.stdout.close()  # the reader goes away
                time.sleep(0.2)
            assert proc.wait(timeout=20) == 0
            rest = proc.stderr.read().decode()
        finally:
            if proc.poll() is None:
                proc.kill()
    assert 2 <= len(answers) < 9 and set(answers) == {204}
    assert rest == "", rest


@pytest.mark.anyio
async def test_the_receiver_takes_any_of_its_keys_and_remembers_a_bounded_number_of_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process: during a rotation either secret verifies (and a header with several
    signatures, one of them unknown); the ids kept to tell duplicates are bounded."""
    monkeypatch.setattr(receiver_module, "REMEMBERED", 3)
    old, new = signing.generate_secret(), signing.generate_secret()
    got: list[Delivery] = []

    async def keep(delivery: Delivery) -> None:
        got.append(delivery)

    app = Receiver([f"{old} {new}"], keep)
    body = event()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://rx.test"
    ) as http:
        rotated = signed(body, msg_id="r1", secret=signing.generate_secret())
        rotated["webhook-signature"] += (
            " " + signed(body, msg_id="r1", secret=new)["webhook-signature"]
        )
        statuses = [
            (await http.post("/", content=body, headers=signed(body, msg_id="o1", secret=old))),
            (await http.post("/", content=body, headers=signed(body, msg_id="n1", secret=new))),
            (await http.post("/", content=body, headers=rotated)),
        ]
        for n in ("a", "b", "c", "o1", "c"):  # o1 is the fourth id back: forgotten; c is not
            await http.post("/", content=body, headers=signed(body, msg_id=n, secret=old))
    assert [a.status_code for a in statuses] == [204, 204, 204]
    assert [d.webhook_id for d in got] == ["o1", "n1", "r1", "a", "b", "c", "o1", "c"]
    assert [d.duplicate for d in got] == [False] * 7 + [True]
    with pytest.raises(ValueError, match="cannot verify with whsk_"):
        Receiver([signing.generate_keypair()[0]], keep)


def test_respond_answers_accepted_messages_and_events_prints_only_those(tmp_path: Path) -> None:
    """``--respond 429 --retry-after 7``: what it accepts is answered so (the line says
    it); ``--events session.*``: other types answered 204, counted, not printed; a forged
    message is still refused with 401."""
    secret = tmp_path / "hook.secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    args = ["--secret-file", str(secret), "--respond", "429", "--retry-after", "7"]
    with listening(tmp_path, *args, "--events", "session.*") as listener:
        wanted, other = event("session.discovered"), event("activity.plan_generated")
        first = httpx.post(listener.url + "/h", content=wanted, headers=signed(wanted))
        skipped = [
            httpx.post(listener.url, content=other, headers=signed(other, msg_id=f"msg_o{n}"))
            for n in range(2)
        ]
        forged = httpx.post(
            listener.url, content=wanted, headers=signed(wanted, secret=signing.generate_secret())
        )
        [line] = wait_for_lines(listener.stdout, 1)
        assert listener.stop() == 130
    assert (first.status_code, first.headers["retry-after"]) == (429, "7")
    assert [a.status_code for a in skipped] == [204, 204]
    assert forged.status_code == 401
    assert "session.discovered" in line and line.endswith("signature ok, answered 429")
    err = listener.stderr()
    assert "only session.* printed (others answered 204); answering 429, Retry-After: 7" in err
    assert "2 messages of other types answered 204, not printed" in err
    assert "activity.plan_generated" not in listener.stdout()


def test_respond_500_makes_the_relay_record_failed_attempts_and_retry(
    tmp_path: Path, harness: Harness
) -> None:
    """The real daemon (``sessionhook run``) delivering to ``listen --respond 500``: each
    attempt is recorded as a 500 and retried, and listen printed each one."""
    secret = tmp_path / "hook.secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    with listening(tmp_path, "--secret-file", str(secret), "--respond", "500") as listener:
        standin = harness.standin()
        endpoint = Endpoint("hook", listener.url + "/hook", SECRET)
        relay = harness.relay(standin, "main", endpoints=[endpoint], retry_delays=[0.05] * 3)
        wait_ready(standin, relay)  # a session older than the first discovery is history
        standin.add_session("A task")
        store = harness.tmp / "relay.db"

        def retried() -> bool:
            try:
                rows = read_store(store, "SELECT delivery_id, status_code FROM attempts")
            except sqlite3.OperationalError:  # not made yet, or being migrated
                return False
            per: dict[int, list[int | None]] = {}
            for delivery, status in rows:
                per.setdefault(delivery, []).append(status)
            return any(len(s) >= 3 and set(s) == {500} for s in per.values())

        wait_until(retried, 60, "three attempts answered 500", relay.diagnostics)
        lines = listener.stdout().splitlines()
        assert listener.stop() == 130
    assert lines and all(line.endswith(", answered 500") for line in lines)
    assert any(line.endswith("signature ok (duplicate), answered 500") for line in lines)
