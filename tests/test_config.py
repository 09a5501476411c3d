"""Config loading: defaults, validation as one-line errors naming the key, secrets, paths."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest

from sessionhook.relay.config import AccountConfig, Config, ConfigError, load_config, parse_duration

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
SECRET2 = "whsec_" + base64.b64encode(b"n" * 24).decode()
ENV = {"SESSIONHOOK_API_KEY": "key-123"}

ENDPOINT = f"""
[[endpoints]]
name = "ci-bot"
url = "https://hooks.example.com/sessions"
secret = "{SECRET}"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def error_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env=ENV if env is None else env)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("config error: ")
    assert "pydantic" not in message
    return message.removeprefix("config error: ")


def test_empty_file_gives_every_default(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), env=ENV)
    assert config.api.base_url == "http://127.0.0.1:8080"
    assert config.api.api_key_env == "SESSIONHOOK_API_KEY"
    assert config.api.api_key.get_secret_value() == "key-123"
    assert config.api.api_key_header == "x-vendor-api-key"
    assert config.api.requests_per_minute == 600
    assert config.store.path == tmp_path.resolve() / "sessionhook.db"
    assert (config.poll.active_interval, config.poll.idle_interval) == (2.0, 30.0)
    assert (config.poll.discovery_interval, config.poll.backfill) == (10.0, False)
    assert config.delivery.retry_delays == (5, 300, 1800, 7200, 18000, 36000, 36000)
    assert config.delivery.timeout == 15.0
    assert config.delivery.allow_private_networks is False
    assert config.delivery.max_media_bytes == 262144
    assert config.delivery.response_body_limit == 4096
    assert config.delivery.concurrency == 16
    assert config.endpoints == ()
    assert config.server is None
    assert (config.log.level, config.log.format) == ("info", "auto")


def test_endpoint_defaults_and_lookup(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ENDPOINT), env=ENV)
    endpoint = config.endpoint_by_name("ci-bot")
    assert endpoint is not None
    assert endpoint.events == ("*",)
    assert endpoint.disable_after == 5 * 86400
    assert endpoint.enabled is True
    assert [s.get_secret_value() for s in endpoint.secrets] == [SECRET]
    assert config.endpoint_by_name("nope") is None


def test_secrets_never_print(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ENDPOINT), env=ENV)
    for text in (repr(config), str(config), config.model_dump_json()):
        assert SECRET not in text
        assert "key-123" not in text


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), env=ENV)
    with pytest.raises(ValueError, match="frozen"):
        config.poll.active_interval = 5  # type: ignore[misc]


def test_server_section(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[server]\n"), env=ENV)
    assert config.server is not None
    assert (config.server.host, config.server.port) == ("127.0.0.1", 9187)
    config = load_config(write(tmp_path, '[server]\nlisten = "[::1]:8000"\n'), env=ENV)
    assert config.server is not None
    assert (config.server.host, config.server.port) == ("::1", 8000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[poll]\nactive_interval = 0\n", "poll.active_interval: must be > 0"),
        ("[poll]\nactive_interval = 'fast'\n", "poll.active_interval: must be a duration such"),
        ("[poll]\nbackfil = true\n", "poll.backfil: unknown key"),
        ("[polling]\n", "polling: unknown key"),
        ("[delivery]\nretry_delays = []\n", "delivery.retry_delays: must not be empty"),
        ("[delivery]\nretry_delays = [5, -1]\n", "delivery.retry_delays[1]: must be >= 0"),
        ("[delivery]\nconcurrency = 0\n", "delivery.concurrency: must be >= 1"),
        ("[delivery]\ntimeout = -2\n", "delivery.timeout: must be > 0"),
        ("[delivery]\nmax_media_bytes = 1.5\n", "delivery.max_media_bytes: must be an integer"),
        ("[api]\nrequests_per_minute = 0\n", "api.requests_per_minute: must be > 0"),
        ("[api]\nbase_url = 'ftp://x'\n", "api.base_url: must be an http(s) URL"),
        (
            "[api]\nbase_url = 'http://h/v1alpha'\n",
            "api.base_url: must not end with /v1alpha (the client appends it)",
        ),
        ("[api]\napi_key_env = ''\n", "api: set api_key_env or api_key_file"),
        (
            "[api]\napi_key_env = 'K'\napi_key_file = '/k'\n",
            "api: set only one of api_key_env or api_key_file",
        ),
        ("[log]\nformat = 'xml'\n", "log.format: must be one of 'auto', 'json' or 'console'"),
        ("[server]\nlisten = '9187'\n", 'server.listen: must be "host:port", for example'),
        ("api = 3\n", "api: must be a table"),
        ("endpoints = {}\n", "endpoints: must be a list"),
    ],
)
def test_validation_errors_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    assert error_of(tmp_path, text).startswith(expected)


def test_log_level_is_case_insensitive(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "[log]\nlevel = 'DEBUG'\n"), env=ENV).log.level == "debug"


def endpoints_toml(*bodies: str) -> str:
    return "".join(f"[[endpoints]]\n{body}\n" for body in bodies)


GOOD = f'name = "a"\nurl = "https://a.example"\nsecret = "{SECRET}"'


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        (
            f'name = "b"\nurl = "mailto:x@y"\nsecret = "{SECRET}"',
            "endpoints[1].url: must be an http(s) URL",
        ),
        (f'url = "https://b.example"\nsecret = "{SECRET}"', "endpoints[1].name: is required"),
        (
            f'name = "b c"\nurl = "https://b.example"\nsecret = "{SECRET}"',
            "endpoints[1].name: must be made of letters",
        ),
        (f'name = "a"\nurl = "https://b.example"\nsecret = "{SECRET}"', "endpoints[1].name: dup"),
        (
            'name = "b"\nurl = "https://b.example"',
            "endpoints[1]: set exactly one of secret, secret_env or secret_file",
        ),
        (
            f'name = "b"\nurl = "https://b.example"\nsecret = "{SECRET}"\nsecret_env = "X"',
            "endpoints[1]: set exactly one of secret, secret_env or secret_file",
        ),
        (
            'name = "b"\nurl = "https://b.example"\nsecret = "whsec_***"',
            "endpoints[1].secret: secret is not base64",
        ),
        (
            'name = "b"\nurl = "https://b.example"\nsecret = "c2VjcmV0"',
            "endpoints[1].secret: each secret must start with whsec_",
        ),
        (
            f'name = "b"\nurl = "https://b.example"\nsecret = "{SECRET}"\nevents = []',
            "endpoints[1].events: must not be empty",
        ),
        (
            f'name = "b"\nurl = "https://b.example"\nsecret = "{SECRET}"\nevents = [""]',
            "endpoints[1].events[0]: must not be empty",
        ),
        (
            f'name = "b"\nurl = "https://b.example"\nsecret = "{SECRET}"\nevents = ["activty.*"]',
            "endpoints[1].events: 'activty.*' matches no event type",
        ),
        (
            f'name = "b"\nurl = "https://b.example"\nsecret = "{SECRET}"\ndisable_after = "5w"',
            'endpoints[1].disable_after: must be a duration such as "90s"',
        ),
        (
            f'name = "b"\nurl = "https://b.example"\nsecret = "{SECRET}"\ndisable_after = 0',
            "endpoints[1].disable_after: must be > 0",
        ),
        (
            f'name = "b"\nurl = "https://b.example"\nsecret = "{SECRET}"\ncolour = "red"',
            "endpoints[1].colour: unknown key",
        ),
    ],
)
def test_endpoint_errors_name_index_and_key(tmp_path: Path, second: str, expected: str) -> None:
    assert error_of(tmp_path, endpoints_toml(GOOD, second)).startswith(expected)


def test_secret_from_env_with_rotation(tmp_path: Path) -> None:
    text = endpoints_toml('name = "a"\nurl = "https://a.example"\nsecret_env = "CI_BOT_SECRET"')
    config = load_config(write(tmp_path, text), env={**ENV, "CI_BOT_SECRET": f"{SECRET} {SECRET2}"})
    assert [s.get_secret_value() for s in config.endpoints[0].secrets] == [SECRET, SECRET2]


def test_secret_env_missing(tmp_path: Path) -> None:
    text = endpoints_toml('name = "a"\nurl = "https://a.example"\nsecret_env = "CI_BOT_SECRET"')
    assert error_of(tmp_path, text) == (
        "endpoints[0].secret_env: environment variable CI_BOT_SECRET is not set"
    )
    bad = error_of(tmp_path, text, env={**ENV, "CI_BOT_SECRET": "whsec_%%"})
    assert bad.startswith("endpoints[0].secret_env: not a valid secret")
    assert "%%" not in bad


def test_only_the_named_endpoints_secrets_are_read(tmp_path: Path) -> None:
    text = endpoints_toml(
        'name = "a"\nurl = "https://a.example"\nsecret_env = "A_SECRET"',
        'name = "b"\nurl = "https://b.example"\nsecret_env = "B_SECRET_UNSET"',
        'name = "c"\nurl = "https://c.example"\nsecret_file = "no-such-file"',
    )
    path = write(tmp_path, text)
    config = load_config(path, env={"A_SECRET": SECRET}, need_api_key=False, endpoint_secrets={"a"})
    assert config.endpoints[0].secrets[0].get_secret_value() == SECRET
    with pytest.raises(ConfigError, match="secrets were not resolved"):
        _ = config.endpoints[1].secrets
    # A name that no configured endpoint has (one created at run time): no secret read.
    assert load_config(path, env={}, need_api_key=False, endpoint_secrets={"slack-bot"})
    with pytest.raises(ConfigError, match="B_SECRET_UNSET is not set"):
        load_config(path, env={}, need_api_key=False, endpoint_secrets={"b"})


def test_secret_and_api_key_from_files_with_credentials_directory(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api-key").write_text("file-key\n")
    (creds / "ci").write_text(SECRET + "\n")
    for secret in creds.iterdir():
        secret.chmod(0o400)  # as systemd makes credentials; others may not read them
    text = '[api]\napi_key_file = "${CREDENTIALS_DIRECTORY}/api-key"\n' + endpoints_toml(
        'name = "a"\nurl = "https://a.example"\nsecret_file = "creds/ci"'
    )
    config = load_config(write(tmp_path, text), env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert config.api.api_key.get_secret_value() == "file-key"
    assert config.endpoints[0].secrets[0].get_secret_value() == SECRET


def test_file_errors(tmp_path: Path) -> None:
    text = '[api]\napi_key_file = "$CREDENTIALS_DIRECTORY/api-key"\n'
    assert error_of(tmp_path, text, env={}) == (
        "api.api_key_file: environment variable CREDENTIALS_DIRECTORY (used in the path) is not set"
    )
    missing = error_of(tmp_path, text, env={"CREDENTIALS_DIRECTORY": str(tmp_path / "none")})
    assert missing.startswith("api.api_key_file: cannot read")
    (tmp_path / "empty").write_text("  \n")
    (tmp_path / "empty").chmod(0o600)
    empty = error_of(tmp_path, '[api]\napi_key_file = "empty"\n', env={})
    assert empty == f"api.api_key_file: {tmp_path.resolve() / 'empty'} is empty"


def test_api_key_env_missing(tmp_path: Path) -> None:
    assert error_of(tmp_path, "", env={}) == (
        "api.api_key_env: environment variable SESSIONHOOK_API_KEY is not set"
    )


def test_unresolved_secrets_for_read_only_commands(tmp_path: Path) -> None:
    text = endpoints_toml('name = "a"\nurl = "https://a.example"\nsecret_env = "NOT_SET"')
    config = load_config(write(tmp_path, text), env={}, resolve_secrets=False)
    assert config.endpoints[0].name == "a"
    with pytest.raises(ConfigError, match="not resolved"):
        config.api.api_key  # noqa: B018
    with pytest.raises(ConfigError, match="not resolved"):
        config.endpoints[0].secrets  # noqa: B018


def test_store_path_rules(tmp_path: Path) -> None:
    rel = load_config(write(tmp_path, '[store]\npath = "data/x.db"\n'), env=ENV)
    assert rel.store.path == tmp_path.resolve() / "data" / "x.db"
    state = load_config(write(tmp_path, ""), env={**ENV, "STATE_DIRECTORY": "/var/lib/s:/other"})
    assert state.store.path == Path("/var/lib/s/sessionhook.db")
    var = load_config(
        write(tmp_path, '[store]\npath = "${STATE_DIRECTORY}/y.db"\n'),
        env={**ENV, "STATE_DIRECTORY": "/srv/state"},
    )
    assert var.store.path == Path("/srv/state/y.db")
    absolute = load_config(write(tmp_path, '[store]\npath = "/tmp/z.db"\n'), env=ENV)
    assert absolute.store.path == Path("/tmp/z.db")


def test_store_url_selects_postgresql_and_never_shows_the_password(tmp_path: Path) -> None:
    url = "postgresql://relay:pw-123@db.example:5432/hooks"
    config = load_config(write(tmp_path, f'[store]\nurl = "{url}"\npool_size = 8\n'), env=ENV)
    assert config.store.database_url() == url
    assert config.store.pool_size == 8
    assert "pw-123" not in config.store.location
    assert "db.example:5432/hooks" in config.store.location
    assert "pw-123" not in repr(config.store) and "pw-123" not in str(config.model_dump())
    plain = load_config(write(tmp_path, ""), env=ENV)
    assert plain.store.database_url() is None and plain.store.location == str(plain.store.path)


def test_store_url_from_the_environment(tmp_path: Path) -> None:
    url = "postgres://relay:pw-123@db.example/hooks"
    text = '[store]\nurl_env = "RELAY_DB"\n'
    config = load_config(write(tmp_path, text), env={**ENV, "RELAY_DB": url})
    assert config.store.database_url() == url
    assert error_of(tmp_path, text) == "store.url_env: environment variable RELAY_DB is not set"
    wrong = error_of(tmp_path, text, env={**ENV, "RELAY_DB": "mysql://u:pw-123@h/db"})
    assert wrong.startswith("store.url_env: RELAY_DB: must be a")
    assert "pw-123" not in wrong


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('url = "postgresql://u:pw-123@h/db"\npath = "x.db"', "set only one of path, url"),
        ('url = "postgresql://u:pw-123@h/db"\nurl_env = "X"', "set only one of path, url"),
        ('url = "https://u:pw-123@h/db"', "must be a"),
        ('url = "postgresql://h/db?sslmode"', "is not a valid PostgreSQL URL"),
        ("pool_size = 0", "must be >= 1"),
    ],
)
def test_store_location_is_validated_strictly(tmp_path: Path, text: str, problem: str) -> None:
    message = error_of(tmp_path, f"[store]\n{text}\n")
    assert message.startswith("store")
    assert problem in message
    assert "pw-123" not in message


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, "[poll]\nactive_interval = \n")
    assert message.startswith(f"{tmp_path / 'config.toml'}: invalid TOML")
    assert "line 2" in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml", env=ENV)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("90s", 90), ("15m", 900), ("12h", 43200), ("5d", 432000), (30, 30), (1.5, 1.5)],
)
def test_parse_duration(value: str | float, seconds: float) -> None:
    assert parse_duration(value) == seconds


# "120" is refused: a string where a number belongs is never coerced (strict types).
@pytest.mark.parametrize("value", ["", "5w", "-1s", "1h30m", "120", True, None])
def test_parse_duration_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


def test_duration_strings_in_toml(tmp_path: Path) -> None:
    text = endpoints_toml(GOOD + '\ndisable_after = "12h"')
    assert load_config(write(tmp_path, text), env=ENV).endpoints[0].disable_after == 43200


def test_config_constructed_in_code_has_defaults() -> None:
    assert Config().delivery.retry_delays[0] == 5


def test_example_config_is_valid_and_documents_every_key(tmp_path: Path) -> None:
    # As copied, with the secret files it names beside it (mode 0600).
    example = tmp_path / "config.toml"
    shutil.copyfile(REPO / "config.example.toml", example)
    files = {"ci-bot.secret": SECRET, "chat.secret": SECRET2, "web.token": "w" * 43}
    for name, secret in files.items():
        (tmp_path / name).write_text(secret + "\n")
        (tmp_path / name).chmod(0o600)
    config = load_config(example, env={"SESSIONHOOK_API_KEY": "k"})
    assert [e.secrets[0].get_secret_value() for e in config.endpoints] == [SECRET, SECRET2]
    assert config.server is not None and config.server.token is not None
    text = example.read_text()
    for section, model in (
        ("api", config.api),
        ("store", config.store),
        ("poll", config.poll),
        ("delivery", config.delivery),
        ("server", config.server),
        ("log", config.log),
        ("endpoints", config.endpoints[0]),
    ):
        assert model is not None
        for key in type(model).model_fields:
            assert f"{key} =" in text, f"{section}.{key} is not documented in the example"
    assert "# [[accounts]]" in text
    for key in AccountConfig.model_fields:
        assert f"# {key} =" in text, f"accounts.{key} is not documented in the example"


def test_accounts_each_bring_their_key_and_fall_back_on_api(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[api]\nrequests_per_minute = 100\nbase_url = "http://127.0.0.1:9"\n'
        '[[accounts]]\nname = "a"\napi_key_env = "KEY_A"\n'
        '[[accounts]]\nname = "b"\napi_key_env = "KEY_B"\nbase_url = "http://127.0.0.1:8/"\n'
        "requests_per_minute = 7\n"
        f'[[endpoints]]\nname = "x"\nurl = "https://h.example.com"\nsecret = "{SECRET}"\n'
        'accounts = ["b"]\n',
    )
    # [api]'s own key is not needed with [[accounts]].
    config = load_config(path, env={"KEY_A": "ka", "KEY_B": "kb"})
    a, b = config.upstream_accounts()
    assert (a.name, a.base_url, a.requests_per_minute, a.api_key.get_secret_value()) == (
        "a",
        "http://127.0.0.1:9",
        100,
        "ka",
    )
    assert (b.base_url, b.requests_per_minute, b.api_key.get_secret_value()) == (
        "http://127.0.0.1:8",
        7,
        "kb",
    )
    assert config.endpoints[0].accounts == ("b",)
    with pytest.raises(ConfigError, match=r"accounts\[1\]\.api_key_env: .*KEY_B"):
        load_config(path, env={"KEY_A": "ka"})


def test_without_accounts_api_is_the_default_account(tmp_path: Path) -> None:
    path = write(tmp_path, '[api]\nbase_url = "http://127.0.0.1:9"\n')
    (account,) = load_config(path, env={"SESSIONHOOK_API_KEY": "k"}).upstream_accounts()
    assert (account.name, account.base_url, account.api_key.get_secret_value()) == (
        "default",
        "http://127.0.0.1:9",
        "k",
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            '[[accounts]]\nname = "a"\napi_key_env = "K"\n[[accounts]]\nname = "a"\n'
            'api_key_env = "K"\n',
            "accounts[1].name",
        ),
        ('[[accounts]]\nname = "a"\n', "accounts[0]"),
        ('[[accounts]]\nname = "a b"\napi_key_env = "K"\n', "accounts[0].name"),
        (
            f'[[endpoints]]\nname = "x"\nurl = "https://h.example.com"\nsecret = "{SECRET}"\n'
            'accounts = ["nobody"]\n',
            "endpoints[0].accounts",
        ),
    ],
)
def test_bad_accounts_are_config_errors(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), env={"K": "k", "SESSIONHOOK_API_KEY": "k"})
    assert caught.value.key == key, str(caught.value)
