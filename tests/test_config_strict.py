"""Strict configuration: what a careless operator writes is refused with one line, never
coerced into something else and never a traceback.

Unit tests through ``load_config``; the cases named in issue 7 also run the real
``sessionhook run`` command in a subprocess (exit status 2, exactly one line on stderr).
"""

from __future__ import annotations

import base64
import math
from pathlib import Path

import pytest

from sessionhook.relay.config import (
    DURATION_BOUNDS,
    SECRET_MAX_BYTES,
    SECRET_MIN_BYTES,
    ConfigError,
    load_config,
)
from tests.support import forked_cli

pytestmark = pytest.mark.app

ENV = {"SESSIONHOOK_API_KEY": "key-123"}


def secret_of(size: int) -> str:
    return "whsec_" + base64.b64encode(b"s" * size).decode()


GOOD_SECRET = secret_of(32)


def endpoint(extra: str = "", secret_line: str = f'secret = "{GOOD_SECRET}"') -> str:
    return (
        f'[[endpoints]]\nname = "ci"\nurl = "https://hooks.example.com/x"\n{secret_line}\n{extra}\n'
    )


def error_of(tmp_path: Path, text: str | bytes, env: dict[str, str] | None = None) -> str:
    path = tmp_path / "config.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, env=ENV if env is None else env)
    message = str(info.value)
    assert "\n" not in message
    return message.removeprefix("config error: ")


# --------------------------------------------------------------------------- encoding


def test_non_utf8_config_is_one_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, b'[api]\nbase_url = "http://h\xff\xfe"\n')
    assert message == f"{tmp_path / 'config.toml'}: not UTF-8 text (byte 26)"


def test_non_utf8_secret_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"whsec_\xff\xfe")
    (tmp_path / "secret").chmod(0o600)
    message = error_of(tmp_path, endpoint(secret_line='secret_file = "secret"'))
    assert message.startswith("endpoints[0].secret_file: ")
    assert message.endswith("is not UTF-8 text (byte 6)")


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "+inf"])
@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("poll", "active_interval"),
        ("poll", "idle_interval"),
        ("poll", "discovery_interval"),
        ("delivery", "timeout"),
        ("delivery", "max_retry_after"),
    ],
)
def test_non_finite_durations_are_refused(
    tmp_path: Path, section: str, key: str, value: str
) -> None:
    message = error_of(tmp_path, f"[{section}]\n{key} = {value}\n")
    assert message.startswith(f"{section}.{key}: must be ")


def test_non_finite_retry_delay_and_disable_after(tmp_path: Path) -> None:
    assert error_of(tmp_path, "[delivery]\nretry_delays = [5, inf]\n") == (
        "delivery.retry_delays[1]: must be a finite number"
    )
    assert error_of(tmp_path, endpoint("disable_after = nan")) == (
        "endpoints[0].disable_after: must be a finite number"
    )


@pytest.mark.parametrize(("key", "bounds"), sorted(DURATION_BOUNDS.items()))
def test_every_duration_has_an_upper_bound(
    tmp_path: Path, key: str, bounds: tuple[int, int]
) -> None:
    """Just above the documented bound is refused; the bound itself is accepted."""
    high = bounds[1]
    section, name = key.split(".")
    name = name.removesuffix("[]")

    def text(seconds: float) -> str:
        if section == "endpoints[]":
            return endpoint(f"{name} = {seconds!r}")
        value = f"[{seconds!r}]" if key.endswith("[]") else repr(seconds)
        return f"[{section}]\n{name} = {value}\n"

    message = error_of(tmp_path, text(high + 1.0))
    assert f": must be <= {high}" in message
    (tmp_path / "ok.toml").write_text(text(float(high)), encoding="utf-8")
    load_config(tmp_path / "ok.toml", env=ENV)  # the bound itself is fine


def test_durations_take_units_everywhere(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '[poll]\nactive_interval = "2s"\nidle_interval = "1m"\ndiscovery_interval = 10\n'
        '[delivery]\nretry_delays = ["5s", 60, "1h"]\ntimeout = "15s"\nmax_retry_after = "30m"\n'
        + endpoint('disable_after = "2d"'),
        encoding="utf-8",
    )
    config = load_config(path, env=ENV)
    assert (config.poll.active_interval, config.poll.idle_interval) == (2.0, 60.0)
    assert config.delivery.retry_delays == (5.0, 60.0, 3600.0)
    assert (config.delivery.timeout, config.delivery.max_retry_after) == (15.0, 1800.0)
    assert config.endpoints[0].disable_after == 2 * 86400.0
    assert all(math.isfinite(d) for d in config.delivery.retry_delays)


# --------------------------------------------------------------------------- strict types


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[delivery]\nallow_private_networks = "yes"\n', "must be true or false"),
        ("[delivery]\nallow_private_networks = 1\n", "must be true or false"),
        ('[poll]\nbackfill = "true"\n', "must be true or false"),
        ("[poll]\nbackfill = 0\n", "must be true or false"),
        ('[delivery]\nconcurrency = "4"\n', "must be an integer"),
        ("[delivery]\nconcurrency = 4.0\n", "must be an integer"),
        ("[delivery]\nconcurrency = true\n", "must be an integer"),
        ('[delivery]\ntimeout = "15"\n', "must be a duration such as"),
        ("[delivery]\ntimeout = true\n", "must be a duration such as"),
        ('[delivery]\nretry_delays = ["5"]\n', "must be a duration such as"),
        ('[api]\nrequests_per_minute = "600"\n', "must be an integer"),
        ("[api]\nbase_url = 8080\n", "must be a string"),
        ("[store]\npath = 3\n", "must be a string"),
        ("[log]\nlevel = 1\n", "must be one of"),
        ("[server]\nlisten = 9187\n", "must be a string"),
        ("[delivery]\nmax_media_bytes = 1e3\n", "must be an integer"),
    ],
)
def test_no_coercion(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(tmp_path, text)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('enabled = "no"', "endpoints[0].enabled: must be true or false"),
        ("enabled = 0", "endpoints[0].enabled: must be true or false"),
        ("events = [1]", "endpoints[0].events[0]: must be a string"),
        ('events = "*"', "endpoints[0].events: must be a list"),
    ],
)
def test_no_coercion_in_endpoints(tmp_path: Path, extra: str, expected: str) -> None:
    assert error_of(tmp_path, endpoint(extra)) == expected
    assert error_of(tmp_path, endpoint(secret_line="secret = 5")) == (
        "endpoints[0].secret: must be a string"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[delivery]\nconcurrency = 100000\n", "delivery.concurrency: must be <= 1024"),
        ("[delivery]\nresponse_body_limit = 1e9\n", "delivery.response_body_limit: must be an"),
        (
            "[delivery]\nresponse_body_limit = 1000000000\n",
            "delivery.response_body_limit: must be <= 1048576",
        ),
        ("[delivery]\nretry_delays = [" + "1, " * 101 + "1]\n", "delivery.retry_delays: has too"),
    ],
)
def test_absurd_sizes_are_refused(tmp_path: Path, text: str, expected: str) -> None:
    assert error_of(tmp_path, text).startswith(expected)


# --------------------------------------------------------------------------- secrets


@pytest.mark.parametrize("size", [1, SECRET_MIN_BYTES - 1, SECRET_MAX_BYTES + 1])
def test_secret_length_is_checked_for_every_source(tmp_path: Path, size: int) -> None:
    bad = secret_of(size)
    expected = f"a secret must decode to 24 to 64 bytes, not {size}"
    assert expected in error_of(tmp_path, endpoint(secret_line=f'secret = "{bad}"'))
    env_message = error_of(
        tmp_path, endpoint(secret_line='secret_env = "CI_SECRET"'), env={**ENV, "CI_SECRET": bad}
    )
    assert env_message.startswith("endpoints[0].secret_env: not a valid secret")
    assert expected in env_message
    (tmp_path / "ci-secret").write_text(bad + "\n")
    (tmp_path / "ci-secret").chmod(0o600)
    file_message = error_of(tmp_path, endpoint(secret_line='secret_file = "ci-secret"'))
    assert file_message.startswith("endpoints[0].secret_file: not a valid secret")
    assert expected in file_message
    # A rotation pair is checked secret by secret.
    pair = error_of(tmp_path, endpoint(secret_line=f'secret = "{GOOD_SECRET} {bad}"'))
    assert expected in pair
    assert bad not in pair and GOOD_SECRET not in pair


def test_the_issue_secret_is_refused(tmp_path: Path) -> None:
    assert error_of(tmp_path, endpoint(secret_line='secret = "whsec_AA=="')) == (
        "endpoints[0].secret: a secret must decode to 24 to 64 bytes, not 1 "
        "(create one with `sessionhook secret generate`)"
    )


@pytest.mark.parametrize("size", [SECRET_MIN_BYTES, 32, SECRET_MAX_BYTES])
def test_secret_lengths_in_range_are_accepted(tmp_path: Path, size: int) -> None:
    path = tmp_path / "config.toml"
    path.write_text(endpoint(secret_line=f'secret = "{secret_of(size)}"'), encoding="utf-8")
    assert load_config(path, env=ENV).endpoints[0].secrets[0].get_secret_value() == secret_of(size)


# --------------------------------------------------------------------------- the real command


@pytest.mark.process  # the sessionhook command in a subprocess
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'[api]\nbase_url = "http://127.0.0.1:\xff"\n', "not UTF-8 text"),
        (b"[poll]\nactive_interval = inf\n", "poll.active_interval: must be a finite number"),
        (
            b'[delivery]\nallow_private_networks = "yes"\n',
            "delivery.allow_private_networks: must be true or false",
        ),
        (
            endpoint(secret_line='secret = "whsec_AA=="').encode(),
            "endpoints[0].secret: a secret must decode to 24 to 64 bytes, not 1",
        ),
    ],
    ids=["non-utf8", "inf", "yes", "short-secret"],
)
def test_run_refuses_with_one_line_and_exit_2(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(content)
    env = {"SESSIONHOOK_API_KEY": "k", "PATH": "/usr/bin:/bin"}
    args = ["run", "--config", str(config), "--once"]
    proc = forked_cli.run(*args, env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("config error: ")
    assert expected in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "sessionhook.db").exists()
