"""URL user-info never reaches an output: the helper, the log processor, the CLI, errors."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from sessionhook.redact import redact_userinfo
from sessionhook.relay.telemetry import logs as relay_logging

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://user:pw@host/", "http://[redacted]@host/"),
        ("https://TOKEN@api.example.com", "https://[redacted]@api.example.com"),
        ("https://u:p@ss@h.example/x?y=a@b", "https://[redacted]@h.example/x?y=a@b"),
        ("HTTP://U:P@H:8080/p", "HTTP://[redacted]@H:8080/p"),
        (
            "POST http://a:b@x/ and http://c:d@y/z failed",
            "POST http://[redacted]@x/ and http://[redacted]@y/z failed",
        ),
        ('{"url": "http://a:secret@h/"}', '{"url": "http://[redacted]@h/"}'),
        ("http://host/path?mail=a@b.example", "http://host/path?mail=a@b.example"),
        ("mail me at ops@example.com", "mail me at ops@example.com"),
        ("https://hooks.example.com/in", "https://hooks.example.com/in"),
        ("", ""),
    ],
)
def test_redact_userinfo(text: str, expected: str) -> None:
    assert redact_userinfo(text) == expected


def test_log_lines_never_carry_url_userinfo() -> None:
    out = io.StringIO()
    relay_logging.configure("info", "json", stream=out)
    try:
        log = relay_logging.get_logger()
        log.info(
            "relay.started",
            base_url="https://tok123@api.example.com",
            endpoints={"ci": "http://bot:hunter2@hooks.example.com/in"},
            error="ConnectError: http://bot:hunter2@hooks.example.com/in refused",
        )
        try:
            raise RuntimeError("cannot reach http://bot:hunter2@hooks.example.com/in")
        except RuntimeError:
            log.exception("delivery.crashed")
    finally:
        relay_logging.reset()
        structlog.reset_defaults()
    text = out.getvalue()
    assert "hunter2" not in text and "tok123" not in text and "bot:" not in text
    first = json.loads(text.splitlines()[0])
    assert first["base_url"] == "https://[redacted]@api.example.com"
    assert first["endpoints"] == {"ci": "http://[redacted]@hooks.example.com/in"}
