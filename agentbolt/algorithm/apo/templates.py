"""What a prompt template's engine makes of its text: the placeholders it fills, and literal text safe to add."""

from __future__ import annotations

import re
import string
from typing import FrozenSet, Iterable

from agentbolt.types import PromptTemplate

__all__ = [
    "PlaceholderMismatchError",
    "template_placeholders",
    "check_placeholders",
    "escape_literal",
    "format_placeholders",
]

_POML_EXPRESSION = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)")


class PlaceholderMismatchError(ValueError):
    """A rewritten template does not have the placeholders of the template it replaces."""


def template_placeholders(template: PromptTemplate) -> FrozenSet[str]:
    """The names ``template.format(**task)`` reads (the root name of ``{a.b}`` / ``{a[0]}`` fields).

    Raises:
        ValueError: The text is not a valid template for its engine.
    """
    if template.engine == "f-string":
        names = set()
        for _, field, _, _ in string.Formatter().parse(template.template):
            if field is None:
                continue
            root = re.split(r"[.\[]", field, maxsplit=1)[0]
            if not root or root.isdigit():
                raise ValueError(f"f-string templates take named placeholders only, got {{{field}}}")
            names.add(root)
        return frozenset(names)
    if template.engine == "jinja":
        import jinja2
        import jinja2.meta

        environment = jinja2.Environment()
        try:
            return frozenset(jinja2.meta.find_undeclared_variables(environment.parse(template.template)))
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"invalid jinja template: {exc}") from exc
    return frozenset(_POML_EXPRESSION.findall(template.template))


def format_placeholders(names: Iterable[str], engine: str) -> str:
    """``names`` written as placeholders of ``engine`` (what the optimizer model is told to keep), sorted.

    ``{name}`` for f-string templates, ``{{ name }}`` for jinja and POML ones; ``(none)`` when there are none.
    """
    pattern = "{%s}" if engine == "f-string" else "{{ %s }}"
    return ", ".join(pattern % name for name in sorted(names)) or "(none)"


def check_placeholders(candidate: PromptTemplate, required: FrozenSet[str]) -> None:
    """Check that ``candidate`` fills exactly the ``required`` placeholders.

    Raises:
        PlaceholderMismatchError: Some are missing or new ones appeared (the message names them), or the candidate
            is not a valid template for its engine.
    """
    try:
        found = template_placeholders(candidate)
    except ValueError as exc:
        raise PlaceholderMismatchError(str(exc)) from exc
    missing, extra = sorted(required - found), sorted(found - required)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"dropped {missing}")
        if extra:
            parts.append(f"added unknown {extra}")
        raise PlaceholderMismatchError("the rewritten template " + " and ".join(parts))


def escape_literal(text: str, engine: str) -> str:
    """``text`` written so that the engine reproduces it verbatim (no placeholder inside it is filled)."""
    if engine == "f-string":
        return text.replace("{", "{{").replace("}", "}}")
    if engine == "jinja":
        return "{% raw %}" + text.replace("{% endraw %}", "{% endraw %}{{ '{% endraw %}' }}{% raw %}") + "{% endraw %}"
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("{{", "{ {")
