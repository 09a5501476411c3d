"""The actions people took (relay/store/actions.py), on both backends: a token or a wait is
taken once; a refused call frees it; the list pages back by id."""

from __future__ import annotations

import pytest

from sessionhook.relay.store.actions import ActionClaim
from tests.support.backends import Backend

pytestmark = pytest.mark.app


def claim(token: str, wait: str = "sessions/1/activities/a", **kw: object) -> ActionClaim:
    fields: dict[str, object] = {
        "taken_at": 100.0,
        "session": "sessions/1",
        "wait": wait,
        "action": "approve_plan",
        "account": "default",
        "actor_kind": "link",
        "actor_address": "127.0.0.1",
        "actor_agent": "ua " + "x" * 1000,
        "chat_user": None,
        "token_hash": token,
    }
    fields.update(kw)
    return ActionClaim(**fields)  # type: ignore[arg-type]


def test_a_token_and_a_wait_are_taken_once(backend: Backend) -> None:
    with backend.open() as store:
        actions = store.actions
        first = actions.claim_action(claim("t1"))
        assert first is not None
        assert actions.claim_action(claim("t1", wait="other")) is None  # the token again
        assert actions.claim_action(claim("t2")) is None  # another token, the same wait
        taken = actions.action_taken("t2", "sessions/1", "sessions/1/activities/a")
        assert taken is not None and taken.id == first and taken.result == "pending"
        actions.finish_action(first, False, 502, "upstream failed")
        # refused upstream: the person may try again with the same link
        again = actions.claim_action(claim("t1"))
        assert again is not None
        actions.finish_action(again, True, 200, "plan approved")
        assert actions.claim_action(claim("t1")) is None
        other = actions.claim_action(claim("t3", wait="sessions/1/activities/b", chat_user="U1"))
        assert other is not None
        rows = actions.list_actions()
        assert [r.id for r in rows] == [other, again, first]
        assert [r.result for r in rows] == ["pending", "ok", "failed"]
        assert rows[1].status == 200 and rows[1].detail == "plan approved"
        assert rows[0].chat_user == "U1" and len(rows[0].actor_agent) == 512
        assert [r.id for r in actions.list_actions(before=other, limit=1)] == [again]
        assert actions.list_actions(session="sessions/2") == []
