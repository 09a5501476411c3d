"""The one error of the relay's configuration: :class:`ConfigError`."""

from __future__ import annotations


class ConfigError(Exception):
    """A bad configuration: ``key`` the dotted path, ``problem`` why; ``str()`` is one line,
    ``config error: <key>: <problem>``."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config error: {key}: {problem}")
        self.key = key
        self.problem = problem
