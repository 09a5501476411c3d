"""``listen --forward-to``'s state file, hostile: what the forwarder refuses at start (bad
JSON, a file others can read, another pair's, a link, a huge file, a bad secret) in one line
with exit status 2, the file left as it was; where the file goes by default; and the
usage errors of the options around it. Run with click's CliRunner: every refusal comes
before any connection (the relay's address is a closed port)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sessionhook.cli import cli
from sessionhook.cli.listen_state import (
    ListenState,
    StateFileError,
    default_state_path,
    read_state,
    write_state,
)
from sessionhook.relay.domain.signing import generate_secret

pytestmark = pytest.mark.app

URL = "http://127.0.0.1:9"
TARGET = "http://127.0.0.1:9/hook"
TOKEN = "listen-state-token-0123456789abcdef"


def listen(*args: str) -> Result:
    env = {"SESSIONHOOK_WEB_TOKEN": TOKEN}
    return CliRunner().invoke(cli, ["listen", *args], env=env)


def forward(state: Path, *extra: str) -> Result:
    return listen("--url", URL, "--forward-to", TARGET, "--state-file", str(state), *extra)


def refused(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def a_state(path: Path, **changes: object) -> bytes:
    record = {
        "version": 1,
        "url": URL,
        "forward_to": TARGET,
        "secret": generate_secret(),
        "last_event_id": "evt_1",
        **changes,
    }
    path.write_text(json.dumps(record))
    path.chmod(0o600)
    return path.read_bytes()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a listen state file"),
        (b'{"version": 2}', "not a listen state file"),
        (b"\xff\xfe garbage", "not UTF-8"),
        (b"", "is empty"),
    ],
)
def test_a_file_that_is_no_state_is_refused_and_kept(
    tmp_path: Path, content: bytes, says: str
) -> None:
    state = tmp_path / "state.json"
    state.write_bytes(content)
    state.chmod(0o600)
    line = refused(forward(state))
    assert says in line and str(state) in line
    assert state.read_bytes() == content


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"url": "http://elsewhere:1"}, "it belongs to --url http://elsewhere:1"),
        ({"forward_to": "http://127.0.0.1:9/other"}, "it belongs to"),
        ({"secret": "whsec_!!"}, "its secret"),
        ({"secret": None}, "no signing secret"),
        ({"last_event_id": "e" * 5000}, "not a listen state file"),
        ({"last_event_id": 7}, "not a listen state file"),
    ],
)
def test_a_state_of_another_pair_or_with_bad_members_is_refused(
    tmp_path: Path, changes: dict[str, object], says: str
) -> None:
    state = tmp_path / "state.json"
    before = a_state(state, **changes)
    assert says in refused(forward(state))
    assert state.read_bytes() == before


def test_a_state_file_others_can_read_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    before = a_state(state)
    state.chmod(0o644)
    line = refused(forward(state))
    assert "can access it" in line and "chmod 600" in line
    assert state.read_bytes() == before


def test_a_link_a_folder_and_a_huge_file_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    a_state(real)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert "not a regular file" in refused(forward(link))
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (70 * 1024))
    huge.chmod(0o600)
    assert "not a state file" in refused(forward(huge))


def test_the_state_round_trips_and_goes_under_xdg_state_home(tmp_path: Path) -> None:
    path = default_state_path(URL, TARGET, {"XDG_STATE_HOME": str(tmp_path)})
    assert path.parent == tmp_path / "sessionhook" / "listen"
    assert default_state_path(URL, TARGET + "x", {"XDG_STATE_HOME": str(tmp_path)}) != path
    # A relative XDG_STATE_HOME is ignored, as the XDG rules say.
    home = default_state_path(URL, TARGET, {"XDG_STATE_HOME": "relative"})
    assert str(home).startswith(str(Path.home() / ".local" / "state"))
    state = ListenState(URL, TARGET, generate_secret(), "evt_42")
    write_state(path, state)
    assert path.stat().st_mode & 0o777 == 0o600
    assert os.stat(path.parent).st_mode & 0o777 == 0o700
    assert read_state(path, url=URL, target=TARGET) == state
    assert read_state(tmp_path / "none.json", url=URL, target=TARGET) is None
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StateFileError, match="cannot write"):
        write_state(tmp_path / "a-file" / "state.json", state)  # no folder can be made there


def test_options_around_the_state(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    mixed = forward(state, "--new-secret", "--secret", generate_secret())
    assert mixed.exit_code == 2 and "--new-secret" in mixed.stderr
    for option in (["--state-file", str(state)], ["--new-secret"]):
        alone = listen("--secret", generate_secret(), *option)
        assert alone.exit_code == 2 and "goes with --url" in alone.stderr
    assert not state.exists()
    for option in (["--respond", "500"], ["--retry-after", "3"]):
        sending = forward(state, *option)
        assert sending.exit_code == 2 and "is for receiving" in sending.stderr
    lone = listen("--secret", generate_secret(), "--retry-after", "3")
    assert lone.exit_code == 2 and "--retry-after goes with --respond" in lone.stderr
    for status in ("99", "600", "x"):
        bad = listen("--secret", generate_secret(), "--respond", status)
        assert bad.exit_code == 2 and "--respond" in bad.stderr
