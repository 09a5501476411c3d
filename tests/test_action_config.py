"""``[actions]`` (relay/config/actions.py) and its key file (relay/config/action_keys.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from sessionhook.relay.config import ConfigError, load_config
from sessionhook.relay.config.action_keys import ActionKeys, rotate_key_file
from tests.support.relay_process import clean_env, sessionhook

pytestmark = pytest.mark.app

ENV = {"SESSIONHOOK_API_KEY": "key-123"}
SERVER = '[server]\nlisten = "127.0.0.1:9187"\nallow_unauthenticated = true\n'


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, env=ENV if env is None else env)


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    message = str(info.value)
    assert "\n" not in message
    return message.removeprefix("config error: ")


def test_defaults_are_off_and_the_key_sits_next_to_the_store(tmp_path: Path) -> None:
    config = load(tmp_path, '[store]\npath = "data/relay.db"\n')
    actions = config.actions
    assert not actions.enabled and not actions.require_login
    assert actions.link_ttl == 86400
    assert actions.key_file == tmp_path / "data" / "action-links.key"


def test_enabled_with_an_https_public_url(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        SERVER + '[actions]\nenabled = true\npublic_url = "https://relay.example/hooks/"\n'
        'link_ttl = "2h"\nkey_file = "keys/links.key"\nrequire_login = true\n',
    )
    assert config.actions.public_url == "https://relay.example/hooks"
    assert config.actions.link_ttl == 7200
    assert config.actions.key_file == tmp_path / "keys" / "links.key"
    loopback = load(
        tmp_path, SERVER + '[actions]\nenabled = true\npublic_url = "http://127.0.0.1:9187"\n'
    )
    assert loopback.actions.public_url == "http://127.0.0.1:9187"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SERVER + "[actions]\nenabled = true\n", "public_url is required"),
        (SERVER + '[actions]\npublic_url = "http://relay.example"\n', "must be https"),
        (SERVER + '[actions]\npublic_url = "ftp://relay.example"\n', "must be an https URL"),
        (SERVER + '[actions]\npublic_url = "https://relay.example/?a=1"\n', "plain base URL"),
        (SERVER + "[actions]\nlink_ttl = 0\n", "actions.link_ttl"),
        (SERVER + '[actions]\nlink_ttl = "31d"\n', "actions.link_ttl"),
        (SERVER + '[actions]\nenabled = "yes"\n', "actions.enabled"),
        (SERVER + "[actions]\nkey_file = 3\n", "actions.key_file"),
        (SERVER + "[actions]\nunknown = 1\n", "actions.unknown"),
        ('[actions]\nenabled = true\npublic_url = "https://r.example"\n', "add [server]"),
        ("[server]\n[actions]\nrequire_login = true\n", "needs the console's login"),
    ],
)
def test_bad_actions_are_one_line_errors(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(tmp_path, text)


def test_the_key_is_made_once_private_and_read_again_after_a_rotation(tmp_path: Path) -> None:
    file = tmp_path / "state" / "action-links.key"
    now = [1_000_000.0]
    keys = ActionKeys(file)
    first = keys.ring().current
    assert len(first) == 32
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert ActionKeys(file).ring().current == first  # not made again
    rotate_key_file(file, overlap=3600, now=now[0])
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    second = keys.ring().current
    assert second != first
    assert keys.ring().all(now[0]) == (second, first)
    now[0] += 3601
    assert keys.ring().all(now[0]) == (second,)
    # a rotation without overlap revokes every link signed before it
    rotate_key_file(file, overlap=0, now=now[0])
    assert keys.ring().all(now[0]) == (keys.ring().current,)
    assert len(file.read_text().splitlines()) == 1


def test_an_exposed_or_broken_key_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "action-links.key"
    keys = ActionKeys(file)
    keys.ring()
    os.chmod(file, 0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        ActionKeys(file).ring()
    os.chmod(file, 0o600)
    for text, expected in [
        ("", "is empty"),
        ("!!! -\n", "not a base64url key"),
        ("AAAA -\n", "16 bytes or more"),
        ("A" * 43 + " 12\n", "the first key is the current one"),
        ("A" * 43 + " -\n" + "B" * 43 + " soon\n", "Unix seconds"),
    ]:
        file.write_text(text)
        with pytest.raises(ConfigError, match=expected):
            ActionKeys(file).ring()
    # Read as every secret file is (config/secret_files.py), then as a key file.
    for raw, expected in ((b"\xff\xfe", "not UTF-8 text"), ("é -\n".encode(), "not ASCII")):
        file.write_bytes(raw)
        with pytest.raises(ConfigError, match=expected):
            ActionKeys(file).ring()


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return sessionhook(*args, env=clean_env(SESSIONHOOK_API_KEY="key-123"), cwd=cwd)


@pytest.mark.process  # the sessionhook command in a subprocess
def test_rotate_key_keeps_the_old_key_for_the_links_lifetime_or_not_at_all(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(SERVER + '[actions]\nlink_ttl = "1h"\n')
    file = tmp_path / "action-links.key"
    first = ActionKeys(file).ring().current
    done = _run("actions", "rotate-key", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "keep working until they expire" in done.stdout
    keys = ActionKeys(file)
    assert keys.ring().all(time.time())[1:] == (first,) and keys.ring().current != first
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    revoked = _run("actions", "rotate-key", "--no-overlap", "--config", str(config), cwd=tmp_path)
    assert revoked.returncode == 0 and "no longer work" in revoked.stdout
    assert len(ActionKeys(file).ring().all(time.time())) == 1
    os.chmod(file, 0o644)
    exposed = _run("actions", "rotate-key", "--config", str(config), cwd=tmp_path)
    assert exposed.returncode == 2
    assert exposed.stderr.count("\n") == 1 and "chmod 600" in exposed.stderr


@pytest.mark.process  # the sessionhook command in a subprocess
def test_the_daemon_refuses_an_exposed_key_file_at_start(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        '[api]\nbase_url = "http://127.0.0.1:9"\n'
        '[server]\nlisten = "127.0.0.1:1"\nallow_unauthenticated = true\n'
        '[actions]\nenabled = true\npublic_url = "http://127.0.0.1:9187"\n'
    )
    file = tmp_path / "action-links.key"
    file.write_text("A" * 43 + " -\n")
    os.chmod(file, 0o604)
    run = _run("run", "--once", "--config", str(config), cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert "actions.key_file" in run.stderr and "chmod 600" in run.stderr
    assert "Traceback" not in run.stderr
    os.chmod(file, 0o600)
    # With a private key file the start goes on (and fails later, at the unreachable API).
    again = _run("run", "--once", "--config", str(config), cwd=tmp_path)
    assert "actions.key_file" not in again.stderr
