"""What the operator layer refuses: one line for the user, and how a name is quoted in it."""

from __future__ import annotations


class OperatorError(Exception):
    """Something the operator asked for does not exist or cannot be done; ``str()`` is one
    line for the user, ``hint`` an optional next step."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UnknownEndpointError(OperatorError):
    """No endpoint of that name in the database: a mistyped name, the user's to fix (the
    command line exits 2 for it, as for any bad argument)."""


#: A name a refusal quotes is cut here (no endpoint's name is longer: a 10 KB one names none).
_NAME_SHOWN = 80
#: A refusal lists this many known names at most.
_NAMES_SHOWN = 10


def shown_name(name: str) -> str:
    """``name`` quoted, cut if long."""
    return repr(name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "…")


def shown_names(names: list[str]) -> str:
    """The first ``names``, and how many more."""
    more = len(names) - _NAMES_SHOWN
    return ", ".join(names[:_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")
