"""``[server]`` access keys: token from the environment or a file, the loopback opt-out."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionhook.relay.config import Config, ConfigError, is_loopback, load_config

pytestmark = pytest.mark.unit

TOKEN = "A" * 16 + "b" * 16 + "-_9"
ENV = {"SESSIONHOOK_API_KEY": "key-123", "WEB_TOKEN": TOKEN}


def _load(tmp_path: Path, server: str, env: dict[str, str] | None = None) -> Config:
    path = tmp_path / "config.toml"
    path.write_text("[server]\n" + server, encoding="utf-8")
    return load_config(path, env=ENV if env is None else env)


def _error(tmp_path: Path, server: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, server, env)
    assert "\n" not in str(info.value)
    assert TOKEN not in str(info.value)
    return str(info.value).removeprefix("config error: ")


def test_token_from_the_environment(tmp_path: Path) -> None:
    config = _load(tmp_path, 'token_env = "WEB_TOKEN"\n')
    assert config.server is not None and config.server.web_enabled
    assert config.server.token is not None
    assert config.server.token.get_secret_value() == TOKEN
    assert TOKEN not in repr(config)
    assert config.server.max_streams == 32


def test_token_from_a_private_file(tmp_path: Path) -> None:
    file = tmp_path / "web-token"
    file.write_text(TOKEN + "\n")
    file.chmod(0o600)
    config = _load(tmp_path, 'token_file = "web-token"\n')
    assert config.server is not None and config.server.token is not None
    assert config.server.token.get_secret_value() == TOKEN


def test_a_token_file_other_users_can_read_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "web-token"
    file.write_text(TOKEN)
    file.chmod(0o644)
    message = _error(tmp_path, 'token_file = "web-token"\n')
    assert message.startswith("server.token_file: ") and "chmod 600" in message


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("short", "must be 32 to 512 characters, not 5"),
        ("x" * 513, "must be 32 to 512 characters, not 513"),
        ("a" * 20 + " " + "b" * 20, "visible ASCII characters without spaces"),
        ("é" * 40, "visible ASCII characters without spaces"),
    ],
)
def test_token_bounds(tmp_path: Path, token: str, problem: str) -> None:
    message = _error(tmp_path, 'token_env = "WEB_TOKEN"\n', {**ENV, "WEB_TOKEN": token})
    assert message.startswith("server.token_env: ") and problem in message


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ('token_env = "NOPE"\n', "server.token_env: environment variable NOPE is not set"),
        ('token_file = "missing"\n', "server.token_file: cannot read"),
        ('token_env = "WEB_TOKEN"\ntoken_file = "x"\n', "set token_env or token_file, not both"),
        (
            'token_env = "WEB_TOKEN"\nallow_unauthenticated = true\n',
            "allow_unauthenticated = true and a token exclude each other",
        ),
        (
            'listen = "0.0.0.0:9187"\nallow_unauthenticated = true\n',
            "allow_unauthenticated = true needs a loopback listen address, not 0.0.0.0",
        ),
        ('allow_unauthenticated = "yes"\n', "server.allow_unauthenticated: must be true or false"),
        ("max_streams = 0\n", "server.max_streams: must be >= 1"),
        ('token_env = ""\n', "server.token_env: must not be empty"),
    ],
)
def test_server_access_errors(tmp_path: Path, server: str, problem: str) -> None:
    assert problem in _error(tmp_path, server)


def test_loopback_opt_out(tmp_path: Path) -> None:
    for listen in ("127.0.0.1:9187", "[::1]:9187", "localhost:9187"):
        config = _load(tmp_path, f'listen = "{listen}"\nallow_unauthenticated = true\n')
        assert config.server is not None and config.server.web_enabled
        assert config.server.token is None


def test_without_token_or_opt_out_the_console_is_off(tmp_path: Path) -> None:
    config = _load(tmp_path, 'listen = "0.0.0.0:9187"\n')
    assert config.server is not None and not config.server.web_enabled


def test_unresolved_token_is_not_readable(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[server]\ntoken_env = "WEB_TOKEN"\n')
    config = load_config(path, env={}, resolve_secrets=False)
    assert config.server is not None
    with pytest.raises(ConfigError):
        _ = config.server.token


def test_is_loopback() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.8.0.1", "::1", "localhost", "LOCALHOST"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.com", ""]))


def test_mode_check_names_the_mode(tmp_path: Path) -> None:
    file = tmp_path / "t"
    file.write_text(TOKEN)
    file.chmod(0o606)
    assert "mode 606" in _error(tmp_path, 'token_file = "t"\n')


def test_secret_token_makes_a_token_the_config_accepts(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from sessionhook.cli import cli

    result = CliRunner().invoke(cli, ["secret", "token"])
    assert result.exit_code == 0
    token = result.output.strip()
    assert len(token) == 43
    config = _load(tmp_path, 'token_env = "T"\n', {**ENV, "T": token})
    assert config.server is not None and config.server.token is not None
    assert config.server.token.get_secret_value() == token


def test_endpoints_test_needs_no_web_token(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[server]\ntoken_env = "UNSET_WEB_TOKEN"\n')
    config = load_config(path, env={}, need_api_key=False)
    assert config.server is not None and config.server.web_enabled
