"""The documentation holds together: every relative link of README.md and docs/*.md leads
to a file that exists (and to a heading of it, for ``#anchor``), every ``docs/*.md`` the
code names exists, the configuration reference lists exactly the keys the config model
has, and the module map of docs/design.md lists exactly the modules under src/.

Anchors are GitHub's: a heading's text without its markup, lower-cased, punctuation but
``-`` and ``_`` dropped, spaces turned into ``-``; a repeated heading gets ``-1``, ``-2``.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from sessionhook.relay.config import Config

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]

#: ``[text](target)`` and ``![alt](target)``; the text may hold brackets of code.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: ``[name]: target`` reference definitions.
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+(\S+)", re.M)
FENCE = re.compile(r"^\s*(```|~~~)")


def doc_pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked (a link or a
    heading inside code is text, not markup)."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub gives the headings of ``page``."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose_lines(page.read_text("utf-8")):
        match = re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(root: Path) -> list[str]:
    """``page: target (why)`` for every relative link of the pages under ``root`` that does
    not resolve."""
    broken: list[str] = []
    for page in doc_pages(root):
        lines = prose_lines(page.read_text("utf-8"))
        prose = "\n".join(re.sub(r"`[^`]*`", "``", line) for line in lines)
        targets = LINK.findall(prose) + REFERENCE.findall(prose)
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto: ... not ours to check
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            name = f"{page.relative_to(root)}: {target}"
            if not file.exists():
                broken.append(f"{name} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{name} (no heading with that anchor in {file.name})")
    return broken


def test_every_relative_link_of_the_docs_resolves() -> None:
    assert len(doc_pages(REPO)) > 10
    assert broken_links(REPO) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    """The check above can fail: a missing file, a missing anchor, a missing anchor in the
    page itself, a broken reference definition; links inside code are not links."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# A page\n\n## The `store.lease` key\n\n## Repeated\n\n## Repeated\n\n"
        "[ok](../README.md#read-on) [ok](#the-storelease-key) [ok](#repeated-1)\n"
        "[gone](missing.md) [bad anchor](../README.md#nowhere) [bad](#repeated-2)\n"
        "`[in code](nowhere.md)`\n\n```\n[in a block](nowhere.md)\n```\n\n"
        "[ref]: ../nothing.toml\n"
    )
    (tmp_path / "README.md").write_text("# Title\n\n## Read on\n\n[a](docs/a.md#a-page)\n")
    assert broken_links(tmp_path) == [
        "docs/a.md: missing.md (no such file)",
        "docs/a.md: ../README.md#nowhere (no heading with that anchor in README.md)",
        "docs/a.md: #repeated-2 (no heading with that anchor in a.md)",
        "docs/a.md: ../nothing.toml (no such file)",
    ]


#: An issue named by its number: history, which the git log keeps.
ISSUE = re.compile(r"\bissues?[ -]#?\d+", re.IGNORECASE)


def test_the_docs_and_the_code_name_no_issue_numbers() -> None:
    """The docs, the code, the benchmarks and the packaging say what is, not which issue
    changed it (the git log keeps that)."""
    assert all(ISSUE.search(s) for s in ("issue 20", "Issue #8", "the issue-8 profile"))
    assert ISSUE.search("an issue with 2 hosts") is None
    files = [
        *doc_pages(REPO),
        *(REPO / name for name in ("pyproject.toml", "Makefile", "config.example.toml")),
        *(
            path
            for root in ("src", "bench", "scripts", "systemd")
            for path in (REPO / root).rglob("*")
        ),
    ]
    named = [
        f"{path.relative_to(REPO)}:{number}: {match[0]}"
        for path in files
        if path.is_file() and path.suffix not in {".png", ".pyc", ".svg", ".ico"}
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if (match := ISSUE.search(line))
    ]
    assert named == []


def test_every_docs_page_the_tree_names_exists() -> None:
    """Code, tests, units and configs name pages (``docs/design.md``): each one exists."""
    named: dict[str, set[str]] = {}
    places = [REPO / "config.example.toml", REPO / ".importlinter", REPO / "pyproject.toml"]
    for folder in ("src", "tests", "bench", "systemd"):
        places += [p for p in (REPO / folder).rglob("*") if p.is_file()]
    for place in places:
        if place.suffix in {".png", ".pyc", ".svg"} or place == Path(__file__):
            continue  # not text, or the pages this file plants on purpose
        for page in re.findall(r"docs/[\w-]+\.md", place.read_text("utf-8", errors="replace")):
            named.setdefault(page, set()).add(str(place.relative_to(REPO)))
    missing = {page: sorted(where) for page, where in named.items() if not (REPO / page).is_file()}
    assert "docs/design.md" in named  # the check reads the places it means to
    assert missing == {}


# --------------------------------------------------------------------------- configuration


def _section(annotation: object) -> tuple[type[BaseModel] | None, bool]:
    """The config section inside a field's type (``X``, ``X | None``, ``tuple[X, ...]``),
    and whether it is a list of them (``[[endpoints]]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    for arg in typing.get_args(annotation):
        model, listed = _section(arg)
        if model is not None:
            return model, listed or origin is tuple
    if origin not in (None, typing.Union, types.UnionType, tuple):
        return None, False
    return None, False


def model_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, info in model.model_fields.items():
        section, listed = _section(info.annotation)
        if section is None:
            keys.add(prefix + name)
        else:
            keys |= model_keys(section, f"{prefix}{name}{'[].' if listed else '.'}")
    return keys


def documented_keys() -> set[str]:
    """The keys of the reference table of docs/configuration.md (``a.b`` / ``c`` rows name
    ``a.b`` and ``a.c``)."""
    text = (REPO / "docs/configuration.md").read_text("utf-8")
    table = text.split("\n## Reference\n", 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for row in re.findall(r"^\| (`[^|]+) \|", table, re.M):
        first, *more = re.findall(r"`([^`]+)`", row)
        prefix = first.rsplit(".", 1)[0]
        keys |= {first, *(f"{prefix}.{name}" for name in more)}
    return keys


def test_the_configuration_reference_lists_every_key_and_no_other() -> None:
    keys = model_keys(Config)
    assert {"api.base_url", "endpoints[].url", "accounts[].name", "server.listen"} <= keys
    assert documented_keys() == keys


# --------------------------------------------------------------------------- the module map


def mapped_modules() -> set[str]:
    """The ``.py`` files of the module map (docs/design.md), as paths under src/."""
    text = (REPO / "docs/design.md").read_text("utf-8")
    block = text.split("\n## Module map\n", 1)[1].split("```\n", 1)[1].split("\n```", 1)[0]
    folders: list[tuple[int, str]] = []
    found: set[str] = set()
    for line in block.splitlines():
        depth = len(line) - len(line.lstrip(" "))
        name = line.split()[0]
        folders = [(d, f) for d, f in folders if d < depth]
        if name.endswith("/") and "," not in name:
            folders.append((depth, name))
        elif name.endswith(".py"):
            found.add("".join(f for _, f in folders) + name)
    return found


@pytest.mark.parametrize("side", ["every module is on the map", "the map names no other"])
def test_the_module_map_is_the_tree(side: str) -> None:
    """Each module under src/ has its line on the map (``__init__.py`` where it holds more
    than imports), and each line names a module that exists."""
    modules = {str(p.relative_to(REPO)) for p in (REPO / "src").rglob("*.py")}
    mapped = mapped_modules()
    if side == "every module is on the map":
        assert {m for m in modules if not m.endswith("__init__.py")} - mapped == set()
    else:
        assert mapped - modules == set()
