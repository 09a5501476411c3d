"""PostgreSQL URLs as the config reads them and as messages show them (never the password).

psycopg parses them; it is imported only when a URL is read, so a SQLite relay never loads
it (about 10 MB of memory).
"""

from __future__ import annotations

from ...redact import redact_userinfo


def is_postgres_url(text: str) -> bool:
    """Whether ``text`` names a PostgreSQL database (``postgresql://`` / ``postgres://``)."""
    return text.startswith(("postgresql://", "postgres://"))


def check_postgres_url(value: str) -> None:
    """Refuse what is not a ``postgresql://`` URL psycopg can parse (never echoing it: it
    may hold a password)."""
    if not is_postgres_url(value):
        raise ValueError('must be a "postgresql://user:password@host:port/database" URL')
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(value)
    except Exception:
        raise ValueError("is not a valid PostgreSQL URL") from None


def display_url(url: str) -> str:
    """``url`` as shown in logs and messages: user, host, port and database, no password."""
    import psycopg

    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return redact_userinfo(url.split("?", 1)[0])
    host = str(params.get("host") or "localhost")
    port = params.get("port")
    user = params.get("user")
    where = f"{host}:{port}" if port else host
    who = f"{user}@" if user else ""
    return redact_userinfo(f"postgresql://{who}{where}/{params.get('dbname') or ''}")
