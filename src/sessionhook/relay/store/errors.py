"""The store's errors: :class:`StoreError` and the kinds a caller tells apart."""

from __future__ import annotations

from pathlib import Path

from sessionhook.wording import counted


class StoreError(Exception):
    """The store cannot do what was asked; the message says why and names the file."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class StoreUnwritableError(StoreError):
    """A write cannot be done for now (a read-only file or mount, a full disk). Nothing of
    the write was committed; the same write may succeed later."""


class StoreFullError(StoreUnwritableError):
    """A write failed for lack of space (``database or disk is full``, no room for the
    ``-shm`` index, ``ENOSPC``/``EDQUOT``). Nothing of the write was committed; the same
    write succeeds once space returns."""


class EndpointConflictError(StoreError):
    """An endpoint of that name exists already (in the config file or created through the
    API), or the endpoint is the config file's to change."""


class EndpointLimitError(EndpointConflictError):
    """The store holds ``held`` endpoints created through the API: as many as it may
    (``limit``), or more."""

    def __init__(self, limit: int, held: int, *, path: Path | None = None) -> None:
        super().__init__(
            f"the store holds {counted(held, 'endpoint')} created through the API"
            f" (at most {limit})",
            path=path,
        )
        self.limit = limit
        self.held = held
