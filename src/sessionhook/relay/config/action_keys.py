"""The action-link key file (``actions.key_file``): the key that signs the links, and older
keys kept while the links they signed may still be used.

One key a line, ``<base64url key> <retire-at>``, the current key first (retire-at ``-``); a
secret file (mode 0600, :mod:`.secret_files`). :class:`ActionKeys` reads it again when it
changed on disk, so ``sessionhook actions rotate-key`` takes effect on running daemons.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..domain.action_links import ActionLinks
from .errors import ConfigError
from .models import Config
from .secret_files import SecretFileError, read_secret_file, write_secret_file

#: Bytes of a generated key.
KEY_BYTES: Final = 32
_MIN_KEY_BYTES: Final = 16
_MAX_LINES: Final = 64
_KEY_NAME: Final = "actions.key_file"


@dataclass(frozen=True, slots=True)
class KeyRing:
    """``current`` signs; ``all`` (current first) verify. ``retiring``: the older keys'
    ``(key, retire_at)``."""

    current: bytes
    retiring: tuple[tuple[bytes, float], ...] = ()

    def all(self, now: float) -> tuple[bytes, ...]:
        """The keys that verify at ``now`` (the current one, and older ones not retired)."""
        return (self.current, *(key for key, until in self.retiring if now < until))


def _encode(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).rstrip(b"=").decode("ascii")


def _decode(text: str, where: str) -> bytes:
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(_KEY_NAME, f"{where}: not a base64url key") from None
    if len(key) < _MIN_KEY_BYTES:
        raise ConfigError(_KEY_NAME, f"{where}: a key needs {_MIN_KEY_BYTES} bytes or more")
    return key


def _parse(text: str, file: Path) -> KeyRing:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ConfigError(_KEY_NAME, f"{file} is empty")
    if len(lines) > _MAX_LINES:
        raise ConfigError(_KEY_NAME, f"{file} has more than {_MAX_LINES} keys")
    current: bytes | None = None
    retiring: list[tuple[bytes, float]] = []
    for number, line in enumerate(lines, 1):
        where = f"{file} line {number}"
        key_text, _, until_text = line.partition(" ")
        key = _decode(key_text, where)
        until_text = until_text.strip() or "-"
        if number == 1:
            if until_text != "-":
                raise ConfigError(_KEY_NAME, f"{where}: the first key is the current one ('-')")
            current = key
            continue
        try:
            until = float(until_text)
        except ValueError:
            raise ConfigError(_KEY_NAME, f"{where}: the retire time must be Unix seconds") from None
        retiring.append((key, until))
    assert current is not None
    return KeyRing(current, tuple(retiring))


def _format(ring: KeyRing) -> str:
    lines = [f"{_encode(ring.current)} -"]
    lines += [f"{_encode(key)} {until:.0f}" for key, until in ring.retiring]
    return "\n".join(lines) + "\n"


def _read(file: Path) -> KeyRing:
    try:
        text = read_secret_file(file)
    except SecretFileError as exc:
        raise ConfigError(_KEY_NAME, str(exc)) from None
    if not text.isascii():
        raise ConfigError(_KEY_NAME, f"{file} is not a key file (not ASCII text)")
    return _parse(text, file)


def rotate_key_file(file: Path, *, overlap: float, now: float) -> KeyRing:
    """Make a new current key in ``file`` (created when missing). The old current key is
    kept for ``overlap`` seconds (links it signed keep working until they expire), older
    ones until their own time; retired keys are dropped. ``overlap`` 0 keeps no old key
    at all: every link signed before stops working now (how a leaked link is revoked)."""
    ring = _read(file) if file.exists() else None
    kept: list[tuple[bytes, float]] = []
    if ring is not None and overlap > 0:
        kept = [(ring.current, now + overlap)]
        kept += [(key, until) for key, until in ring.retiring if until > now]
    new = KeyRing(secrets.token_bytes(KEY_BYTES), tuple(kept))
    write_secret_file(file, _format(new), replace=True)
    return new


class ActionKeys:
    """The key ring of ``file``, created on first use (mode 0600) and read again whenever it
    changed; :class:`ConfigError` for a file unreadable, not a key file, or exposed."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._ring: KeyRing | None = None

    def ring(self) -> KeyRing:
        """The current ring (the file is stat'ed on each call: cheap, and a rotation on
        disk is seen at once)."""
        with self._lock:
            try:
                st = self.file.stat()
            except FileNotFoundError:
                self._create()
                st = self.file.stat()
            except OSError as exc:
                raise ConfigError(
                    _KEY_NAME, f"cannot read {self.file}: {exc.strerror or exc}"
                ) from None
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._ring is None or stamp != self._seen:
                self._ring = _read(self.file)
                self._seen = stamp
            return self._ring

    def _create(self) -> None:
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            # Never replaces a key another replica just made.
            write_secret_file(self.file, _format(KeyRing(secrets.token_bytes(KEY_BYTES))))
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(
                _KEY_NAME, f"cannot create {self.file}: {exc.strerror or exc}"
            ) from None


class LinkKeys:
    """The action-link keys of the running configuration: one :class:`ActionKeys` per key
    file, for the poller (:meth:`links`) and the web pages (:meth:`ring`)."""

    def __init__(self, config: Callable[[], Config]) -> None:
        self._config = config
        self._files: dict[Path, ActionKeys] = {}
        self._lock = threading.Lock()

    def _keys(self) -> ActionKeys:
        file = self._config().actions.key_file
        if file is None:  # a Config not made by load_config (tests): no file was resolved
            raise ConfigError(_KEY_NAME, "no key file resolved")
        with self._lock:
            keys = self._files.get(file)
            if keys is None:
                keys = self._files[file] = ActionKeys(file)
            return keys

    @property
    def enabled(self) -> bool:
        """Whether ``[actions]`` is on."""
        return self._config().actions.enabled

    def ring(self) -> KeyRing:
        """The keys now (the file made when missing); :class:`ConfigError` when it cannot
        be read or is exposed."""
        return self._keys().ring()

    def links(self) -> ActionLinks | None:
        """What signs the links of a new event; ``None`` with ``[actions]`` off."""
        actions = self._config().actions
        if not actions.enabled or actions.public_url is None:
            return None
        return ActionLinks(actions.public_url, actions.link_ttl, self.ring().current)
