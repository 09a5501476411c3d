"""Logging: JSON lines off a terminal, console on one, dotted events, secrets never shown."""

from __future__ import annotations

import io
import json
import logging as stdlib_logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from sessionhook.relay.telemetry import logs as relay_logging

pytestmark = pytest.mark.unit

API_KEY = "sk-live-3f9a8b7c6d5e4f3a2b1c"
WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
WEBHOOK_KEY = WEBHOOK_SECRET.removeprefix("whsec_")


@pytest.fixture(autouse=True)
def _clean_logging() -> Iterator[None]:
    root = stdlib_logging.getLogger()
    level = root.level
    yield
    relay_logging.reset()
    structlog.contextvars.clear_contextvars()
    root.setLevel(level)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line]


def test_json_lines_with_level_iso_timestamp_and_context() -> None:
    out = io.StringIO()
    relay_logging.configure("info", "auto", out)  # a StringIO is not a terminal: JSON
    structlog.contextvars.bind_contextvars(endpoint="ci")
    relay_logging.get_logger().info("delivery.failed", status=503, attempt=3)
    relay_logging.get_logger().debug("delivery.due", count=1)  # below the threshold

    [line] = _json_lines(out)
    assert line["event"] == "delivery.failed"
    assert line["level"] == "info"
    assert line["endpoint"] == "ci"
    assert (line["status"], line["attempt"]) == (503, 3)
    assert line["timestamp"].endswith("Z") and "T" in line["timestamp"]


def test_console_rendering_on_a_terminal() -> None:
    out = _Terminal()
    relay_logging.configure("debug", "auto", out)
    relay_logging.get_logger().debug("relay.started", endpoints=2)
    text = out.getvalue()
    assert "relay.started" in text
    assert "endpoints" in text and "2" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_format_can_be_forced_either_way() -> None:
    terminal = _Terminal()
    relay_logging.configure("info", "json", terminal)
    relay_logging.get_logger().info("relay.started")
    assert _json_lines(terminal)[0]["event"] == "relay.started"

    plain = io.StringIO()
    relay_logging.configure("info", "console", plain)
    relay_logging.get_logger().info("relay.stopped")
    assert "relay.stopped" in plain.getvalue()
    assert not plain.getvalue().lstrip().startswith("{")


@pytest.mark.parametrize(("level", "fmt"), [("loud", "auto"), ("info", "xml")])
def test_bad_level_or_format_is_a_value_error(level: str, fmt: str) -> None:
    with pytest.raises(ValueError, match="unknown log"):
        relay_logging.configure(level, fmt, io.StringIO())


def test_sensitive_keys_are_masked_at_any_depth() -> None:
    out = io.StringIO()
    relay_logging.configure("info", "json", out)
    relay_logging.get_logger().info(
        "api.request",
        api_key="anything",
        headers={"Authorization": "Bearer abc", "X-Goog-Api-Key": "abc", "accept": "json"},
        endpoint_secret="whsec_x",
        access_token="t",
        next_page_token="page-2",  # not a secret: kept for debugging pagination
    )
    [line] = _json_lines(out)
    assert line["api_key"] == relay_logging.REDACTED
    assert line["endpoint_secret"] == relay_logging.REDACTED
    assert line["access_token"] == relay_logging.REDACTED
    assert line["headers"] == {
        "Authorization": relay_logging.REDACTED,
        "X-Goog-Api-Key": relay_logging.REDACTED,
        "accept": "json",
    }
    assert line["next_page_token"] == "page-2"


def test_registered_secrets_are_scrubbed_from_every_value() -> None:
    out = io.StringIO()
    relay_logging.configure("info", "json", out)
    relay_logging.register_secret(API_KEY)
    relay_logging.register_secret(WEBHOOK_SECRET)
    structlog.contextvars.bind_contextvars(url=f"https://x.test/hook?key={API_KEY}")

    class Request:
        def __repr__(self) -> str:
            return f"Request(key={API_KEY})"

    log = relay_logging.get_logger()
    log.info(f"weird.event.{API_KEY}", detail=[{"deep": f"k={WEBHOOK_KEY}"}], obj=Request())
    try:
        raise RuntimeError(f"upstream refused key {API_KEY} and {WEBHOOK_SECRET}")
    except RuntimeError:
        log.exception("poll.crashed")

    text = out.getvalue()
    assert API_KEY not in text
    assert WEBHOOK_SECRET not in text
    assert WEBHOOK_KEY not in text
    first, second = _json_lines(out)
    assert first["url"] == f"https://x.test/hook?key={relay_logging.REDACTED}"
    assert first["event"] == f"weird.event.{relay_logging.REDACTED}"
    assert first["detail"] == [{"deep": f"k={relay_logging.REDACTED}"}]
    assert first["obj"] == f"Request(key={relay_logging.REDACTED})"
    assert second["event"] == "poll.crashed"
    assert "RuntimeError: upstream refused key [redacted] and [redacted]" in second["exception"]


def test_secret_str_and_tiny_values_on_registration() -> None:
    from pydantic import SecretStr

    out = io.StringIO()
    relay_logging.configure("info", "json", out)
    relay_logging.register_secret(SecretStr(API_KEY))
    relay_logging.register_secret("")  # ignored: would otherwise match everywhere
    relay_logging.register_secret("abc")  # ignored: too short to be a real secret
    relay_logging.register_secret(None)
    relay_logging.get_logger().info("relay.started", note=f"abc {API_KEY}")
    [line] = _json_lines(out)
    assert line["note"] == f"abc {relay_logging.REDACTED}"


def test_standard_library_records_share_the_chain() -> None:
    # As if uvicorn had applied its default logging config earlier in this process.
    uvicorn_error = stdlib_logging.getLogger("uvicorn.error")
    uvicorn_error.addHandler(stdlib_logging.StreamHandler(io.StringIO()))
    uvicorn_error.propagate = False
    out = io.StringIO()
    relay_logging.configure("info", "json", out)
    relay_logging.register_secret(API_KEY)
    stdlib_logging.getLogger("uvicorn.error").warning("bad request with %s", API_KEY)
    stdlib_logging.getLogger("httpx").info("HTTP Request: GET /v1 200")  # quietened
    [line] = _json_lines(out)
    assert line["event"] == "bad request with [redacted]"
    assert line["level"] == "warning"
    assert line["logger"] == "uvicorn.error"
    assert uvicorn_error.handlers == [] and uvicorn_error.propagate


def test_reconfiguring_replaces_the_handler_and_reaches_existing_loggers() -> None:
    first, second = io.StringIO(), io.StringIO()
    relay_logging.configure("info", "json", first)
    log = relay_logging.get_logger(component="relay")
    relay_logging.configure("warning", "json", second)  # e.g. a SIGHUP reload
    log.info("relay.reloaded")  # now below the threshold
    log.warning("relay.slow")
    stdlib_logging.getLogger("anything").warning("once")
    assert first.getvalue() == ""
    lines = _json_lines(second)
    assert [line["event"] for line in lines] == ["relay.slow", "once"]
    assert lines[0]["component"] == "relay"
    assert [h.get_name() for h in stdlib_logging.getLogger().handlers].count("sessionhook") == 1


def test_reset_undoes_configure() -> None:
    out = io.StringIO()
    relay_logging.configure("info", "json", out)
    relay_logging.register_secret(API_KEY)
    relay_logging.reset()
    assert "sessionhook" not in [h.get_name() for h in stdlib_logging.getLogger().handlers]
    with capture_logs(processors=[relay_logging.redact]) as logs:
        relay_logging.get_logger().info("relay.started", key=API_KEY)
    assert logs[0]["key"] == API_KEY  # the secret registry was cleared too
    assert out.getvalue() == ""


def test_redact_processor_under_capture_logs() -> None:
    relay_logging.register_secret(API_KEY)
    with capture_logs(processors=[relay_logging.redact]) as logs:
        relay_logging.get_logger().info("api.request", url=f"/x?k={API_KEY}", token="t")
    assert logs == [
        {
            "event": "api.request",
            "log_level": "info",
            "url": f"/x?k={relay_logging.REDACTED}",
            "token": relay_logging.REDACTED,
        }
    ]


def test_line_budget_writes_per_second_and_counts_the_rest_once() -> None:
    now = [100.0]
    budget = relay_logging.LineBudget(3, clock=lambda: now[0])
    admitted = [budget.admit("a" if i % 2 else "b") for i in range(7)]
    assert admitted == [True, True, True, False, False, False, False]
    assert budget.unlisted() == {}  # its second is not over
    now[0] += 1.0
    assert budget.unlisted() == {"a": 2, "b": 2}
    assert budget.unlisted() == {}  # handed out once
    assert [budget.admit("a") for _ in range(4)] == [True, True, True, False]  # a new second
    assert budget.unlisted(now=True) == {"a": 1}
