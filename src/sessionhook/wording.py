"""Counts in words: ``1 delivery``, ``2 deliveries``. Every count a person reads (the CLI,
the console, ``listen``, the API's messages) is spelled by :func:`counted`, so that none
says ``1 files`` (tests/test_wording.py looks for one spelled otherwise)."""

from __future__ import annotations

_VOWELS = frozenset("aeiou")


def plural(noun: str) -> str:
    """The regular plural of an English ``noun``: ``delivery`` -> ``deliveries``, ``key``
    -> ``keys``, ``session`` -> ``sessions``, ``match`` -> ``matches``."""
    if noun.endswith("y") and len(noun) > 1 and noun[-2] not in _VOWELS:
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def counted(n: int, noun: str, plural_noun: str | None = None) -> str:
    """``n`` and ``noun`` agreeing with it: ``counted(1, "delivery")`` is ``1 delivery``,
    ``counted(0, "delivery")`` ``0 deliveries``. ``plural_noun`` when it is irregular."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {plural_noun if plural_noun is not None else plural(noun)}"
