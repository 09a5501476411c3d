"""``listen --forward-to``'s state file: where a forwarder resumes, and the secret it signs
with, so that a restart goes on after the last event the consumer acknowledged and the
consumer's configuration keeps working.

One file per relay URL and target (:func:`default_state_path`, under
``$XDG_STATE_HOME/sessionhook/listen/``), JSON, mode 0600 from its first byte and written
whole or not at all: it holds a secret, so it is read by the rule of every secret file (a
file its group or other users can read is refused). A file that is not one of ours (bad
JSON, another relay's, too large) is refused in one line, never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: The ``version`` member of the files this version writes.
STATE_VERSION: Final = 1
#: A state file is a few hundred bytes; anything much larger is not one.
MAX_STATE_BYTES: Final = 64 * 1024
#: The longest event id kept (the relay's are 36 characters).
MAX_EVENT_ID_CHARS: Final = 1024


class StateFileError(Exception):
    """A state file that cannot be used; ``str()`` is one line naming it and the fix."""


@dataclass(frozen=True, slots=True)
class ListenState:
    """What a forwarder keeps: which relay and target, its signing secret, and the last
    event the consumer acknowledged (``None`` before the first)."""

    url: str
    forward_to: str
    secret: str
    last_event_id: str | None = None


def default_state_path(url: str, target: str, environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_STATE_HOME/sessionhook/listen/<digest>.json`` (``~/.local/state`` when the
    variable is unset or not absolute, as the XDG rules say), the digest naming the pair."""
    base = environ.get("XDG_STATE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    digest = hashlib.sha256(f"{url}\n{target}".encode()).hexdigest()[:16]
    return root / "sessionhook" / "listen" / f"{digest}.json"


def read_state(path: Path, *, url: str, target: str) -> ListenState | None:
    """The state in ``path`` for ``url`` and ``target``; ``None`` when there is no file.
    :class:`StateFileError` for a file that is not a state of this pair, or that its
    group or other users can read."""
    from ..relay.config.secret_files import SecretFileError, read_secret_file
    from ..relay.domain import signing

    fix = f"remove it or give another --state-file ({path})"
    try:
        size = path.lstat().st_size
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(f"--state-file {path}: {exc.strerror or exc}") from None
    if not path.is_file() or path.is_symlink():
        raise StateFileError(f"--state-file {path}: not a regular file; {fix}")
    if size > MAX_STATE_BYTES:
        raise StateFileError(f"--state-file {path}: {size} bytes, not a state file; {fix}")
    try:
        text = read_secret_file(path)
    except SecretFileError as exc:
        raise StateFileError(f"--state-file: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateFileError(f"--state-file {path}: not JSON ({exc}); {fix}") from None
    fields = ("url", "forward_to", "secret", "last_event_id")
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise StateFileError(f"--state-file {path}: not a listen state file; {fix}")
    saved_url, saved_target, secret, last = (data.get(k) for k in fields)
    last_ok = last is None or (isinstance(last, str) and 0 < len(last) <= MAX_EVENT_ID_CHARS)
    if not (isinstance(saved_url, str) and isinstance(saved_target, str)) or not last_ok:
        raise StateFileError(f"--state-file {path}: not a listen state file; {fix}")
    if not isinstance(secret, str):
        raise StateFileError(f"--state-file {path}: no signing secret; {fix}")
    try:
        signing.decode_secret(secret)
    except ValueError as exc:
        raise StateFileError(f"--state-file {path}: its secret: {exc}; {fix}") from None
    if (saved_url, saved_target) != (url, target):
        raise StateFileError(
            f"--state-file {path}: it belongs to --url {saved_url} --forward-to "
            f"{saved_target}; {fix}"
        )
    return ListenState(saved_url, saved_target, secret, last)


def write_state(path: Path, state: ListenState) -> None:
    """Write ``state`` to ``path`` (mode 0600, whole or not at all; its folder made 0700).
    :class:`StateFileError` when it cannot be written."""
    from ..relay.config.secret_files import write_secret_file

    record = {
        "version": STATE_VERSION,
        "url": state.url,
        "forward_to": state.forward_to,
        "secret": state.secret,
        "last_event_id": state.last_event_id,
    }
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_secret_file(path, json.dumps(record, indent=1) + "\n", replace=True)
    except OSError as exc:
        raise StateFileError(f"--state-file {path}: cannot write: {exc.strerror or exc}") from None
