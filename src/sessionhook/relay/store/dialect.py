"""One SQL text, two engines: what the query modules may assume of a connection.

Every query in this package is written ONCE, in the subset of SQL that SQLite (3.40 here)
and PostgreSQL both accept, with ``?`` placeholders:

* ``INSERT ... ON CONFLICT (...) DO NOTHING / DO UPDATE SET ... = excluded. ...`` (never
  ``INSERT OR IGNORE / REPLACE``);
* ``INSERT ... RETURNING id`` for a generated key (never ``lastrowid``);
* a list parameter is passed as one JSON text and read with ``json_each(?)``:
  ``x IN (SELECT value FROM json_each(?))``. That is the one textual hook: on PostgreSQL
  :func:`to_pyformat` rewrites it to ``json_array_elements_text(CAST(? AS json))``, whose
  column is named ``value`` too (the values are text on both: use it for text keys);
* flags are ``INTEGER`` 0/1 on both (``enabled = 1``), never booleans;
* no SQL functions of our own (``create_function``): glob matching and payload conditions
  are applied in Python on the rows a query returns;
* every selected column is grouped or aggregated; no ``LIMIT -1``; no ``typeof``; no
  ``rowid`` except ``activities.rowid``, which the PostgreSQL schema declares as a column.

A query module sees a :class:`Connection`: ``sqlite3.Connection`` fits it as it is (the
SQLite store hands its connection over untouched: no wrapper on the hot path), and the
PostgreSQL store hands a small adapter (:mod:`.postgres`) that translates the text once
(:func:`to_pyformat`, cached) and binds parameters on the client side
(``psycopg.ClientCursor``), so that an untyped ``? IS NULL`` is valid.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

__all__ = ["Connection", "Cursor", "to_pyformat"]


class Cursor(Protocol):
    """The part of a DB-API cursor the queries use."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def fetchmany(self, size: int = ...) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What a query module may call on the connection the store gives it."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...


# A string literal, a quoted identifier, a placeholder, a percent sign, or json_each(?).
_TOKENS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|json_each\(\?\)|\?|%")


@functools.lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """``sql`` (``?`` placeholders, see the module docstring) for psycopg: ``?`` becomes
    ``%s``, a literal ``%`` becomes ``%%``, ``json_each(?)`` becomes
    ``json_array_elements_text(CAST(%s AS json))``; quoted text is left alone."""

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "?":
            return "%s"
        if token == "%":
            return "%%"
        if token == "json_each(?)":
            return "json_array_elements_text(CAST(%s AS json))"
        return token.replace("%", "%%")  # a literal: psycopg still reads % in it

    return _TOKENS.sub(replace, sql)
