"""How the daemon fails: :class:`DaemonError` (one line for the user, with an exit status)
and the store failures it turns into one (:func:`~.store.store_failures`).

Shared by :mod:`.daemon` and its collaborators.
"""

from __future__ import annotations


class DaemonError(Exception):
    """The daemon cannot start or go on; ``str()`` is one line, ``exit_code`` the status."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
