"""Actions people took through the relay (table ``actions_taken``): who approved a plan or
answered an agent, when, through which link, and what the service answered.

A link works once. :meth:`ActionQueries.claim_action` writes the row ``pending`` before the
upstream call, in one transaction that also checks that neither the token (by its SHA-256)
nor the wait (session and activity) was taken already by a row that is ``pending`` or
``ok``: two clicks at once make one upstream call. :meth:`ActionQueries.finish_action`
records the answer; a call the service refused (``failed``) frees the link and the wait
again (the person may try once more), a ``pending`` row left by a crash does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..domain.rows import from_row
from .dialect import Database
from .log_rows import where
from .policy import call

#: The ``result`` column: ``pending`` (the upstream call under way), ``ok``, ``failed``.
ACTION_RESULTS = ("pending", "ok", "failed")
#: Texts from the network (user agents, details) are stored cut to this many characters.
_MAX_TEXT = 512
#: The row that used a token or answered a wait (``token_hash``, ``session``, ``wait``); an
#: action without a link has no token (``''``), so only its wait can be taken.
_TAKEN = (
    "result IN ('pending', 'ok') "
    "AND ((token_hash <> '' AND token_hash = ?) OR (session_name = ? AND wait = ?))"
)
_COLUMNS = (
    "id, taken_at, session_name AS session, wait, action, account, actor_kind, actor_address, "
    "actor_agent, chat_user, token_hash, result, status, detail"
)


@dataclass(frozen=True, slots=True)
class ActionClaim:
    """An action about to be made: what (``action`` on ``session`` of ``account``, for the
    wait ``wait``), by whom (``actor_kind``: ``link``, ``slack``, ``console``, ``api``, ``mcp``; the
    client's address and user agent, the chat user when a chat service says), with which token
    (``token_hash``: its SHA-256), when (``taken_at``, Unix seconds)."""

    taken_at: float
    session: str
    wait: str
    action: str
    account: str
    actor_kind: str
    actor_address: str
    actor_agent: str
    chat_user: str | None
    token_hash: str


@dataclass(frozen=True, slots=True)
class ActionRow(ActionClaim):
    """A recorded action: its claim, its ``id``, and how it went (``result`` of
    :data:`ACTION_RESULTS`, the service's HTTP ``status``, a ``detail``)."""

    id: int
    result: str
    status: int | None
    detail: str


class ActionQueries:
    """The actions role over one database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @call
    def claim_action(self, claim: ActionClaim) -> int | None:
        """Record ``claim`` as ``pending``; its id, or ``None`` when its token or its wait
        was taken already (a ``pending`` or ``ok`` row)."""
        with self._db.tx() as c:
            taken = c.execute(
                f"SELECT 1 FROM actions_taken WHERE {_TAKEN}",
                (claim.token_hash, claim.session, claim.wait),
            ).fetchone()
            if taken is not None:
                return None
            row = c.execute(
                "INSERT INTO actions_taken (taken_at, session_name, wait, action, account, "
                "actor_kind, actor_address, actor_agent, chat_user, token_hash, result, "
                "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', '') RETURNING id",
                _claim_values(claim),
            ).fetchone()
            return int(row["id"])

    @call
    def finish_action(self, action_id: int, ok: bool, status: int | None, detail: str) -> None:
        """Record the service's answer to the claimed action ``action_id``."""
        with self._db.tx() as c:
            c.execute(
                "UPDATE actions_taken SET result = ?, status = ?, detail = ? WHERE id = ?",
                ("ok" if ok else "failed", status, detail[:_MAX_TEXT], action_id),
            )

    @call
    def record_action(self, claim: ActionClaim, ok: bool, status: int | None, detail: str) -> int:
        """Record an action made without a link (the console, the API: ``token_hash`` is
        empty), done already; its id. An ``ok`` one answers its wait for the links too."""
        with self._db.tx() as c:
            row = c.execute(
                "INSERT INTO actions_taken (taken_at, session_name, wait, action, account, "
                "actor_kind, actor_address, actor_agent, chat_user, token_hash, result, status, "
                "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (
                    *_claim_values(claim),
                    "ok" if ok else "failed",
                    status,
                    detail[:_MAX_TEXT],
                ),
            ).fetchone()
            return int(row["id"])

    @call
    def action_taken(self, token_hash: str, session: str, wait: str) -> ActionRow | None:
        """The ``pending`` or ``ok`` action that used this token or answered this wait."""
        row = self._db.conn.execute(
            f"SELECT {_COLUMNS} FROM actions_taken WHERE {_TAKEN} ORDER BY id LIMIT 1",
            (token_hash, session, wait),
        ).fetchone()
        return None if row is None else from_row(ActionRow, row)

    @call
    def list_actions(
        self, *, session: str | None = None, before: int | None = None, limit: int = 100
    ) -> list[ActionRow]:
        """Actions newest first (of ``session`` only, when given), ids below ``before``."""
        text, params = where(("session_name = ?", session), ("id < ?", before))
        rows = self._db.conn.execute(
            f"SELECT {_COLUMNS} FROM actions_taken {text} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        return [from_row(ActionRow, row) for row in rows.fetchall()]


def _claim_values(claim: ActionClaim) -> tuple[Any, ...]:
    """The claim's columns, network texts cut."""
    return (
        claim.taken_at,
        claim.session,
        claim.wait,
        claim.action,
        claim.account,
        claim.actor_kind,
        claim.actor_address[:_MAX_TEXT],
        claim.actor_agent[:_MAX_TEXT],
        None if claim.chat_user is None else claim.chat_user[:_MAX_TEXT],
        claim.token_hash,
    )
