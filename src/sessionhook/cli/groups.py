"""What an option given to a command group does: it reaches the subcommand, or is refused.

``sessionhook deliveries --config FILE retry 12``: a :class:`Group` hands each option given
on its command line to the subcommand when that takes an option of the same name (over its
environment variable and default). The same option given again after the subcommand with
another value is a usage error, and so is one the subcommand does not take: nothing given
is silently dropped. tests/test_cli_tree.py holds every group to it.
"""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource


def _given(ctx: click.Context) -> dict[str, tuple[click.Parameter, Any]]:
    """The parameters of ``ctx``'s command given on its command line, with their values."""
    return {
        param.name: (param, ctx.params[param.name])
        for param in ctx.command.params
        if param.name is not None
        and param.name in ctx.params
        and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE
    }


def _spelling(param: click.Parameter) -> str:
    return param.opts[0] if isinstance(param, click.Option) else param.human_readable_name


def _hand_down(ctx: click.Context, name: str, command: click.Command) -> None:
    """Give the subcommand ``name`` the options given to the group of ``ctx`` (as defaults:
    a required option of the subcommand is then given); refuse one it does not take."""
    given = _given(ctx)
    if not given:
        return
    takes = {param.name for param in command.params}
    for key, (param, _) in given.items():
        if key not in takes:
            raise click.UsageError(
                f"{_spelling(param)} goes with `{ctx.command_path}` alone: "
                f"`{ctx.command_path} {name}` has no such option",
                ctx=ctx,
            )
    defaults = dict(ctx.default_map or {})
    defaults[name] = {**defaults.get(name, {}), **{k: v for k, (_, v) in given.items()}}
    ctx.default_map = defaults


def _take_handed_down(ctx: click.Context) -> None:
    """Put the options handed down by the parent group into ``ctx.params`` (over an
    environment variable or a default); a different value given here too is refused."""
    parent = ctx.parent
    if parent is None or not isinstance(parent.command, Group):
        return
    for key, (param, value) in _given(parent).items():
        if key not in ctx.params:
            continue
        if ctx.get_parameter_source(key) is ParameterSource.COMMANDLINE:
            if ctx.params[key] != value:
                raise click.UsageError(
                    f"{_spelling(param)} is given twice, before and after "
                    f"`{ctx.info_name}`, with different values: give it once",
                    ctx=ctx,
                )
            continue
        ctx.params[key] = value


class Command(click.Command):
    """A subcommand that takes the options its group was given (see the module)."""

    def invoke(self, ctx: click.Context) -> Any:
        _take_handed_down(ctx)
        return super().invoke(ctx)


class Group(click.Group):
    """A group whose options reach its subcommands or are refused (see the module)."""

    command_class = Command
    #: ``type``: a group made with ``@group.group()`` is of this class too.
    group_class = type

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name is not None and command is not None and not ctx.resilient_parsing:
            _hand_down(ctx, name, command)
        return name, command, rest

    def invoke(self, ctx: click.Context) -> Any:
        _take_handed_down(ctx)
        return super().invoke(ctx)
