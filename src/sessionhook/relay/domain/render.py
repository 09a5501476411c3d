"""What one endpoint receives for one event: payload mode, format, template (pure).

:func:`render` is the single place that turns an event's stored body into the bytes an
endpoint is sent, deterministic (no clock, no randomness): the dispatcher calls it once per
delivery and every retry sends the same bytes. Formats other than ``standard`` are Jinja2
templates in the sandbox of :mod:`.template_sandbox` (a step and a size budget per render);
a JSON content type must render to valid JSON, re-serialized compactly. What a template
sees and its filters: docs/events.md. :class:`RenderError`: a template that does not
compile, fails, goes over a budget or gives no JSON; :func:`check_shape` renders a shape
against the sample events so that a broken template is refused before it is used.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import jinja2

from . import chat_markup
from .template_meter import SIZE_BUDGET, SIZE_PER_BYTE, STEP_BUDGET, OverBudget, metered
from .template_sandbox import Sandbox

STANDARD_CONTENT_TYPE = "application/json"
CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"

#: Formats shipped as templates (name -> content type).
PRESET_FORMATS: dict[str, str] = {
    "cloudevents": CLOUDEVENTS_CONTENT_TYPE,
    "slack": STANDARD_CONTENT_TYPE,
    "discord": STANDARD_CONTENT_TYPE,
    "google_chat": STANDARD_CONTENT_TYPE,
    "teams": STANDARD_CONTENT_TYPE,
}
FORMATS: tuple[str, ...] = ("standard", *PRESET_FORMATS)
#: The action links a preset may show, in button order, and the longest one it shows.
LINK_NAMES: tuple[str, ...] = ("approve", "reply", "open")
MAX_LINK = 1000


class RenderError(Exception):
    """A template failed: it does not compile, raised while rendering, or gave no JSON."""


@dataclass(frozen=True, slots=True)
class Shape:
    """How one endpoint wants its events: ``payload`` (``full``/``thin``), ``format`` (one of
    :data:`FORMATS`), or a user ``template`` with its ``content_type``. ``public_url``:
    the relay's public base URL; action links under it become buttons (``None``: none do)."""

    payload: str = "full"
    format: str = "standard"
    template: str | None = None
    content_type: str = STANDARD_CONTENT_TYPE
    public_url: str | None = None

    @property
    def is_standard(self) -> bool:
        """Whether the stored body goes out untouched."""
        return self.payload == "full" and self.format == "standard" and self.template is None


def render(
    event_id: str, body: bytes, shape: Shape, *, steps: int = STEP_BUDGET
) -> tuple[bytes, str]:
    """The bytes and content type ``shape`` makes of an event (id = ``webhook-id``); a
    template may take at most ``steps`` steps and make at most :data:`SIZE_BUDGET`
    characters plus :data:`SIZE_PER_BYTE` per byte of ``body``."""
    if shape.is_standard:
        return body, STANDARD_CONTENT_TYPE
    payload: dict[str, Any] = json.loads(body)
    if shape.payload == "thin":
        payload = thin_payload(payload)
    if shape.template is not None:
        template, content_type = _compile(shape.template), shape.content_type
    elif shape.format != "standard":
        template, content_type = _preset(shape.format), PRESET_FORMATS[shape.format]
    else:
        return _dumps(payload), STANDARD_CONTENT_TYPE
    data = _data_of(payload)
    context = {
        "event": payload,
        "type": payload.get("type", ""),
        "timestamp": payload.get("timestamp", ""),
        "data": data,
        "session": data.get("session") or {},
        "webhook_id": event_id,
        "links": action_links(data, shape.public_url),
    }
    try:
        with metered(steps, SIZE_BUDGET + SIZE_PER_BYTE * len(body)):
            text = template.render(context)
    except OverBudget as exc:
        raise RenderError(f"{exc} on {payload.get('type')}") from None
    except MemoryError:
        raise RenderError(f"template over its memory budget on {payload.get('type')}") from None
    except Exception as exc:  # a user's template may raise anything Jinja2 can
        raise RenderError(f"template failed on {payload.get('type')}: {exc}") from exc
    if _is_json(content_type):
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise RenderError(
                f"template gave no valid JSON for {payload.get('type')}: {exc}"
            ) from exc
        return _dumps(parsed), content_type
    return text.encode("utf-8"), content_type


def thin_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The thin form: ``type``, ``timestamp`` and in ``data`` the session summary (no
    prompt, no outputs), the activity's ``name, id, createTime, originator`` and, when the
    event has them, ``account``, ``previous_state``, ``action``, ``activity_name``,
    ``sample`` and the pull request's ``url`` and ``title``. No artifacts, no media, no
    plan, no message text."""
    data = _data_of(payload)
    thin: dict[str, Any] = {}
    session = data.get("session")
    if isinstance(session, dict):
        thin["session"] = {k: v for k, v in session.items() if k not in ("prompt", "outputs")}
    activity = data.get("activity")
    if isinstance(activity, dict):
        keys = ("name", "id", "createTime", "originator")
        thin["activity"] = {k: activity[k] for k in keys if k in activity}
    for key in ("account", "previous_state", "action", "activity_name", "sample"):
        if key in data:
            thin[key] = data[key]
    pull = data.get("pull_request")
    if isinstance(pull, dict):
        thin["pull_request"] = {k: pull[k] for k in ("url", "title") if k in pull}
    return {"type": payload.get("type"), "timestamp": payload.get("timestamp"), "data": thin}


def action_links(data: dict[str, Any], public_url: str | None) -> dict[str, dict[str, str]]:
    """The action links of an event's ``data`` that may become buttons: ``approve``,
    ``reply`` and ``open`` from ``data.links``, each ``{"url", "token"}`` (``token``:
    the URL's last path segment, what a Slack app gets back as the button's ``value``).

    A link counts only if :func:`.chat_markup.http_url` accepts it, it is at most
    :data:`MAX_LINK` characters, and it lies under ``public_url`` (its scheme and host
    compared without case, then its path): the event body is stored data, and a button must
    never lead anywhere but to the relay. No ``public_url``: no links."""
    if not public_url:
        return {}
    links = data.get("links")
    if not isinstance(links, dict):
        return {}
    base = public_url.rstrip("/") + "/"
    scheme_host = re.match(r"[^/]*//[^/]*/", base)
    cut = scheme_host.end() if scheme_host else len(base)
    found: dict[str, dict[str, str]] = {}
    for name in LINK_NAMES:
        url = chat_markup.http_url(links.get(name))
        if not url or len(url) > MAX_LINK:
            continue
        if url[:cut].lower() != base[:cut].lower() or not url[cut:].startswith(base[cut:]):
            continue
        path = re.split(r"[?#]", url[cut:], maxsplit=1)[0]
        found[name] = {"url": url, "token": path.rstrip("/").rsplit("/", 1)[-1]}
    return found


def check_shape(shape: Shape, samples: list[tuple[str, bytes]]) -> None:
    """Render ``shape`` against sample events; raises :class:`RenderError` on the first
    failure (for config loading: a broken template is refused at start-up)."""
    if shape.template is not None:
        _compile(shape.template)
    for event_id, body in samples:
        render(event_id, body, shape)


# --------------------------------------------------------------------------- templates


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _load_preset(name: str) -> str | None:
    try:
        return (resources.files(__package__) / "templates" / name).read_text("utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return None


@functools.cache
def _environment() -> Sandbox:
    return Sandbox(
        loader=jinja2.FunctionLoader(_load_preset),
        undefined=jinja2.ChainableUndefined,
        autoescape=False,  # JSON is escaped by tojson; chat text by each service's filter
        keep_trailing_newline=False,
        filters={
            "tojson": _tojson,
            "mrkdwn": chat_markup.mrkdwn,
            "markdown": chat_markup.markdown,
            "http_url": chat_markup.http_url,
            "mrkdwn_link": chat_markup.mrkdwn_link,
        },
    )


@functools.lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateError as exc:
        raise RenderError(f"template does not compile: {exc}") from exc


@functools.cache
def _preset(name: str) -> jinja2.Template:
    try:
        return _environment().get_template(f"{name}.json.j2")
    except jinja2.TemplateError as exc:  # pragma: no cover - shipped templates are tested
        raise RenderError(f"preset {name} does not compile: {exc}") from exc


def _data_of(payload: dict[str, Any]) -> dict[str, Any]:
    data = payload.get("data")
    return data if isinstance(data, dict) else {}


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _is_json(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")
