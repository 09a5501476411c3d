"""The one error of the relay's configuration: :class:`ConfigError`."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(Exception):
    """A bad configuration: ``key`` is the dotted path (``endpoints[0].url``), ``problem`` why.

    ``str()`` is ``config error: <key>: <problem>``, one line, meant for the user as is.
    """

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config error: {key}: {problem}")
        self.key = key
        self.problem = problem
