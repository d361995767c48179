"""Selecting the LLM calls of some agents of a multi-agent system: the one ``agent_match`` rule.

Every place that takes an ``agent_match`` option (the trace adapters, GRPO, SFT, the VERL bridge) applies it with
the functions here, so a pattern selects the same calls everywhere:

* ``agent_match`` is a regular expression *searched* (:func:`re.search`) in a call's agent name: ``"planner"``
  selects ``planner``, ``planner_v2`` and ``sub-planner``; ``"^planner$"`` selects ``planner`` alone.
* ``None`` selects every call, with or without an agent name.
* Any other pattern selects only calls that have an agent name: a call without one (no enclosing agent span, no
  ``x-agentbolt-agent-name`` header) is never trained when ``agent_match`` is set. ``""`` therefore selects every
  call that has an agent name.

When a pattern selects none of a rollout's calls, and it has selected no call before in this process, a warning
names the pattern and lists the agent names of the rollout's calls, once per pattern, so that a misspelt
``agent_match`` does not silently train on nothing.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any, Iterable, List, Optional, Pattern, Sequence, Set, Tuple

from agentbolt.types import Triplet

__all__ = [
    "AgentMatchError",
    "compile_agent_match",
    "agent_selected",
    "call_agent_name",
    "report_agent_selection",
    "select_calls",
]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_selected_before: Set[str] = set()  # patterns that selected at least one call
_reported: Set[str] = set()  # patterns already warned about


class AgentMatchError(ValueError, re.error):
    """An ``agent_match`` that is not a valid regular expression.

    A :class:`ValueError` (what configuration validation expects) and a :class:`re.error` (what :func:`re.compile`
    raises), with the ``pattern``, ``pos``, ``lineno`` and ``colno`` of the compiler's error.
    """

    def __init__(self, message: str, error: re.error) -> None:
        ValueError.__init__(self, message)
        self.msg = message
        self.pattern, self.pos, self.lineno, self.colno = error.pattern, error.pos, error.lineno, error.colno


def compile_agent_match(agent_match: Any, option: str = "agent_match") -> Optional[Pattern[str]]:
    """The compiled ``agent_match`` pattern (None for None).

    Args:
        agent_match: The option's value: a regular expression or None.
        option: The option's name, used in the error message.

    Raises:
        TypeError: ``agent_match`` is neither a string nor None.
        AgentMatchError: ``agent_match`` is not a valid regular expression (the message names the pattern).
    """
    if agent_match is None:
        return None
    if not isinstance(agent_match, str):
        raise TypeError(
            f"{option} must be a regular expression string or None, got {type(agent_match).__name__} {agent_match!r}"
        )
    try:
        return re.compile(agent_match)
    except re.error as exc:
        message = f"{option} must be a regular expression; {agent_match!r} is not: {exc}"
        raise AgentMatchError(message, exc) from None


def agent_selected(pattern: Optional[Pattern[str]], agent_name: Optional[str]) -> bool:
    """Whether a call made by ``agent_name`` (None or ``""``: unknown) is selected by ``pattern``
    (from :func:`compile_agent_match`; None selects every call)."""
    if pattern is None:
        return True
    return bool(agent_name) and pattern.search(agent_name) is not None  # type: ignore[arg-type]


def call_agent_name(metadata: Any) -> Optional[str]:
    """The agent name a triplet's ``metadata`` records (``metadata["agent_name"]``); None when absent or empty."""
    name = metadata.get("agent_name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) and name else None


def report_agent_selection(
    pattern: Optional[Pattern[str]], agent_names: Iterable[Optional[str]], selected: int, rollout_id: Optional[str]
) -> None:
    """Warn (once per pattern and process) when ``pattern`` selects none of a rollout's calls and has selected no
    call before, listing the agent names the calls had.

    Args:
        pattern: The compiled ``agent_match`` (None: nothing to report).
        agent_names: The agent name of each of the rollout's calls (None or ``""`` for a call without one).
        selected: How many of these calls the pattern selected.
        rollout_id: The rollout, named in the warning.
    """
    if pattern is None:
        return
    names = list(agent_names)
    key = pattern.pattern
    with _lock:
        if selected:
            _selected_before.add(key)
            return
        if not names or key in _selected_before or key in _reported:
            return
        _reported.add(key)
    seen = sorted({name for name in names if name})
    described = ", ".join(repr(name) for name in seen)
    unnamed = sum(1 for name in names if not name)
    if unnamed:
        described += (", " if described else "") + f"{unnamed} call(s) without an agent name"
    logger.warning(
        "agent_match %r selects none of the %d LLM call(s) of rollout %s, so none of them is trained; their agents: "
        "%s. agent_match is searched (re.search) in each call's agent name, and a call without one is trained only "
        "when agent_match is None. This is reported once per pattern.",
        key,
        len(names),
        rollout_id,
        described,
    )


def select_calls(
    triplets: Sequence[Triplet], agent_match: Optional[str], rollout_id: Optional[str]
) -> List[Tuple[Optional[str], bool]]:
    """``(agent name, selected)`` for each of a rollout's call triplets (name None when the call has none), reporting
    a pattern that selects none of them (:func:`report_agent_selection`).

    Raises:
        TypeError, AgentMatchError: ``agent_match`` is not a valid pattern (see :func:`compile_agent_match`).
    """
    pattern = compile_agent_match(agent_match)
    names = [call_agent_name(triplet.metadata) for triplet in triplets]
    selection = [(name, agent_selected(pattern, name)) for name in names]
    report_agent_selection(pattern, names, sum(selected for _, selected in selection), rollout_id)
    return selection
