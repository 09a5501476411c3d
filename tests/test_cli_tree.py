"""The ``sessionhook`` command tree, walked whole: every group holds the rule of
``cli/groups.py`` (an option given to a group reaches the subcommand that runs, or is
refused: never dropped), every group's ``--help`` names all its subcommands, every
command that reads the daemon's config says how to name one when the default is missing,
and the command reference (docs/cli.md) names every command and every option."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from sessionhook.cli import _output, cli
from sessionhook.cli.groups import Command, Group

pytestmark = pytest.mark.unit

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def walk(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every command under ``command`` (``()``: the root), groups first."""
    yield path
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            yield from walk(command.commands[name], (*path, name))


def at(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def groups() -> list[tuple[str, ...]]:
    return [path for path in walk(cli) if isinstance(at(path), click.Group)]


def options(command: click.Command) -> list[click.Option]:
    """The options a user gives (not --help or --version, which answer and exit)."""
    return [p for p in command.params if isinstance(p, click.Option) and p.expose_value and p.name]


def sample(param: click.Parameter) -> tuple[list[str], Any]:
    """Words that give ``param`` a valid value on a command line, and that value as the
    command receives it."""
    words: list[str] = [param.opts[0]] if isinstance(param, click.Option) else []
    if isinstance(param, click.Option) and param.is_flag:
        return words, True
    kind = param.type
    value: Any
    if isinstance(kind, click.Choice):
        value = str(kind.choices[-1])
        text = value
    elif isinstance(kind, click.IntRange | click.types.IntParamType):
        value = 3 if not isinstance(kind, click.IntRange) or kind.min is None else kind.min + 2
        text = str(value)
    else:
        value = text = "12"
    return [*words, text], (value,) if param.multiple else value


def required(command: click.Command, skip: set[str]) -> list[str]:
    """Words for every required option and argument of ``command`` not in ``skip``."""
    words: list[str] = []
    for param in command.params:
        if param.required and param.name not in skip:
            words += sample(param)[0]
    return words


def test_every_group_and_command_is_of_the_tree_s_classes() -> None:
    """A group of another class would drop or refuse options by its own rule."""
    paths = list(walk(cli))
    assert len(paths) > 30
    for path in paths:
        command = at(path)
        kind = Group if isinstance(command, click.Group) else Command
        assert isinstance(command, kind), (path, type(command))


def test_an_option_given_to_a_group_reaches_the_subcommand_or_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """For every option of every group and every subcommand of it: ``group --option
    VALUE sub ...`` either runs ``sub`` with ``VALUE`` (over ``sub``'s environment
    variable, too), or is a usage error naming the option."""
    received: list[dict[str, Any]] = []

    def record(**params: Any) -> None:
        received.append(params)

    tried = reached = 0
    for path in groups():
        group = at(path)
        assert isinstance(group, click.Group)
        for option in options(group):
            words, value = sample(option)
            for name, sub in sorted(group.commands.items()):
                monkeypatch.setattr(sub, "callback", record)
                received.clear()
                argv = [*path, *words, name, *required(sub, {str(option.name)})]
                env = {envvar: "from-the-environment" for envvar in _envvars(sub, option)}
                result = CliRunner().invoke(cli, argv, env=env)
                tried += 1
                if result.exit_code == 2:
                    assert option.opts[0] in result.stderr, (argv, result.output)
                    assert not received
                    continue
                assert result.exit_code == 0, (argv, result.output)
                assert len(received) == 1 and received[0][str(option.name)] == value, argv
                reached += 1
    assert tried and reached  # `deliveries --config F retry ID`, at least


def _envvars(sub: click.Command, option: click.Option) -> list[str]:
    """The environment variables of ``sub``'s option of the same name (the group's value
    must win over them, as a flag does)."""
    for param in sub.params:
        if param.name == option.name and isinstance(param, click.Option) and param.envvar:
            envvar = param.envvar
            return [envvar] if isinstance(envvar, str) else list(envvar)
    return []


def test_a_group_option_given_again_after_the_subcommand_must_say_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    retry = at(("deliveries", "retry"))
    monkeypatch.setattr(retry, "callback", lambda **params: None)
    runner = CliRunner()
    twice = ["deliveries", "--config", "a.toml", "retry", "--config", "b.toml", "12"]
    result = runner.invoke(cli, twice)
    assert result.exit_code == 2 and "--config is given twice" in result.stderr
    same = ["deliveries", "--config", "a.toml", "retry", "--config", "a.toml", "12"]
    assert runner.invoke(cli, same).exit_code == 0


def test_every_group_s_help_names_all_its_subcommands() -> None:
    """In its description (``endpoints --help`` said ``list, enable, disable, test`` of its
    eight) and in its list of commands."""
    for path in groups():
        if not path:
            continue  # the root: its list of commands is the whole tree
        group = at(path)
        assert isinstance(group, click.Group)
        result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        described, _, rest = result.output.partition("\nOptions:")
        listed = rest.partition("\nCommands:")[2]
        for name in group.commands:
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", described), (path, name)
            assert re.search(rf"^\s+{re.escape(name)}\s", listed, re.M), (path, name)


#: What each command needs on its command line before it looks for its config.
BEFORE_CONFIG: dict[tuple[str, ...], list[str]] = {
    ("endpoints", "create"): ["--url", "https://hooks.example.com/x"],
    ("replay",): ["--since", "1h"],
    ("deliveries", "recover"): ["--since", "1h"],
    ("trigger",): ["session.completed", "--endpoint", "rx"],
}
#: The commands that call the Sessions API: a missing default config is no error there.
API_GROUPS = {"sessions", "activities", "sources"}


def test_every_command_says_how_to_name_a_config_when_the_default_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``status`` without --config or $SESSIONHOOK_CONFIG, and the default file missing:
    the line says how to name one, as docs/troubleshooting.md quotes it (``run`` did,
    the operator commands did not)."""
    missing = str(tmp_path / "etc" / "config.toml")
    monkeypatch.setattr(_output, "DEFAULT_CONFIG", missing)
    monkeypatch.delenv(_output.ENV_CONFIG, raising=False)
    expected = (
        f"config error: {missing}: file not found (give --config FILE or set SESSIONHOOK_CONFIG)"
    )
    checked = []
    for path in walk(cli):
        command = at(path)
        takes = {p.name for p in command.params}
        if not path or path[0] in API_GROUPS or not takes & {"config_path", "config_flag"}:
            continue
        argv = [*path, *required(command, set()), *BEFORE_CONFIG.get(path, [])]
        result = CliRunner().invoke(cli, argv)
        assert (result.exit_code, result.stderr.strip()) == (2, expected), argv
        checked.append(path)
    assert {("status",), ("run",), ("deliveries", "retry"), ("actions", "rotate-key")} <= set(
        checked
    )


def test_the_reference_names_every_command_and_option() -> None:
    """docs/cli.md is the CLI's reference: every command has a heading of its own and every
    option of it is named in its section."""
    text = REFERENCE.read_text("utf-8")
    sections = _sections(text)
    missing: list[str] = []
    for path in walk(cli):
        if not path:
            continue
        title = "sessionhook " + " ".join(path)
        section = sections.get(title)
        if section is None:
            missing.append(f"no section `{title}`")
            continue
        for option in options(at(path)):
            if not any(f"`{spelled}" in section for spelled in option.opts):
                missing.append(f"`{title}` does not name {option.opts[0]}")
    assert missing == []


def _sections(text: str) -> dict[str, str]:
    """The text under each heading that is a command in code (`` ### `sessionhook x` ``),
    up to the next heading of any command."""
    found: dict[str, str] = {}
    heading = re.compile(r"^#{2,4} `(sessionhook[^`]*)`\s*$", re.M)
    marks = list(heading.finditer(text))
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        found[mark.group(1).strip()] = text[mark.end() : end]
    return found
