"""How the Sessions API's objects read in a terminal: the tables and field lists of
``sessionhook sessions|activities|sources`` (``--json`` prints the wire JSON instead).

Pure formatting of the API's models; upstream text is shown as text (a terminal table has no
markup to escape).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._output import render_fields, render_table

if TYPE_CHECKING:
    from ..api.models import Activity, Artifact, Session, Source


def when(timestamp: str) -> str:
    """A timestamp for people: RFC 3339 to the second, UTC (``2026-11-22T12:00:03Z``)."""
    if not timestamp:
        return ""
    # Lazy like the whole client (pydantic): `--help` and usage errors never load it.
    from ..api.models import parse_timestamp

    try:
        return parse_timestamp(timestamp).strftime("%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return timestamp


def session_rows(items: Sequence[Session]) -> list[tuple[str, ...]]:
    """ID, state, last update and title of each session."""
    return [(s.session_id, s.state, when(s.update_time), s.title) for s in items]


def session_table(items: Sequence[Session]) -> str:
    """Sessions as a table (``no sessions`` when there are none)."""
    if not items:
        return "no sessions"
    return render_table(("ID", "STATE", "UPDATED", "TITLE"), session_rows(items))


def session_details(session: Session) -> str:
    """One session, field by field."""
    context = session.source_context
    branch = (
        context.host_repo_context.starting_branch if context and context.host_repo_context else ""
    )
    return render_fields(
        [
            ("name", session.name),
            ("title", session.title),
            ("state", session.state),
            ("url", session.url),
            ("created", when(session.create_time)),
            ("updated", when(session.update_time)),
            ("source", context.source if context else ""),
            ("branch", branch),
            ("working branch", (context.working_branch or "") if context else ""),
            ("archived", "yes" if session.archived else ""),
            ("automation", session.automation_mode),
            ("plan approval", "required" if session.require_plan_approval else ""),
            ("pull requests", "\n".join(pr.url for pr in session.pull_requests)),
            ("prompt", session.prompt),
        ]
    )


def event_summary(activity: Activity) -> tuple[str, str]:
    """(kind, one-line summary) of an activity, also for unknown or missing members."""
    if activity.plan_generated is not None:
        steps = activity.plan_generated.plan.steps
        return "planGenerated", f"plan of {len(steps)} step(s)"
    if activity.plan_approved is not None:
        plan_id = activity.plan_approved.plan_id
        return "planApproved", f"plan {plan_id} approved" if plan_id else "plan approved"
    if activity.user_messaged is not None:
        return "userMessaged", activity.user_messaged.user_message
    if activity.agent_messaged is not None:
        return "agentMessaged", activity.agent_messaged.agent_message
    if activity.progress_updated is not None:
        update = activity.progress_updated
        return "progressUpdated", " - ".join(t for t in (update.title, update.description) if t)
    if activity.session_completed is not None:
        return "sessionCompleted", activity.description or "session completed"
    if activity.session_failed is not None:
        return "sessionFailed", activity.session_failed.reason or activity.description
    unknown = activity.unknown_members
    return (unknown[0] if unknown else "-"), activity.description


def artifact_summary(artifact: Artifact) -> str:
    """One line about an artifact: a change set, a command's output or a media file."""
    if artifact.change_set is not None:
        patch = artifact.change_set.git_patch
        lines = len(patch.unidiff_patch.splitlines()) if patch else 0
        message = (
            patch.suggested_commit_message.splitlines()[0]
            if patch and patch.suggested_commit_message
            else ""
        )
        return f"change set on {artifact.change_set.source or '-'}: {lines} diff line(s)" + (
            f", commit message: {message}" if message else ""
        )
    if artifact.bash_output is not None:
        out = artifact.bash_output
        return f"$ {out.command} (exit {out.exit_code}, {len(out.output)} chars of output)"
    if artifact.media is not None:
        return f"media {artifact.media.mime_type or '?'} ({len(artifact.media.data)} base64 chars)"
    return "artifact of an unknown kind"


def activity_table(items: Sequence[Activity]) -> str:
    """Activities as a table: id, time, originator, event and a summary."""
    if not items:
        return "no activities"
    rows = []
    for activity in items:
        kind, summary = event_summary(activity)
        if activity.artifacts:
            summary = f"{summary} [+{len(activity.artifacts)} artifact(s)]".strip()
        ident = activity.id or activity.name.rsplit("/", 1)[-1]
        rows.append((ident, when(activity.create_time), activity.originator, kind, summary))
    return render_table(("ID", "CREATED", "BY", "EVENT", "SUMMARY"), rows)


def activity_details(activity: Activity) -> str:
    """One activity, field by field, its plan and artifacts included."""
    kind, summary = event_summary(activity)
    plan = activity.plan_generated.plan if activity.plan_generated else None
    steps = "\n".join(f"{step.index + 1}. {step.title}" for step in plan.steps) if plan else ""
    return render_fields(
        [
            ("name", activity.name),
            ("created", when(activity.create_time)),
            ("by", activity.originator),
            ("event", kind),
            ("summary", summary),
            ("description", activity.description if activity.description != summary else ""),
            ("plan", steps),
            ("artifacts", "\n".join(artifact_summary(a) for a in activity.artifacts)),
        ]
    )


def source_table(items: Sequence[Source]) -> str:
    """Sources as a table; columns no list item fills are left out."""
    if not items:
        return "no sources"
    rows = []
    for source in items:
        repo = source.host_repo
        # List items may leave out privacy and branches (spec 2.7): blank, not "no".
        private = ""
        if repo is not None and "isPrivate" in repo.to_wire():
            private = "yes" if repo.is_private else "no"
        default = repo.default_branch.display_name if repo and repo.default_branch else ""
        rows.append((source.name, f"{repo.owner}/{repo.repo}" if repo else "", private, default))
    headers = ("NAME", "REPOSITORY", "PRIVATE", "DEFAULT BRANCH")
    # Columns no row fills (what list items omit) are left out rather than shown blank.
    keep = [i for i in range(len(headers)) if i < 2 or any(row[i] for row in rows)]
    return render_table([headers[i] for i in keep], [[row[i] for i in keep] for row in rows])


def source_details(source: Source) -> str:
    """One source, field by field, its branches included."""
    repo = source.host_repo
    return render_fields(
        [
            ("name", source.name),
            ("repository", f"{repo.owner}/{repo.repo}" if repo else ""),
            ("private", ("yes" if repo.is_private else "no") if repo else ""),
            (
                "default branch",
                repo.default_branch.display_name if repo and repo.default_branch else "",
            ),
            ("branches", "\n".join(b.display_name for b in repo.branches) if repo else ""),
        ]
    )
