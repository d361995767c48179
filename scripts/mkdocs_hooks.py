"""MkDocs hooks of the documentation site (``mkdocs.yml``).

* Pages whose whole text is ``<!-- include: FILE -->`` show FILE of the repository root (the README is the home
  page, the CHANGELOG the changelog), with links into docs/ made relative to the site.
* Every object an API reference page renders (``::: dotted.path``), and its public functions, classes and methods,
  must have a docstring: a missing one is a warning, which ``mkdocs build --strict`` turns into an error.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterator, List

REPO = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r"^\s*<!--\s*include:\s*(?P<file>[\w./-]+)\s*-->\s*$")
REFERENCE_TARGET = re.compile(r"^:::\s*(?P<path>[\w.]+)\s*$", re.MULTILINE)
DOCS = REPO / "docs"
# Files outside docs/ that the site shows on a page of their own (through an include).
INCLUDED_AS = {
    "README.md": "index.md",
    "CHANGELOG.md": "changelog.md",
    "examples/flow_grpo/README.md": "examples/flow-grpo.md",
    "examples/apo/README.md": "examples/apo.md",
    "examples/azure/README.md": "examples/azure.md",
    "examples/calc/README.md": "examples/calc.md",
    "examples/chartqa/README.md": "examples/chartqa.md",
    "examples/claude_code/README.md": "examples/claude-code.md",
    "examples/minimal/README.md": "examples/minimal.md",
    "examples/rag/README.md": "examples/rag.md",
    "examples/search_r1/README.md": "examples/search-r1.md",
    "examples/sft/README.md": "examples/sft.md",
    "examples/sql/README.md": "examples/sql.md",
    "examples/tinker/README.md": "examples/tinker.md",
}

log = logging.getLogger("mkdocs.hooks.agentbolt")


def _site_links(markdown: str, source: Path, page: Path) -> str:
    """Links of ``source`` (a repository file) rewritten for the site page ``page`` (a path under docs/)."""

    def relink(match: re.Match[str]) -> str:
        target, _, anchor = match["target"].partition("#")
        resolved = (source.parent / target).resolve()
        relative = resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else None
        if relative in INCLUDED_AS:
            resolved = DOCS / INCLUDED_AS[relative]
        if not resolved.is_relative_to(DOCS):
            return match.group(0)  # mkdocs reports it: a link to a file the site does not have
        link = os.path.relpath(resolved, page.parent).replace(os.sep, "/")
        return f"]({link}{'#' + anchor if anchor else ''})"

    return re.sub(r"\]\((?P<target>(?!https?:|#|mailto:)[^)\s]+)\)", relink, markdown)


@functools.lru_cache(maxsize=1)
def _package() -> Any:
    import griffe

    # As mkdocstrings loads it (mkdocs.yml): an override without a docstring inherits the overridden method's.
    extensions = griffe.load_extensions("griffe_inherited_docstrings")
    return griffe.load("agentbolt", search_paths=[str(REPO)], docstring_parser="google", extensions=extensions)


def _public(obj: Any) -> Iterator[Any]:
    """``obj`` and the public functions and classes it defines (for a class, its own methods)."""
    yield obj
    names: List[str]
    exported = obj.exports if obj.is_module else None
    names = list(exported) if exported else [name for name in obj.members if not name.startswith("_")]
    for name in names:
        member = obj.members.get(name)
        if member is None or member.is_alias or member.name.startswith("_"):
            continue
        if member.is_function or member.is_class:
            yield member
            if member.is_class:
                yield from (
                    method
                    for method_name, method in member.members.items()
                    if not method_name.startswith("_") and not method.is_alias and method.is_function
                )


def _missing_docstrings(path: str) -> List[str]:
    target = _package()[path.removeprefix("agentbolt.")] if path != "agentbolt" else _package()
    if target.is_alias:
        target = target.final_target
    return [obj.path for obj in _public(target) if not obj.docstring or not obj.docstring.value.strip()]


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Include the repository files pages ask for; report reference targets without docstrings."""
    include = INCLUDE.match(markdown)
    if include:
        source = REPO / include["file"]
        return _site_links(source.read_text(), source, DOCS / page.file.src_path)
    for match in REFERENCE_TARGET.finditer(markdown):
        for missing in _missing_docstrings(match["path"]):
            log.warning("%s: %s has no docstring", page.file.src_path, missing)
    return markdown
