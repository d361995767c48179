"""What a prompt template's engine makes of its text: the placeholders it fills, and literal text safe to add."""

from __future__ import annotations

import json
import re
import string
from html.parser import HTMLParser
from typing import FrozenSet, Iterable, List, Optional, Tuple

from agentbolt.types import PromptTemplate

__all__ = [
    "PlaceholderMismatchError",
    "template_placeholders",
    "check_placeholders",
    "escape_literal",
    "format_placeholders",
    "unsafe_constructs",
]

_POML_EXPRESSION = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)")
_POML_WHOLE_EXPRESSION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class PlaceholderMismatchError(ValueError):
    """A rewritten template does not have the placeholders of the template it replaces, or writes them with
    constructs that reach beyond the values filled in (see :func:`unsafe_constructs`)."""


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


class _MarkupAttributes(HTMLParser):
    """The attributes of every start tag of a POML document, each written ``<tag name='value'>``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: List[str] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        self.found.extend(f"<{tag} {name}={value!r}>" for name, value in attrs)


def _unsafe_jinja(text: str) -> List[str]:
    import jinja2
    from jinja2 import nodes

    try:
        tree = jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"invalid jinja template: {exc}") from exc
    found = []
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        name = node.attr if isinstance(node, nodes.Getattr) else getattr(node.arg, "value", None)
        if isinstance(name, str) and name.startswith("_"):
            found.append(f"the attribute {name!r}")
    loaders = {
        nodes.Include: "include",
        nodes.Import: "import",
        nodes.FromImport: "from ... import",
        nodes.Extends: "extends",
    }
    for node in tree.find_all(tuple(loaders)):
        found.append(f"the {loaders[type(node)]} tag")
    return found


def unsafe_constructs(template: PromptTemplate) -> List[str]:
    """What in ``template`` reaches beyond the plain values of its placeholders, each described once, in order.

    * ``f-string``: a field with a conversion (``{a!r}``), a format spec (``{a:d}``), an attribute (``{a.b}``) or
      an index (``{a[0]}``). ``str.format`` looks attributes and items up on the values, so a template written by
      a model could read any attribute reachable from them; a format spec fails on values it does not fit.
    * ``jinja``: an attribute or item whose name starts with ``_``, and ``include`` / ``import`` / ``extends``
      tags (the renderer is sandboxed and has no loader: these only fail at render time).
    * ``poml``: an expression other than a bare name (POML evaluates ``{{ ... }}`` as JavaScript in its renderer
      process) and every markup attribute (``if`` and ``for`` are expressions too; ``src`` reads files).

    Raises:
        ValueError: The text is not a valid template for its engine.
    """
    found: List[str] = []
    if template.engine == "f-string":
        for _, field, spec, conversion in string.Formatter().parse(template.template):
            if field is None:
                continue
            if conversion or spec or "." in field or "[" in field:
                written = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                found.append(written)
    elif template.engine == "jinja":
        found = _unsafe_jinja(template.template)
    else:
        for expression in _POML_WHOLE_EXPRESSION.findall(template.template):
            if not _IDENTIFIER.fullmatch(expression.strip()):
                found.append("{{" + expression + "}}")
        parser = _MarkupAttributes()
        parser.feed(template.template)
        parser.close()
        found.extend(parser.found)
    return list(dict.fromkeys(found))


def check_placeholders(
    candidate: PromptTemplate, required: FrozenSet[str], *, seed: Optional[PromptTemplate] = None
) -> None:
    """Check that ``candidate`` fills exactly the ``required`` placeholders, and only with plain placeholders.

    Constructs :func:`unsafe_constructs` finds are refused, except those written exactly so in ``seed`` (the
    template the user wrote: a ``{price:.2f}`` of the seed may stay in a rewrite).

    Raises:
        PlaceholderMismatchError: Some are missing or new ones appeared (the message names them), the candidate
            writes a construct the seed does not, or it is not a valid template for its engine.
    """
    try:
        found = template_placeholders(candidate)
        allowed = set(unsafe_constructs(seed)) if seed is not None and seed.engine == candidate.engine else set()
        unsafe = [construct for construct in unsafe_constructs(candidate) if construct not in allowed]
    except ValueError as exc:
        raise PlaceholderMismatchError(str(exc)) from exc
    if unsafe:
        plain = "{name}" if candidate.engine == "f-string" else "{{ name }}"
        raise PlaceholderMismatchError(
            f"the rewritten template writes {', '.join(unsafe[:3])}: only plain {plain} placeholders are allowed "
            "(no conversion, format spec, attribute, index or markup attribute the seed does not have)"
        )
    missing, extra = sorted(required - found), sorted(found - required)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"dropped {missing}")
        if extra:
            parts.append(f"added unknown {extra}")
        raise PlaceholderMismatchError("the rewritten template " + " and ".join(parts))


_JINJA_END_RAW = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")
"""What ends a jinja ``raw`` block, however it is spaced and trimmed."""
_POML_SPECIAL = re.compile(r"\{\{+|[<>&]+")
"""What POML would read as an expression or markup."""


def _poml_string(text: str) -> str:
    """A POML expression giving ``text`` (JSON string syntax; the markup characters escaped within it too)."""
    quoted = json.dumps(text).replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    return "{{ " + quoted + " }}"


def escape_literal(text: str, engine: str) -> str:
    """``text`` written so that the engine reproduces it verbatim (no placeholder inside it is filled)."""
    if engine == "f-string":
        return text.replace("{", "{{").replace("}", "}}")
    if engine == "jinja":
        # Whatever would end the raw block early is written as an expression giving that text.
        ended = _JINJA_END_RAW.sub(lambda m: "{% endraw %}{{ " + json.dumps(m.group(0)) + " }}{% raw %}", text)
        return "{% raw %}" + ended + "{% endraw %}"
    return _POML_SPECIAL.sub(lambda m: _poml_string(m.group(0)), text)
