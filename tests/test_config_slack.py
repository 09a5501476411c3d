"""``[slack]`` (issue 23 item 4): the signing secret from exactly one source, the
``response_url`` hosts as bare lower-case names; every problem one line naming the key.
(A signing secret file readable by others is refused with the other secret files:
test_config_secret_files.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionhook.relay.config import Config, ConfigError, load_config

pytestmark = pytest.mark.unit

#: What [slack] needs beside it: the action links its buttons act through.
ACTIONS = (
    '[server]\nlisten = "127.0.0.1:9187"\n'
    '[actions]\nenabled = true\npublic_url = "https://relay.example.com"\n'
)


def load(tmp_path: Path, section: str, env: dict[str, str], *, actions: str = ACTIONS) -> Config:
    config = tmp_path / "config.toml"
    config.write_text(actions + "[slack]\n" + section)
    return load_config(config, env={"SESSIONHOOK_API_KEY": "k", **env})


def refusal(tmp_path: Path, section: str, env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, section, env)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_no_slack_section_means_off(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("")
    assert load_config(config, env={"SESSIONHOOK_API_KEY": "k"}).slack is None


def test_the_secret_from_the_environment_and_slacks_host_by_default(tmp_path: Path) -> None:
    config = load(tmp_path, 'signing_secret_env = "S"\n', {"S": " 8f74a0b1 \n"})
    assert config.slack is not None
    assert config.slack.signing_secret.get_secret_value() == "8f74a0b1"
    assert config.slack.response_url_hosts == ("hooks.slack.com",)


@pytest.mark.parametrize(
    ("section", "env", "words"),
    [
        ("", {}, "slack: set exactly one of signing_secret_file or signing_secret_env"),
        (
            'signing_secret_env = "S"\nsigning_secret_file = "f"\n',
            {"S": "x"},
            "slack: set exactly one",
        ),
        ('signing_secret_env = "S"\n', {}, "slack.signing_secret_env: environment variable S"),
        ('signing_secret_env = "S"\n', {"S": "two words"}, "slack.signing_secret_env: a signing"),
        ('signing_secret_env = ""\n', {}, "slack.signing_secret_env"),
        ('signing_secret_env = "S"\nresponse_url_hosts = []\n', {"S": "x"}, "at least one host"),
        (
            'signing_secret_env = "S"\nresponse_url_hosts = ["https://hooks.slack.com"]\n',
            {"S": "x"},
            "slack.response_url_hosts: 'https://hooks.slack.com' is not a host name",
        ),
        (
            'signing_secret_env = "S"\nresponse_url_hosts = ["hooks.slack.com:443"]\n',
            {"S": "x"},
            "is not a host name",
        ),
        (
            'signing_secret_env = "S"\nresponse_url_hosts = ["Hooks.Slack.com"]\n',
            {"S": "x"},
            "in lower case",
        ),
        (
            'signing_secret_env = "S"\nresponse_url_hosts = "hooks.slack.com"\n',
            {"S": "x"},
            "slack.response_url_hosts",
        ),
        (
            'signing_secret_env = "S"\nsigning_secret = "x"\n',
            {"S": "x"},
            "slack.signing_secret: unknown key",
        ),
    ],
)
def test_a_bad_slack_section_is_one_line_naming_the_key(
    tmp_path: Path, section: str, env: dict[str, str], words: str
) -> None:
    assert words in refusal(tmp_path, section, env)


def test_slack_without_action_links_is_refused(tmp_path: Path) -> None:
    for actions in ("", '[server]\nlisten = "127.0.0.1:9187"\n[actions]\nenabled = false\n'):
        with pytest.raises(ConfigError) as info:
            load(tmp_path, 'signing_secret_env = "S"\n', {"S": "x"}, actions=actions)
        assert str(info.value) == (
            "config error: slack: a Slack app's buttons act through the action links:"
            " enable [actions]"
        )


def test_loopback_hosts_and_ip_literals_may_be_listed(tmp_path: Path) -> None:
    section = (
        'signing_secret_env = "S"\nresponse_url_hosts = ["127.0.0.1", "::1", "hooks.slack.com"]\n'
    )
    config = load(tmp_path, section, {"S": "x"})
    assert config.slack is not None
    assert config.slack.response_url_hosts == ("127.0.0.1", "::1", "hooks.slack.com")


def test_an_unresolved_secret_is_a_config_error_when_touched(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(ACTIONS + '[slack]\nsigning_secret_env = "S"\n')
    loaded = load_config(config, env={}, resolve_secrets=False)
    assert loaded.slack is not None
    with pytest.raises(ConfigError, match=r"slack\.signing_secret: the signing secret was not"):
        _ = loaded.slack.signing_secret
