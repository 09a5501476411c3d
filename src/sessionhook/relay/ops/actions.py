"""Acting on a signed action link: what its page shows (:func:`look`) and doing what it says
(:func:`perform`), shared by the pages behind the links and Slack's buttons.

:func:`perform` verifies the token (:mod:`~sessionhook.relay.domain.action_links`), checks
that the session still waits for the wait the link answers (the archived session's state,
and its newest ``planGenerated`` / ``agentMessaged`` activity is that wait), takes the link
and the wait in the store (a ``pending`` row of ``actions_taken``: a second click, a second
link of the same wait, finds it taken), makes the upstream call with the session's account
(:data:`~sessionhook.relay.domain.actions.UpstreamAct`), records the answer and returns it.
Anything wrong before the call (see :data:`REFUSALS`) returns without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from sessionhook.api.models import Activity

from ..domain.action_links import (
    SAMPLE_ACCOUNT,
    LinkClaims,
    LinkError,
    token_digest,
    verify_link,
)
from ..domain.actions import ActionKind, ActOutcome, UpstreamAct
from ..domain.samples import SAMPLE_TITLE, sample_activity
from ..store import ActionQueries, AsyncStore, StoreCore, store_failures
from ..store.actions import ActionClaim
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics

_log = get_logger()

#: A reply longer than this is refused before anything is sent.
MAX_REPLY_CHARS: Final = 16_000

#: Why nothing was done, in a sentence a person reads on the page (the key is
#: :attr:`Performed.reason`, a metric label).
REFUSALS: Final[dict[str, str]] = {
    "malformed": "This link is not a link of this relay (it is incomplete or altered).",
    "bad signature": "This link was altered, or its key was replaced: it gives nothing.",
    "expired": "This link has expired.",
    "used": "This link was used already.",
    "answered": "The session no longer waits for this: it was answered or it moved on.",
    "wrong session": "This link does not belong to this session.",
    "unknown session": "This relay does not know the session of this link.",
    "empty reply": "A reply needs some text.",
    "reply too long": f"A reply is at most {MAX_REPLY_CHARS:,} characters.",
    "sample": "This link came with a sample event (sessionhook trigger): it works as a real "
    "link does, but nothing was sent to the service.",
    "not waiting": "The session does not wait for this now.",
}
#: What a sample link's page says above its form.
SAMPLE_NOTICE: Final = (
    "This is a sample (sessionhook trigger): the page works as a real one, and nothing you "
    "do here is sent to the service."
)

#: What each action answers: the state the session waits in, the activity that opened it.
_WAITS: Final[dict[ActionKind, tuple[str, str]]] = {
    "approve_plan": ("AWAITING_PLAN_APPROVAL", "planGenerated"),
    "reply": ("AWAITING_USER_FEEDBACK", "agentMessaged"),
}


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: through a ``link`` page, a ``slack`` button, the ``console``, the
    management ``api`` or an ``mcp`` tool; the client's address and user agent; the chat
    user when the chat service says who clicked."""

    kind: Literal["link", "slack", "console", "api", "mcp"]
    address: str
    user_agent: str
    chat_user: str | None = None


@dataclass(frozen=True, slots=True)
class Performed:
    """How it went: ``ok`` when the service accepted the action; ``reason`` is ``done``,
    ``upstream failed`` or a key of :data:`REFUSALS`; ``outcome`` the service's answer
    (``None`` when no call was made)."""

    ok: bool
    reason: str
    outcome: ActOutcome | None


@dataclass(frozen=True, slots=True)
class Looked:
    """What a link's page shows: ``claims`` when the token is good (else ``None``);
    ``problem``: a key of :data:`REFUSALS` when the link can do nothing now; the session's
    ``title``; the wait's activity (the plan's steps, the question), when archived."""

    claims: LinkClaims | None
    problem: str | None
    title: str = ""
    activity: Activity | None = None

    @property
    def sample(self) -> bool:
        """Whether the link came with a sample event: its page acts on nothing upstream."""
        return self.claims is not None and self.claims.account == SAMPLE_ACCOUNT


def _wait_of(core: StoreCore, claims: LinkClaims) -> tuple[str | None, str, Activity | None]:
    """(problem, session title, the newest activity of the awaited kind) in the store."""
    row = core.ingest.get_session(claims.session)
    if row is None:
        return "unknown session", "", None
    if core.ingest.session_account(claims.session) != claims.account:
        return "wrong session", "", None
    if claims.wait and not claims.wait.startswith(claims.session + "/activities/"):
        return "wrong session", row.title, None
    state, member = _WAITS[claims.action]
    latest = core.ingest.latest_activity(claims.session, member)
    if row.state != state or (latest.name if latest is not None else "") != claims.wait:
        return "answered", row.title, latest
    return None, row.title, latest


async def look(store: AsyncStore, keys: Sequence[bytes], token: str, *, now: float) -> Looked:
    """What the page of ``token`` shows (reads only: a GET never changes anything)."""
    try:
        claims = verify_link(keys, token, now)
    except LinkError as exc:
        return Looked(None, exc.reason)
    if claims.account == SAMPLE_ACCOUNT:
        return await _look_sample(store, claims)
    problem, title, activity = await store.run(_wait_of, claims)
    digest = token_digest(token)
    taken = await store.run(ActionQueries.action_taken, digest, claims.session, claims.wait)
    if taken is not None and taken.token_hash == digest:
        problem = "used"  # said first: the session moved on because of it
    elif taken is not None and problem is None:
        problem = "answered"
    return Looked(claims, problem, title, activity)


def _sample_wait(core: StoreCore, claims: LinkClaims) -> tuple[str, Activity | None] | None:
    """(title, newest awaited activity) of an archived session a sample was made from."""
    row = core.ingest.get_session(claims.session)
    if row is None:
        return None
    return row.title, core.ingest.latest_activity(claims.session, _WAITS[claims.action][1])


async def _look_sample(store: AsyncStore, claims: LinkClaims) -> Looked:
    """A sample link's page: the archived session's title and wait when the sample was made
    from an archived session (``trigger --session``), else the sample's own."""
    member = _WAITS[claims.action][1]
    archived = await store.run(_sample_wait, claims)
    if archived is not None:
        title, latest = archived
        return Looked(claims, None, title, latest or sample_activity(member))
    return Looked(claims, None, SAMPLE_TITLE, sample_activity(member))


async def perform(
    store: AsyncStore,
    act: UpstreamAct,
    keys: Sequence[bytes],
    token: str,
    *,
    actor: Actor,
    text: str | None,
    now: float,
    metrics: Metrics | None = None,
) -> Performed:
    """Do what ``token`` allows, once (see the module docstring); ``text`` is the reply
    (ignored for a plan). ``metrics`` counts it (``actions_total``) when given."""

    def told(action: str, performed: Performed) -> Performed:
        if metrics is not None:
            metrics.action_asked(action, performed.reason)
        return performed

    looked = await look(store, keys, token, now=now)
    claims = looked.claims
    if looked.sample:  # never an upstream call, never a record of an action
        assert claims is not None
        return told(claims.action, Performed(False, "sample", None))
    if claims is None or looked.problem is not None:
        action = claims.action if claims is not None else "unknown"
        return told(action, Performed(False, looked.problem or "malformed", None))
    reply: str | None = None
    if claims.action == "reply":
        if text is None or not text.strip():
            return told(claims.action, Performed(False, "empty reply", None))
        if len(text) > MAX_REPLY_CHARS:
            return told(claims.action, Performed(False, "reply too long", None))
        reply = text
    digest = token_digest(token)
    claim = _claim(claims.session, claims.wait, claims.action, claims.account, actor, digest, now)
    action_id = await store.run(ActionQueries.claim_action, claim)
    if action_id is None:  # taken between the look and now: another click won
        taken = await store.run(ActionQueries.action_taken, digest, claims.session, claims.wait)
        used = taken is not None and taken.token_hash == digest
        return told(claims.action, Performed(False, "used" if used else "answered", None))
    try:
        outcome = await act(claims.session, claims.action, reply)
    except Exception:  # the act never raises for the service's answer; anything else
        # frees the link (failed) rather than leaving it pending for good
        await store.run(
            ActionQueries.finish_action, action_id, False, None, "the relay failed to act"
        )
        raise
    await store.run(
        ActionQueries.finish_action, action_id, outcome.ok, outcome.status, outcome.detail
    )
    done = Performed(outcome.ok, "done" if outcome.ok else "upstream failed", outcome)
    return told(claims.action, done)


def _checked_wait(core: StoreCore, session: str, action: ActionKind) -> tuple[str | None, str, str]:
    """(problem, account, the wait): the session must be archived, in the state ``action``
    answers, with the activity that opened that wait archived."""
    row = core.ingest.get_session(session)
    if row is None:
        return "unknown session", "", ""
    state, member = _WAITS[action]
    latest = core.ingest.latest_activity(session, member)
    if row.state != state or latest is None:
        return "not waiting", "", ""
    return None, core.ingest.session_account(session) or "", latest.name


async def perform_once(
    store: AsyncStore,
    act: UpstreamAct,
    session: str,
    action: ActionKind,
    text: str | None,
    *,
    actor: Actor,
    now: float,
    metrics: Metrics | None = None,
) -> Performed:
    """Act on ``session``'s open wait without a link (the MCP tools), once: the session
    must wait for ``action`` now (:func:`_checked_wait`), the wait is taken in the store as
    a link's is (a second call, or a link of the same wait, finds it taken: ``answered``),
    then the call is made and its answer recorded. ``text`` is the reply."""

    def told(performed: Performed) -> Performed:
        if metrics is not None:
            metrics.action_asked(action, performed.reason)
        return performed

    reply: str | None = None
    if action == "reply":
        if text is None or not text.strip():
            return told(Performed(False, "empty reply", None))
        if len(text) > MAX_REPLY_CHARS:
            return told(Performed(False, "reply too long", None))
        reply = text
    problem, account, wait = await store.run(_checked_wait, session, action)
    if problem is not None:
        return told(Performed(False, problem, None))
    claim = _claim(session, wait, action, account, actor, "", now)
    action_id = await store.run(ActionQueries.claim_action, claim)
    if action_id is None:
        return told(Performed(False, "answered", None))
    try:
        outcome = await act(session, action, reply)
    except Exception:  # as in perform: the wait is freed rather than left pending
        await store.run(
            ActionQueries.finish_action, action_id, False, None, "the relay failed to act"
        )
        raise
    await store.run(
        ActionQueries.finish_action, action_id, outcome.ok, outcome.status, outcome.detail
    )
    return told(Performed(outcome.ok, "done" if outcome.ok else "upstream failed", outcome))


def _open_wait(core: StoreCore, session: str, action: ActionKind) -> tuple[str, str]:
    """(account, the name of the newest activity of the kind ``action`` answers, or "")."""
    account = core.ingest.session_account(session) or ""
    latest = core.ingest.latest_activity(session, _WAITS[action][1])
    return account, latest.name if latest is not None else ""


async def record_direct(
    store: AsyncStore,
    session: str,
    action: ActionKind,
    outcome: ActOutcome,
    *,
    actor: Actor,
    now: float,
    metrics: Metrics | None = None,
) -> None:
    """Record an action made without a link (the console's forms, the API) once the
    service answered: it shows beside the links' actions, and an accepted one answers
    its wait for the links too (they then say so and make no call). ``metrics`` counts
    it (``actions_total``, result ``done`` or ``upstream failed``) when given.

    The action is made already: a store that cannot record it (a full disk, PostgreSQL
    away) is an error line naming it, never a failure of the action it answers."""
    if metrics is not None:
        metrics.action_asked(action, "done" if outcome.ok else "upstream failed")
    try:
        account, wait = await store.run(_open_wait, session, action)
        claim = _claim(session, wait, action, account, actor, "", now)
        await store.run(
            ActionQueries.record_action, claim, outcome.ok, outcome.status, outcome.detail
        )
    except store_failures() as exc:
        _log.error(
            "actions.not_recorded",
            session=session,
            action=action,
            actor=actor.kind,
            ok=outcome.ok,
            error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )


def _claim(
    session: str, wait: str, action: str, account: str, actor: Actor, token_hash: str, now: float
) -> ActionClaim:
    return ActionClaim(
        taken_at=now,
        session=session,
        wait=wait,
        action=action,
        account=account,
        actor_kind=actor.kind,
        actor_address=actor.address,
        actor_agent=actor.user_agent,
        chat_user=actor.chat_user,
        token_hash=token_hash,
    )
