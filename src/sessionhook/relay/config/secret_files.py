"""Who else can read a file that holds a secret: the one rule for every ``*_file`` of the
config, ``listen --secret-file`` and the files the relay writes (:func:`write_secret_file`).

A secret file gives its group and other users no access (``chmod 600``). A POSIX ACL is read
as the kernel reads it: named-user entries (systemd's credentials carry one) are accepted;
a group entry, the owning group's or ``other``, within the mask, are not.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import struct
from pathlib import Path
from typing import Final

#: Where Linux keeps a file's access ACL (the ``setfacl`` binary format).
ACL_XATTR: Final = "system.posix_acl_access"

# The xattr: a little-endian u32 version (2), then (u16 tag, u16 perm, u32 id) entries. The
# tags judged here (the owner, 0x01, and named users, 0x02, are not):
_HEADER: Final = struct.Struct("<I")
_ENTRY: Final = struct.Struct("<HHI")
_GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x04, 0x08, 0x10, 0x20
_RWX: Final = 0o7


def exposure(mode: int) -> str | None:
    """Why a file of permission bits ``mode`` (no ACL) exposes a secret; ``None`` if it
    does not."""
    if mode & 0o077 == 0:
        return None
    found = (("its group", 0o070), ("other users", 0o007))
    who = " and ".join(w for w, bits in found if mode & bits)
    return f"{who} can access it (mode {stat.S_IMODE(mode):o})"


def acl_exposure(mode: int, acl: bytes) -> str | None:
    """:func:`exposure` for a file carrying the access ACL ``acl`` (the xattr's bytes)."""
    if len(acl) < _HEADER.size or (len(acl) - _HEADER.size) % _ENTRY.size:
        return f"its ACL cannot be read (mode {stat.S_IMODE(mode):o})"
    entries = [_ENTRY.unpack_from(acl, at) for at in range(_HEADER.size, len(acl), _ENTRY.size)]
    mask = next((perm for tag, perm, _ in entries if tag == _MASK), _RWX)
    groups = any(perm & mask for tag, perm, _ in entries if tag in (_GROUP_OBJ, _GROUP))
    others = any(perm & _RWX for tag, perm, _ in entries if tag == _OTHER)
    if not (groups or others):
        return None
    who = " and ".join(w for w, found in (("a group", groups), ("other users", others)) if found)
    return f"its ACL lets {who} access it (mode {stat.S_IMODE(mode):o})"


def file_exposure(file: Path) -> str | None:
    """Why ``file`` exposes a secret, or ``None``; :class:`OSError` when it cannot be examined."""
    mode = file.stat().st_mode
    try:
        acl = os.getxattr(file, ACL_XATTR)
    except OSError as exc:
        # No ACL, or a file system without them: the permission bits are the whole story.
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        return exposure(mode)
    return acl_exposure(mode, acl)


class SecretFileError(Exception):
    """A secret file that cannot be used (missing, unreadable, exposed to other users,
    empty, not UTF-8); ``str()`` is one line naming the file."""


def read_secret_file(file: Path) -> str:
    """The secret ``file`` holds (its text, stripped), once the module's rule accepts the
    file. Raises :class:`SecretFileError`."""
    try:
        exposed = file_exposure(file)
    except OSError as exc:
        raise SecretFileError(f"cannot read {file}: {exc.strerror or exc}") from None
    if exposed is not None:
        raise SecretFileError(f"{file} holds a secret but {exposed}: chmod 600 {file}")
    try:
        text = file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SecretFileError(f"cannot read {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SecretFileError(f"{file} is not UTF-8 text (byte {exc.start})") from None
    if not text:
        raise SecretFileError(f"{file} is empty")
    return text


def write_secret_file(file: Path, text: str, *, replace: bool = False) -> None:
    """Write ``text`` to ``file`` as a secret file: mode 0600 from its first byte, whole or
    not at all (written beside, then moved). An existing ``file`` (a link never followed)
    raises :class:`FileExistsError` unless ``replace``; :class:`OSError` when unwritable."""
    temp = file.with_name(f".{file.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), 0o600)  # a umask may have taken the owner's bits too
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if replace:
            os.replace(temp, file)
        else:
            os.link(temp, file)  # fails on any existing name: never replaces one
    finally:
        temp.unlink(missing_ok=True)
