"""Reading a list page item by item, and text that is not Unicode (pure, no I/O).

A page whose envelope is sound must not be lost for one item that is not what the API
promises: :func:`items_one_by_one` keeps the items that validate and describes the others as
:class:`RefusedItem` (``malformed``), so that the caller can name them and go on.

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
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import MalformedResponseError
from .models import Activity, ListActivitiesResponse, ListSessionsResponse, Session

__all__ = ["NotUnicodeError", "RefusedItem", "is_unicode", "items_one_by_one", "mended"]

_M = TypeVar("_M", bound=BaseModel)
_L = TypeVar("_L", ListActivitiesResponse, ListSessionsResponse)

# json.loads pairs a valid surrogate pair into one character: any surrogate left is lone.
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# What each list's items are, by the envelope's key.
_ITEMS: Final[dict[str, tuple[type[BaseModel], str]]] = {
    "activities": (Activity, "an activity"),
    "sessions": (Session, "a session"),
}


class NotUnicodeError(ValueError):
    """An answer's text holds a lone surrogate (``"\\ud800"``): it is no Unicode text."""


@dataclass(frozen=True)
class RefusedItem:
    """One item of a list that cannot be read: ``reason`` says why.

    ``too_large``: the item alone (a page of one) is over the bound. Its answer was scanned
    as it streamed by, never kept: ``name`` and ``create_time`` are what the scan found
    (empty when the item did not say), ``size`` the bytes the answer had and ``limit`` the
    bound it broke. ``malformed``: the item is not an activity (or session): no string
    ``name``, a field of the wrong type; ``detail`` says what is wrong, ``name`` and
    ``create_time`` are given when they are strings.
    """

    name: str
    create_time: str
    size: int
    limit: int
    reason: str = "too_large"
    detail: str = ""


def is_unicode(value: object) -> bool:
    """Whether every string in a parsed JSON value is Unicode text (no lone surrogate,
    which ``json.loads`` lets through from a ``\\ud800`` escape)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def mended(model: type[_M], raw: Any) -> _M:
    """``raw`` (JSON with a lone surrogate somewhere) as ``model``, each lone surrogate
    replaced by U+FFFD, the paths mended in :attr:`Session.repaired`.

    Only a :class:`Session` is mended, and never its ``name``: anything else raises
    :class:`NotUnicodeError` (so does a ``raw`` that does not validate once mended:
    :class:`pydantic.ValidationError`).
    """
    if model is not Session:
        raise NotUnicodeError("text that is not Unicode (a lone surrogate)")
    paths: list[str] = []
    fixed = _mend(raw, "", paths)
    if "name" in paths:
        raise NotUnicodeError("name: text that is not Unicode (a lone surrogate)")
    item = model.model_validate(fixed)
    if isinstance(item, Session):
        item._repaired = tuple(paths)
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


def items_one_by_one(
    envelope_model: type[_L], key: str, content: bytes, error: MalformedResponseError
) -> tuple[_L, list[RefusedItem]]:
    """A page whose envelope is sound but some of its ``key`` items are not what they should
    be: the envelope with the good items (sessions mended, see :func:`mended`), and the
    others as ``malformed`` :class:`RefusedItem`. Re-raises ``error`` when the envelope
    itself is wrong. ``content`` passed the depth check already."""
    data = json.loads(content)
    items = data.get(key) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise error
    try:
        envelope = envelope_model.model_validate({k: v for k, v in data.items() if k != key})
    except ValidationError:
        raise error from None
    if not is_unicode(envelope.to_wire()):
        raise error  # a page token nobody can send back
    item_model, noun = _ITEMS[key]
    kept: list[Any] = getattr(envelope, key)
    invalid: list[RefusedItem] = []
    for raw in items:
        try:
            unicode = is_unicode(raw)
            kept.append(item_model.model_validate(raw) if unicode else mended(item_model, raw))
        except (ValidationError, NotUnicodeError) as exc:
            invalid.append(_refused(raw, exc, noun))
    return envelope, invalid


def _refused(raw: Any, exc: ValidationError | NotUnicodeError, noun: str) -> RefusedItem:
    """The :class:`RefusedItem` of an item that is not ``noun``."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "item"
        problem = f"{where}: {first['msg']}"
    else:
        problem = str(exc)
    fields = raw if isinstance(raw, dict) else {}
    name, when = fields.get("name"), fields.get("createTime")
    return RefusedItem(
        name=name if isinstance(name, str) and is_unicode(name) else "",
        create_time=when if isinstance(when, str) and is_unicode(when) else "",
        size=len(json.dumps(raw)),
        limit=0,
        reason="malformed",
        detail=f"not {noun}: {problem}",
    )
