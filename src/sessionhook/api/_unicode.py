"""Text that is not Unicode in an answer (pure, no I/O).

``json.loads`` lets a lone surrogate through (``"\\ud800"``): text that nothing downstream can
encode (the archive, a log line, an event body). An activity holding one is refused like any
malformed item: its text is what the relay archives and forwards, and a mended diff or
message would be another one. A session is a container, not content: refusing it for a
broken title would hold back every activity it has (a title cut inside an emoji by a
UTF-16 length limit is enough), so :func:`mended` replaces each lone surrogate with U+FFFD
and says where (:attr:`~sessionhook.api.models.Session.repaired`). Its ``name`` is its
identity and cannot be mended: such an item stays malformed.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, TypeVar

from pydantic import BaseModel

from .models import Session

_M = TypeVar("_M", bound=BaseModel)

# json.loads pairs a valid surrogate pair into one character: any surrogate left is lone.
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class NotUnicodeError(ValueError):
    """An answer's text holds a lone surrogate (``"\\ud800"``): it is no Unicode text."""


def is_unicode(value: object) -> bool:
    """Whether every string in a parsed JSON value is Unicode text (no lone surrogate,
    which ``json.loads`` lets through from a ``\\ud800`` escape)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def mended(model: type[_M], raw: Any) -> _M:
    """``raw`` as ``model``, each lone surrogate replaced by U+FFFD and its path recorded in
    :attr:`Session.repaired`. Raises :class:`NotUnicodeError` for anything but a
    :class:`Session`, and for a lone surrogate in its ``name``."""
    if model is not Session:
        raise NotUnicodeError("text that is not Unicode (a lone surrogate)")
    paths: list[str] = []
    fixed = _mend(raw, "", paths)
    if "name" in paths:
        raise NotUnicodeError("name: text that is not Unicode (a lone surrogate)")
    item = model.model_validate(fixed)
    if isinstance(item, Session):
        item.mark_repaired(tuple(paths))
    return item


def _mend(value: Any, path: str, paths: list[str]) -> Any:
    """``value`` with every lone surrogate replaced; the dotted path of each string mended
    is added to ``paths``. Recursion is bounded: the answer passed the depth check."""
    if isinstance(value, str):
        fixed = _SURROGATE.sub("\ufffd", value)
        if fixed != value:
            paths.append(path)
        return fixed
    if isinstance(value, list):
        return [_mend(item, _join(path, str(i)), paths) for i, item in enumerate(value)]
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            name = _SURROGATE.sub("\ufffd", key)
            if name != key:
                paths.append(_join(path, name))
            result[name] = _mend(item, _join(path, name), paths)
        return result
    return value


def _join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part
