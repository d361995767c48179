"""The optimizer's own prompts: POML files shipped in ``prompts/``, and how rollouts are shown to the optimizer.

Each file is a small POML document (``<system-msg>``, ``<human-msg whiteSpace="pre">``, ``{{ name }}``
expressions). With the ``poml`` package installed (extra ``agentbolt[apo]``) POML renders it; without it the same
file is read as XML and each ``{{ name }}`` is replaced by the context value's text, which gives the same messages
for this subset of POML. POML renders through a separate process (a few seconds a call), so the optimizers call
:func:`render_prompt_file` in a worker thread.
Pass your own files to the optimizers (``gradient_prompt_files=...``) to change what the optimizer model is asked.
"""

from __future__ import annotations

import json
import logging
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "PROMPTS_DIR",
    "GRADIENT_PROMPT_FILES",
    "APPLY_EDIT_PROMPT_FILES",
    "REFLECT_PROMPT_FILES",
    "MERGE_PROMPT_FILES",
    "render_prompt_file",
    "check_prompt_file",
    "format_experiments",
    "conversation_of",
    "examples_position",
    "extract_template_text",
]

logger = logging.getLogger(__name__)

PROMPTS_DIR = Path(__file__).parent / "prompts"
GRADIENT_CONTEXT = frozenset({"prompt_template", "placeholders", "experiments", "experiments_text"})
"""Names a critique prompt file may use."""
APPLY_EDIT_CONTEXT = frozenset({"prompt_template", "placeholders", "critique"})
"""Names an edit prompt file may use."""
REFLECT_CONTEXT = GRADIENT_CONTEXT
"""Names a reflection prompt file may use."""
MERGE_CONTEXT = frozenset({"template_a", "template_b", "wins_a", "wins_b", "placeholders"})
"""Names a merge prompt file may use."""

GRADIENT_PROMPT_FILES: List[Path] = [PROMPTS_DIR / f"text_gradient_variant0{i}.poml" for i in (1, 2, 3)]
"""Critique prompts (context: ``prompt_template``, ``experiments``, ``experiments_text``, ``placeholders``)."""
APPLY_EDIT_PROMPT_FILES: List[Path] = [PROMPTS_DIR / f"apply_edit_variant0{i}.poml" for i in (1, 2)]
"""Rewrite prompts, aggressive (01) and conservative (02) (context: ``prompt_template``, ``critique``,
``placeholders``)."""
REFLECT_PROMPT_FILES: List[Path] = [PROMPTS_DIR / "reflect_variant01.poml"]
"""Reflective mutation of the Pareto optimizer: full traces in, a new template out."""
MERGE_PROMPT_FILES: List[Path] = [PROMPTS_DIR / "merge_variant01.poml"]
"""Merge of two Pareto-front templates (context: ``template_a``, ``template_b``, ``wins_a``, ``wins_b``)."""

_EXPRESSION = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_BOUND_NAME = re.compile(
    r"""\bfor\s*=\s*["']\s*([A-Za-z_][A-Za-z0-9_]*)\s+in\b|<let\b[^>]*\bname\s*=\s*["']([A-Za-z_][A-Za-z0-9_]*)"""
)
_ROLES = {"system-msg": "system", "human-msg": "user", "ai-msg": "assistant"}
_FENCE_OPENING = re.compile(r"```[A-Za-z0-9_+.-]*")


def _poml_module() -> Any:
    try:
        import poml
    except ImportError:
        return None
    return poml


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _render_plain(path: Path, context: Mapping[str, Any]) -> List[Dict[str, str]]:
    root = ElementTree.fromstring(path.read_text(encoding="utf-8"))
    messages: List[Dict[str, str]] = []
    for element in root:
        role = _ROLES.get(element.tag)
        if role is None:
            raise ValueError(f"{path}: the plain renderer knows only {sorted(_ROLES)}, not <{element.tag}>")
        raw = "".join(element.itertext()).strip()
        missing = [name for name in _EXPRESSION.findall(raw) if name not in context]
        if missing:
            raise KeyError(f"{path}: no value for {missing}")
        messages.append({"role": role, "content": _EXPRESSION.sub(lambda m: _text(context[m.group(1)]), raw)})
    return messages


def check_prompt_file(path: Path, names: Collection[str], *, option: str) -> None:
    """Check, before any run, that a prompt file can be read and that each ``{{ name }}`` it writes is one the
    optimizer fills in (``names``) or one the file binds itself (``<let name=...>``, ``for="x in ..."``).

    Raises:
        ValueError: The file cannot be read, or writes names the optimizer does not fill in (the message names the
            file, the option that gave it, the unknown names and the known ones).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{option}: cannot read the prompt file {path}: {exc}") from exc
    bound = {name for match in _BOUND_NAME.finditer(text) for name in match.groups() if name}
    unknown = sorted({name for name in _EXPRESSION.findall(text)} - set(names) - bound)
    if unknown:
        raise ValueError(
            f"{option}: the prompt file {path} uses {unknown}, which the optimizer does not fill in; "
            f"its values are {sorted(names)}"
        )


def render_prompt_file(
    path: Path, context: Mapping[str, Any], *, use_poml: Optional[bool] = None
) -> List[Dict[str, Any]]:
    """Render one prompt file into OpenAI chat messages.

    Args:
        path: A POML file.
        context: Values of the file's ``{{ name }}`` expressions.
        use_poml: Force (True) or avoid (False) the ``poml`` package; None uses it when installed.

    Returns:
        The messages (``role`` / ``content`` dicts).

    Raises:
        ImportError: ``use_poml=True`` without the ``poml`` package.
        KeyError: Plain rendering: an expression has no value in ``context``.
        ValueError: Plain rendering: the file uses a POML element other than the three message elements.
    """
    module = _poml_module() if use_poml is not False else None
    if use_poml and module is None:
        raise ImportError("Rendering prompt files with POML needs the poml package: pip install 'agentbolt[apo]'")
    if module is None:
        return _render_plain(path, context)
    rendered = module.poml(str(path), context=dict(context), format="openai_chat")
    return [{**message, "content": str(message.get("content", "")).strip()} for message in rendered["messages"]]


def _message_line(message: Mapping[str, Any], max_chars: int) -> List[str]:
    role = str(message.get("role", "?"))
    lines: List[str] = []
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    if content:
        text = str(content)
        if len(text) > max_chars:
            text = text[:max_chars] + f" [... {len(text) - max_chars} more characters]"
        lines.append(f"[{role}] {text}")
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        lines.append(f"[{role} calls tool] {function.get('name')}({function.get('arguments')})")
    return lines


def conversation_of(
    rollout_messages: Sequence[Mapping[str, Any]], examples: Sequence[Mapping[str, Any]] = ()
) -> List[Mapping[str, Any]]:
    """The fullest conversation of a rollout: the last LLM call's request messages plus its reply.

    ``rollout_messages`` is what :class:`~agentbolt.adapter.TraceToMessages` gives for the rollout (one entry per
    LLM call, each holding the messages sent and the assistant's answer); in an agent that carries its history
    forward, the last call's conversation contains every earlier turn. The prompt template's worked ``examples``,
    when the agent sent them (:meth:`~agentbolt.types.PromptTemplate.format_messages`), are left out: they belong to
    the prompt, not to the run.
    """
    if not rollout_messages:
        return []
    last = rollout_messages[-1]
    messages = list((last.get("messages") if isinstance(last, Mapping) else None) or [])
    start = examples_position(messages, examples)
    if start is not None:
        del messages[start : start + len(examples)]
    return messages


def _same_turn(sent: Mapping[str, Any], example: Mapping[str, Any]) -> bool:
    if sent.get("role") != example.get("role"):
        return False
    if example.get("role") in ("user", "system", "developer"):
        return str(sent.get("content") or "").strip() == str(example.get("content") or "").strip()
    return True


def examples_position(
    conversation: Sequence[Mapping[str, Any]], examples: Sequence[Mapping[str, Any]]
) -> Optional[int]:
    """Where a prompt template's worked ``examples`` appear in a traced conversation, or None if they do not.

    Turns match by role, and user and system turns by text too (a server may re-serialize tool calls and ids).
    """
    if not examples:
        return None
    for start in range(len(conversation) - len(examples) + 1):
        if all(_same_turn(conversation[start + i], example) for i, example in enumerate(examples)):
            return start
    return None


def format_experiments(experiments: Sequence[Mapping[str, Any]], *, max_message_chars: int = 1500) -> str:
    """Show rollouts to the optimizer model: each run's conversation, tool calls, reward and status.

    Args:
        experiments: ``RolloutResultForAPO``-shaped dicts (``status``, ``final_reward``, ``messages``).
        max_message_chars: Longer message contents are cut (with a note of how much).
    """
    blocks: List[str] = []
    for number, experiment in enumerate(experiments, start=1):
        reward = experiment.get("final_reward")
        header = f"### Run {number}: reward {reward if reward is not None else 'none (counted as 0)'}"
        header += f", status {experiment.get('status')}"
        lines = [header]
        conversation = experiment.get("conversation")
        if conversation is None:
            conversation = conversation_of(experiment.get("messages") or [])
        if not conversation:
            lines.append("(no LLM call was recorded)")
        for message in conversation:
            lines.extend(_message_line(message, max_message_chars))
        for text in experiment.get("feedback") or []:
            lines.append(f"[feedback] {text}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "(no runs)"


def _top_level_blocks(lines: Sequence[str]) -> List[Tuple[int, int]]:
    """``(first, last)`` line indices of the reply's outermost fenced blocks, fences included.

    A fence line naming a language (```` ```json ````) always opens a block, nested in an open one if any; a bare
    ```` ``` ```` closes the innermost open block, or opens one when none is open. A template holding a fenced
    example inside the fence around it thus stays whole. An unclosed block is not a block.
    """
    blocks: List[Tuple[int, int]] = []
    open_at: List[int] = []
    for index, line in enumerate(lines):
        fence = line.strip()
        if not _FENCE_OPENING.fullmatch(fence):
            continue
        if fence == "```" and open_at:
            first = open_at.pop()
            if not open_at:
                blocks.append((first, index))
        else:
            open_at.append(index)
    return blocks


def extract_template_text(reply: Optional[str], usable: Optional[Callable[[str], bool]] = None) -> Optional[str]:
    """The template in an optimizer reply, stripped.

    That is the reply's last outermost fenced block (a fenced example inside it stays part of it) when it has one
    and ``usable`` accepts it (a template without the placeholders to keep is a fenced example of the template, not
    the template), else the whole reply.

    Args:
        reply: The optimizer model's reply.
        usable: Whether a fenced block's text is a usable template; None accepts any.

    Returns:
        None for an empty reply.
    """
    if reply is None:
        return None
    lines = reply.strip().splitlines()
    blocks = _top_level_blocks(lines)
    if blocks:
        first, last = blocks[-1]
        block = "\n".join(lines[first + 1 : last]).strip()
        if block and (usable is None or usable(block) or (first, last) == (0, len(lines) - 1)):
            return block
    text = reply.strip()
    return text or None
