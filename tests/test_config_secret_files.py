"""One rule for every file that holds a secret (issue 20): its group and other users get no
access, or the config is refused with one line naming the key and the file. A systemd
credential (mode 0400 plus an ACL granting the service's user read, shown as 0440) passes.
The files sessionhook writes (``secret generate|token --out``, the action-link key) are
made so: mode 0600 from their first byte, whatever the umask, never over an existing file
unless asked to.
"""

from __future__ import annotations

import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessionhook.relay.config import Config, ConfigError, load_config
from sessionhook.relay.config.secret_files import (
    ACL_XATTR,
    acl_exposure,
    exposure,
    file_exposure,
    write_secret_file,
)
from sessionhook.relay.domain.signing import generate_keypair, generate_secret
from tests.support import forked_cli

pytestmark = pytest.mark.app

TOKEN = "T" * 40
SIGNING_KEY, _PUBLIC_KEY = generate_keypair()


@dataclass(frozen=True)
class SecretFile:
    """A config whose ``key`` reads its secret from the file ``secret``."""

    key: str
    toml: str
    content: str

    def read(self, config: Config) -> str:
        if self.key == "api.api_key_file":
            return config.api.api_key.get_secret_value()
        if self.key == "accounts[0].api_key_file":
            return config.accounts[0].api_key.get_secret_value()
        if self.key == "server.token_file":
            assert config.server is not None and config.server.token is not None
            return config.server.token.get_secret_value()
        if self.key == "slack.signing_secret_file":
            assert config.slack is not None
            return config.slack.signing_secret.get_secret_value()
        return config.endpoints[0].secrets[0].get_secret_value()


_ENDPOINT = '[[endpoints]]\nname = "ci"\nurl = "https://hooks.example.com/in"\n'
CASES = [
    SecretFile("api.api_key_file", '[api]\napi_key_file = "secret"\n', "key-123"),
    SecretFile(
        "accounts[0].api_key_file",
        '[api]\napi_key_env = "K"\n[[accounts]]\nname = "b"\napi_key_file = "secret"\n',
        "key-456",
    ),
    SecretFile("endpoints[0].secret_file", _ENDPOINT + 'secret_file = "secret"\n', ""),
    SecretFile(
        "endpoints[0].secret_file",
        _ENDPOINT + 'signature = "v1a"\nsecret_file = "secret"\n',
        SIGNING_KEY,
    ),
    SecretFile(
        "server.token_file",
        '[server]\nlisten = "127.0.0.1:9187"\ntoken_file = "secret"\n',
        TOKEN,
    ),
    SecretFile(
        "slack.signing_secret_file",
        '[server]\nlisten = "127.0.0.1:9187"\n[actions]\nenabled = true\n'
        'public_url = "https://relay.example.com"\n[slack]\nsigning_secret_file = "secret"\n',
        "8f74a0",
    ),
]
IDS = ["api", "accounts", "endpoint whsec", "endpoint whsk (v1a)", "server token", "slack"]


def _write(tmp_path: Path, case: SecretFile, mode: int) -> Path:
    secret = tmp_path / "secret"
    secret.write_text((case.content or generate_secret()) + "\n")
    secret.chmod(mode)
    config = tmp_path / "config.toml"
    config.write_text(case.toml)
    return config


def _load(config: Path) -> Config:
    return load_config(config, env={"K": "key-from-env", "SESSIONHOOK_API_KEY": "k"})


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o620, 0o400 | 0o004])
def test_a_secret_file_its_group_or_others_can_access_is_refused(
    tmp_path: Path, case: SecretFile, mode: int
) -> None:
    config = _write(tmp_path, case, mode)
    with pytest.raises(ConfigError) as info:
        _load(config)
    message = str(info.value)
    secret = tmp_path.resolve() / "secret"
    assert message.startswith(f"config error: {case.key}: {secret} holds a secret but ")
    assert f"(mode {mode:o})" in message and f"chmod 600 {secret}" in message
    assert "\n" not in message
    assert case.content not in message or not case.content


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_secret_file_is_read(tmp_path: Path, case: SecretFile, mode: int) -> None:
    config = _write(tmp_path, case, mode)
    expected = (tmp_path / "secret").read_text().strip()
    assert case.read(_load(config)) == expected


# --------------------------------------------------------------------------- ACLs


def _acl(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


NO_ID = 0xFFFFFFFF
#: What systemd gives a credential: 0400 root-owned, read for the service's user (uid
#: 61234 here), the mask r-- (so the group bits read 4), nothing for the group or others.
SYSTEMD_CREDENTIAL = _acl((0x01, 4, NO_ID), (0x02, 4, 61234), (0x04, 0, NO_ID),
                          (0x10, 4, NO_ID), (0x20, 0, NO_ID))  # fmt: skip
GROUP_READS = _acl((0x01, 6, NO_ID), (0x04, 4, NO_ID), (0x10, 4, NO_ID), (0x20, 0, NO_ID))
NAMED_GROUP_READS = _acl((0x01, 6, NO_ID), (0x04, 0, NO_ID), (0x08, 4, 100), (0x10, 4, NO_ID),
                         (0x20, 0, NO_ID))  # fmt: skip
MASKED_GROUP = _acl((0x01, 6, NO_ID), (0x04, 4, NO_ID), (0x10, 0, NO_ID), (0x20, 0, NO_ID))


def test_acl_rules() -> None:
    assert acl_exposure(0o100440, SYSTEMD_CREDENTIAL) is None
    assert acl_exposure(0o100600, MASKED_GROUP) is None  # the mask takes the group's read away
    assert acl_exposure(0o100640, GROUP_READS) == "its ACL lets a group access it (mode 640)"
    assert acl_exposure(0o100640, NAMED_GROUP_READS) == "its ACL lets a group access it (mode 640)"
    assert acl_exposure(0o100440, b"\x02\x00\x00\x00\x01") is not None  # cut short
    assert exposure(0o100600) is None and exposure(0o100400) is None
    assert exposure(0o100644) == "its group and other users can access it (mode 644)"
    assert exposure(0o100604) == "other users can access it (mode 604)"


def _with_acl(path: Path, acl: bytes) -> None:
    try:
        os.setxattr(path, ACL_XATTR, acl)
    except OSError as exc:  # a file system without ACLs, or not allowed here
        pytest.skip(f"cannot set an ACL here: {exc}")


def test_a_systemd_credential_is_accepted(tmp_path: Path) -> None:
    case = CASES[0]
    config = _write(tmp_path, case, 0o400)
    secret = tmp_path / "secret"
    _with_acl(secret, SYSTEMD_CREDENTIAL)
    assert secret.stat().st_mode & 0o777 == 0o440  # what `ls -l` shows: r--r-----+
    assert file_exposure(secret) is None
    assert case.read(_load(config)) == "key-123"


def test_an_acl_granting_a_group_is_refused(tmp_path: Path) -> None:
    case = CASES[2]
    config = _write(tmp_path, case, 0o600)
    _with_acl(tmp_path / "secret", NAMED_GROUP_READS)
    with pytest.raises(ConfigError, match=r"its ACL lets a group access it \(mode 640\)"):
        _load(config)


# --------------------------------------------------------------------------- the daemon


@pytest.mark.process  # the sessionhook command in a subprocess
def test_run_refuses_a_world_readable_signing_key_with_one_line(tmp_path: Path) -> None:
    # The case: a whsk_ ed25519 key at 0644 was used without a word.
    config = _write(tmp_path, CASES[3], 0o644)
    env = {**os.environ, "SESSIONHOOK_API_KEY": "k"}
    done = forked_cli.run("run", "--once", "--config", str(config), env=env, timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("config error: endpoints[0].secret_file: ")
    assert str(tmp_path.resolve() / "secret") in line and "mode 644" in line
    assert SIGNING_KEY not in done.stderr


# --------------------------------------------------------------------------- writing one


def _sessionhook(cwd: Path, command: str, umask: str = "022") -> subprocess.CompletedProcess[str]:
    """``sessionhook COMMAND`` with the umask ``umask`` (022: most users'), forked from a
    warm interpreter (tests/support/forked_cli.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    return forked_cli.run(*command.split(), env=env, cwd=cwd, timeout=60, umask=int(umask, 8))


@pytest.mark.process  # the sessionhook command in a subprocess
@pytest.mark.parametrize("umask", ["000", "022", "077"])
@pytest.mark.parametrize(
    ("command", "key"),
    [
        ("secret generate --out s", "endpoints[0].secret_file"),
        ("secret generate --asymmetric --out s", "endpoints[0].secret_file"),
        ("secret token --out s", "server.token_file"),
    ],
)
def test_secret_out_writes_a_file_of_mode_600_the_config_reads(
    tmp_path: Path, umask: str, command: str, key: str
) -> None:
    done = _sessionhook(tmp_path, command, umask)
    assert done.returncode == 0, done.stderr
    secret = tmp_path / "s"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert done.stdout == ""  # the secret is in the file only
    assert done.stderr.splitlines()[0].endswith("written to s (mode 600)")
    assert secret.read_text().strip() not in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no temporary file left
    [case] = [c for c in CASES if c.key == key and ("v1a" in c.toml) == ("asym" in command)]
    config = tmp_path / "config.toml"
    config.write_text(case.toml.replace('"secret"', '"s"'))
    assert case.read(_load(config)) == secret.read_text().strip()


@pytest.mark.process  # the sessionhook command in a subprocess
@pytest.mark.parametrize("command", ["secret generate", "secret token"])
def test_secret_out_never_replaces_a_file_unless_forced(tmp_path: Path, command: str) -> None:
    secret = tmp_path / "s"
    secret.write_text("the old secret\n")
    secret.chmod(0o644)
    refused = _sessionhook(tmp_path, f"{command} --out s")
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        "error: s exists: not replaced — --force replaces it (its secret is lost)"
    ]
    assert secret.read_text() == "the old secret\n"
    # A link is not followed either: the file it points at keeps its text.
    (tmp_path / "link").symlink_to(secret)
    assert _sessionhook(tmp_path, f"{command} --out link").returncode == 1
    assert secret.read_text() == "the old secret\n"
    forced = _sessionhook(tmp_path, f"{command} --out s --force")
    assert forced.returncode == 0, forced.stderr
    assert secret.read_text() != "the old secret\n"
    assert secret.stat().st_mode & 0o777 == 0o600  # the old file's mode is not kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "s"]


@pytest.mark.process  # the sessionhook command in a subprocess
def test_secret_out_failures_are_one_line(tmp_path: Path) -> None:
    missing = _sessionhook(tmp_path, "secret generate --out no/such/dir/s")
    assert missing.returncode == 1
    assert missing.stderr.splitlines() == [
        "error: cannot write no/such/dir/s: No such file or directory"
    ]
    usage = _sessionhook(tmp_path, "secret token --force")
    assert usage.returncode == 2 and "--force goes with --out" in usage.stderr
    assert usage.stdout == "" and list(tmp_path.iterdir()) == []


def test_write_secret_file_is_whole_or_absent(tmp_path: Path) -> None:
    file = tmp_path / "s"
    write_secret_file(file, "one\n")
    with pytest.raises(FileExistsError):
        write_secret_file(file, "two\n")
    assert file.read_text() == "one\n"
    write_secret_file(file, "three\n", replace=True)
    assert file.read_text() == "three\n" and file.stat().st_mode & 0o777 == 0o600
    with pytest.raises(OSError):
        write_secret_file(tmp_path / "missing" / "s", "x")
    assert [p.name for p in tmp_path.iterdir()] == ["s"]
