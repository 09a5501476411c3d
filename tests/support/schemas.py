"""Databases as sessionhook at fc72eec left them, and a database's schema as a value to compare.

``schema_fc72eec.json`` holds every statement fc72eec's migrations executed on a new database
(sqlite-utils ran SQLite's, a runner of its own PostgreSQL's, under names applied out of
numeric order), captured as executed on each engine and grouped by migration, each group
ending with its bookkeeping row. Replaying the first groups makes a database exactly as that
version left it after those migrations, its names recorded as that version recorded them.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg

_FIXTURE = json.loads(Path(__file__).with_name("schema_fc72eec.json").read_text())

#: fc72eec's migration names, in the order it applied them.
OLD_NAMES: list[str] = [m["name"] for m in _FIXTURE["sqlite"]["migrations"]]


def _statements(engine: str, through: str | None) -> list[str]:
    recorded = _FIXTURE[engine]
    statements = list(recorded["bookkeeping"])
    for migration in recorded["migrations"]:
        statements += migration["statements"]
        if migration["name"] == through:
            return statements
    if through is not None:
        raise ValueError(f"fc72eec had no migration {through}")
    return statements


def build_old_sqlite(path: Path, *, through: str | None = None) -> None:
    """A SQLite file at ``path`` as fc72eec left it after migration ``through`` (all: None)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN IMMEDIATE")
        for statement in _statements("sqlite", through):
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


def build_old_postgres(url: str, *, through: str | None = None) -> None:
    """The (empty) PostgreSQL database at ``url`` as fc72eec left it after ``through``."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for statement in _statements("postgres", through):
            conn.execute(statement.encode())


def sqlite_schema(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """Every table, index and trigger with its definition (whitespace runs as one space)."""
    rows = conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL"
    ).fetchall()
    return sorted((kind, name, " ".join(sql.split())) for kind, name, sql in rows)


_PG_CATALOG = {
    "columns": """SELECT table_name, column_name, ordinal_position, data_type, collation_name,
        column_default, is_nullable, is_identity, identity_generation, is_generated,
        generation_expression FROM information_schema.columns
        WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position""",
    "tables": """SELECT table_name, table_type FROM information_schema.tables
        WHERE table_schema = current_schema() ORDER BY table_name""",
    "indexes": """SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = current_schema() ORDER BY indexname""",
    "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = current_schema()::regnamespace
        ORDER BY 1, 2""",
    "triggers": """SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid)
        FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2""",
    "functions": """SELECT proname, pg_get_function_arguments(oid),
        pg_get_function_result(oid), prosrc FROM pg_proc
        WHERE pronamespace = current_schema()::regnamespace ORDER BY 1""",
}


def postgres_schema(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Tables, columns (types, collations, defaults, generation), indexes, constraints,
    triggers and functions (their bodies' whitespace runs as one space)."""
    with psycopg.connect(url, autocommit=True) as conn:
        found = {
            part: [tuple(row) for row in conn.execute(query.encode()).fetchall()]
            for part, query in _PG_CATALOG.items()
        }
    found["functions"] = [(*row[:-1], " ".join(str(row[-1]).split())) for row in found["functions"]]
    return found
