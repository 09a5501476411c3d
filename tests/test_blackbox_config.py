"""Black-box tests of the config and operator-CLI hardening (issue 7): the real
``sessionhook run`` and operator commands in subprocesses, against the independent stand-in
of the Sessions API and the verifying consumer of ``tests/test_blackbox.py``.

Nothing is imported from ``sessionhook``; the store is read only through the operator
commands (``--json``), as an operator would.
"""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.loopback import free_port
from tests.support.relay_process import (
    Endpoint,
    Harness,
    clean_env,
    relay_config,
    run_cli,
    sessionhook,
    wait_ready,
    wait_until,
)
from tests.support.standin import StandIn

pytestmark = pytest.mark.process


def cli_json(*args: str, config: Path) -> Any:
    proc = run_cli(*args, "--json", "--config", str(config), env=clean_env(), cwd=config.parent)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# --------------------------------------------------------------------------- SESSIONHOOK_CONFIG


def test_run_honours_sessionhook_config(tmp_path: Path) -> None:
    """`run` finds its config like the operator commands: --config > $SESSIONHOOK_CONFIG >
    /etc/sessionhook/config.toml."""
    with StandIn() as standin:
        standin.add_session("one", state="IN_PROGRESS")
        store = tmp_path / "relay.db"
        config = tmp_path / "relay.toml"
        config.write_text(relay_config(standin=standin, store=store, endpoints=[]))
        env = clean_env(SESSIONHOOK_API_KEY=standin.api_key, SESSIONHOOK_CONFIG=str(config))
        proc = sessionhook("run", "--once", env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert store.is_file()
        assert standin.requests("list_sessions"), "the relay never polled"
        # The same config reaches the operator commands through the same variable.
        status = sessionhook("status", "--json", env=env, cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["sessions"] == 1

        # --config wins over the environment.
        other_store = tmp_path / "other.db"
        other = tmp_path / "other.toml"
        other.write_text(relay_config(standin=standin, store=other_store, endpoints=[]))
        proc = sessionhook("run", "--once", "--config", str(other), env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert other_store.is_file()

        # A variable naming a missing file is a config error: one line, exit 2.
        env["SESSIONHOOK_CONFIG"] = str(tmp_path / "missing.toml")
        proc = sessionhook("run", "--once", env=env, cwd=tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.splitlines() == [
            f"config error: {tmp_path / 'missing.toml'}: file not found"
        ]


# --------------------------------------------------------------------------- Retry-After


def test_retry_after_is_capped_and_rows_behind_show_what_they_wait_on(harness: Harness) -> None:
    """A consumer answering `Retry-After: 999999` parks its session for at most
    delivery.max_retry_after (default 1 h), and `deliveries` shows the rows queued behind
    the parked one as waiting on it, not as due now."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint(
        "parked", refuse_first=True, refuse_status=503, refuse_retry_after="999999"
    )
    session = standin.add_session("parked session", state="IN_PROGRESS")
    for i in range(3):
        standin.append_activity(session, "progressUpdated", description=f"step {i}")
    relay = harness.relay(
        standin,
        "relay",
        endpoints=[Endpoint("parked", url, secret)],
        backfill=True,
        retry_delays=(0.2, 0.2),
    )
    wait_ready(standin, relay)
    config = relay.config_path

    def rows() -> list[dict[str, Any]]:
        return list(cli_json("deliveries", config=config))

    wait_until(
        lambda: len(rows()) == 4 and any(r["attempts"] for r in rows()),
        20,
        "four deliveries, the first one tried",
        harness.diagnostics,
    )
    found = sorted(rows(), key=lambda r: r["id"])
    head, *behind = found
    assert len(consumer.hits("parked")) == 1
    assert (head["status"], head["attempts"], head["waiting_on"]) == ("failed", 1, None)
    # --json writes moments as RFC 3339 (UTC, microseconds, Z).
    parked = datetime.fromisoformat(head["next_attempt_at"])
    parked_for = (parked - datetime.fromisoformat(head["updated_at"])).total_seconds()
    assert 3590 <= parked_for <= 3605, f"parked for {parked_for:.0f} s, not the 1 h cap"
    assert [(r["status"], r["attempts"], r["waiting_on"]) for r in behind] == [
        ("pending", 0, head["id"])
    ] * 3

    table = run_cli(
        "deliveries", "--config", str(config), env=clean_env(), cwd=config.parent
    ).stdout
    lines = {int(line.split()[0]): line for line in table.splitlines()[1:]}
    assert "next in 59m" in lines[head["id"]] or "next in 1h" in lines[head["id"]], table
    for row in behind:
        assert f"waiting on #{head['id']}" in lines[row["id"]], table
        assert "due now" not in lines[row["id"]], table


# --------------------------------------------------------------------------- redaction

PASSWORD = "hunter2-0a9f"


def with_userinfo(url: str, userinfo: str = f"bot:{PASSWORD}") -> str:
    return url.replace("http://", f"http://{userinfo}@", 1)


def test_url_userinfo_is_never_shown_or_logged(harness: Harness) -> None:
    """An endpoint URL (and a base URL) carrying user:password@ works, and the password
    appears in no output: the daemon's log, `endpoints list` (table and --json),
    `endpoints test`, `status` (table and --json), `deliveries`, `attempts`."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("ci")
    session = standin.add_session("with credentials", state="IN_PROGRESS")
    standin.append_activity(session, "progressUpdated")
    text = relay_config(
        standin=standin,
        store=harness.tmp / "relay.db",
        endpoints=[
            Endpoint("ci", with_userinfo(url), secret),
            # Nothing listens on port 9: every attempt fails, with an error to show.
            Endpoint("down", with_userinfo("http://127.0.0.1:9/hook"), secret),
        ],
        backfill=True,
        retry_delays=(30.0,),
        timeout=2.0,
    ).replace(
        f'base_url = "{standin.base_url}"',
        f'base_url = "{with_userinfo(standin.base_url, f"tok:{PASSWORD}")}"',
    )
    relay = harness.start("relay", text, standin.api_key)
    wait_ready(standin, relay)
    wait_until(lambda: len(consumer.hits("ci")) >= 2, 20, "deliveries to ci", relay.diagnostics)
    code, _ = relay.terminate()
    assert code == 0, relay.diagnostics()
    config = relay.config_path
    env = clean_env(SESSIONHOOK_API_KEY=standin.api_key)
    assert PASSWORD not in relay.stdout + relay.stderr, relay.stderr
    started = next(e for e in relay.log_events() if e.get("event") == "relay.started")
    assert started["base_url"] == with_userinfo(standin.base_url, "[redacted]")

    # The consumer got its events, with the URL's credentials as Basic auth.
    hits = consumer.hits("ci")
    assert hits and all(h.verified for h in hits)
    assert hits[0].headers.get("authorization", "").startswith("Basic ")

    outputs = {}
    for args in (
        ("endpoints", "list"),
        ("endpoints", "list", "--json"),
        ("status",),
        ("status", "--json"),
        ("deliveries",),
        ("deliveries", "--json"),
        ("attempts", "1"),
        ("endpoints", "test", "ci"),
        ("endpoints", "test", "down"),
    ):
        proc = run_cli(*args, "--config", str(config), env=env, cwd=harness.tmp)
        outputs[args] = proc
        assert PASSWORD not in proc.stdout + proc.stderr, (args, proc.stdout, proc.stderr)
        assert "bot:" not in proc.stdout + proc.stderr, (args, proc.stdout, proc.stderr)
    assert outputs[("endpoints", "list")].returncode == 0
    assert "http://[redacted]@127.0.0.1" in outputs[("endpoints", "list")].stdout
    listed = json.loads(outputs[("endpoints", "list", "--json")].stdout)
    assert {e["name"]: e["url"] for e in listed} == {
        "ci": with_userinfo(url, "[redacted]"),
        "down": "http://[redacted]@127.0.0.1:9/hook",
    }
    status = json.loads(outputs[("status", "--json")].stdout)
    assert {e["url"] for e in status["endpoints"]} == {
        with_userinfo(url, "[redacted]"),
        "http://[redacted]@127.0.0.1:9/hook",
    }
    tested = outputs[("endpoints", "test", "ci")]
    assert tested.returncode == 0, tested.stderr
    assert tested.stdout.startswith(f"POST {with_userinfo(url, '[redacted]')}  webhook-id evt_")
    assert outputs[("endpoints", "test", "down")].returncode == 1


# --------------------------------------------------------------------------- upstream counts


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def metric(text: str, endpoint: str, status: str) -> float:
    prefix = f'sessionhook_upstream_requests_total{{endpoint="{endpoint}",status="{status}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def test_refused_keys_and_malformed_answers_count_as_errors(harness: Harness) -> None:
    """During a stream of 401s `status` reports errors (not `0 errors`); a 200 whose body is
    an HTML page is `status="malformed"` in /metrics, not `status="200"`."""
    standin = harness.standin()
    # A relay whose key the service refuses: discovery answers 401 (the relay then waits a
    # minute before it asks again, so one is what a test sees).
    refused = harness.relay(
        standin, "refused", endpoints=[], store=harness.tmp / "refused.db", api_key="wrong-key"
    )
    wait_until(
        lambda: any(r.status == 401 for r in standin.requests("list_sessions")),
        30,
        "a refused discovery",
        refused.diagnostics,
    )
    wait_until(
        lambda: cli_json("status", config=refused.config_path)["upstream"]["requests_last_hour"],
        10,
        "the refused request in the store",
        refused.diagnostics,
    )
    assert refused.alive(), refused.diagnostics()
    status = cli_json("status", config=refused.config_path)["upstream"]
    assert status["rejected_last_hour"] >= 1
    assert status["errors_last_hour"] >= status["rejected_last_hour"]
    table = run_cli(
        "status", "--config", str(refused.config_path), env=clean_env(), cwd=harness.tmp
    ).stdout
    assert " 0 errors" not in table and "key refused (401/403)" in table, table
    refused.terminate()

    # A service (or a proxy in front of it) answering 200 with an HTML page.
    standin.set_faults(rate_garbage=1.0, labels={"list_sessions"})
    port = free_port()
    text = relay_config(standin=standin, store=harness.tmp / "garbage.db", endpoints=[])
    garbage = harness.start(
        "garbage", text + f'[server]\nlisten = "127.0.0.1:{port}"\n', standin.api_key
    )

    def malformed_seen() -> bool:
        try:
            return metric(scrape(port), "list_sessions", "malformed") >= 3
        except OSError:
            return False

    wait_until(malformed_seen, 30, "three malformed answers in /metrics", garbage.diagnostics)
    scraped = scrape(port)
    assert metric(scraped, "list_sessions", "200") == 0, scraped
    status = cli_json("status", config=garbage.config_path)["upstream"]
    assert status["malformed_last_hour"] >= 3
    assert status["errors_last_hour"] >= status["malformed_last_hour"]
    garbage.terminate()
