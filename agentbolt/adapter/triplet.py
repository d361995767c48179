"""Turn traces into ``(prompt, response, reward)`` triplets for reinforcement learning.

Two adapters live here:

* :class:`TracerTraceToTriplet` reads the spans recorded by the agent-side tracer. It rebuilds the span tree
  (:class:`TraceTree`), optionally repairs broken parent links, finds the LLM-call spans (optionally only those of
  selected agents), and assigns rewards to them.
* :class:`LlmProxyTraceToTriplet` reads the spans recorded by an LLM gateway, which carry token ids straight from
  the inference backend (no re-tokenization).

LLM gateway span format
-----------------------
The agentbolt gateway records exactly one span per LLM call (streaming included) and stores it under the rollout and
attempt named in the request URL (``/rollout/{rollout_id}/attempt/{attempt_id}/v1/...``), with a sequence id
allocated when the request arrives. The key names are constants in :mod:`agentbolt.semconv`.

=============================================  ====================================================================
span name                                      ``agentbolt.llm_call`` (:data:`~agentbolt.semconv.AGL_LLM_CALL`)
``gen_ai.request.model``                       model requested by the client
``gen_ai.request.functions.<i>.*``             tools offered (``name``, ``description``, ``parameters`` as JSON)
``gen_ai.request.<param>``                      sampling parameters the client sent (``temperature``, ``top_p``,
                                               ``max_tokens``, ``seed``...; ``n`` as ``choice.count``, ``stop`` as
                                               ``stop_sequences``, and ``stream``), see
                                               :mod:`agentbolt.llm_call_attributes`
``gen_ai.response.id``                         completion id (de-duplication key)
``gen_ai.response.model``                      model that answered
``gen_ai.prompt.<i>.*``                        request messages (``role``, ``content``, ``tool_call_id``,
                                               ``tool_calls.<j>.id/type/name/arguments``; older spans:
                                               ``tool_calls.<j>.function.name/function.arguments``)
``gen_ai.completion.<i>.*``                    choices (``role``, ``content``, ``finish_reason``, ``tool_calls...``)
``gen_ai.usage.input_tokens`` / ``output_tokens``  token counts
``prompt_token_ids``                           list[int], the prompt as the backend tokenized it
``response_token_ids``                         list[int], tokens of the first choice
``response_logprobs``                          list[float], one per response token (when the backend returns them)
``agentbolt.llm.agent_name``                   optional; the calling agent (copied from the
                                               ``x-agentbolt-agent-name`` request header)
=============================================  ====================================================================

:class:`LlmProxyTraceToTriplet` also reads the layouts of the reference's LiteLLM-based proxy
(``raw_gen_ai_request`` spans with ``llm.hosted_vllm.*`` attributes, ``litellm_request`` spans).
"""

from __future__ import annotations

import ast
import bisect
import functools
import heapq
import itertools
import json
import logging
import math
import re
from enum import Enum
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Type, Union

from pydantic import BaseModel

from agentbolt.llm_call_attributes import CONTENT_IS_TEXT
from agentbolt.semconv import (
    AGL_LLM_CALL,
    AGL_VIRTUAL,
    GEN_AI_COMPLETION,
    GEN_AI_PROMPT,
    GEN_AI_RESPONSE_ID,
    LANGGRAPH_NODE_PATH,
    LLM_AGENT_NAME,
    PROMPT_TOKEN_IDS,
    RESPONSE_LOGPROBS,
    RESPONSE_TOKEN_IDS,
    LightningSpanAttributes,
)
from agentbolt.types import Span, Triplet
from agentbolt.types.wire import NON_FINITE_FLOATS
from agentbolt.utils.reward_spans import is_reward_operation, recorded_reward

from .agent_match import agent_selected, compile_agent_match, report_agent_selection
from .base import TraceToTripletBase, span_list
from .calls import CallAgentNames, CallIdentities, call_identity, matching_keys, record_rank, stored_keys
from .fenwick import MinimumTree
from .messages import decode_content, group_genai_dict

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = [
    "RewardMatchPolicy",
    "Transition",
    "TraceTree",
    "TracerTraceToTriplet",
    "LlmProxyTraceToTriplet",
    "triplet_token_ids",
    "is_token_id_list",
    "parse_logprobs",
]

logger = logging.getLogger(__name__)

DEFAULT_LLM_CALL_MATCH = r"openai\.chat\.completion"
VIRTUAL_ROOT_ID = "virtual-root"

_OPERATION_NAME = LightningSpanAttributes.OPERATION_NAME.value
_OPERATION_INPUT = LightningSpanAttributes.OPERATION_INPUT.value
_OPERATION_OUTPUT = LightningSpanAttributes.OPERATION_OUTPUT.value

_PROMPT_TOKEN_KEYS = (PROMPT_TOKEN_IDS, f"{_OPERATION_OUTPUT}.prompt_token_ids")
_RESPONSE_TOKEN_KEYS = (
    RESPONSE_TOKEN_IDS,
    f"{_OPERATION_OUTPUT}.response_token_ids.0",
    f"{_OPERATION_OUTPUT}.choices.0.token_ids",
    f"{_OPERATION_OUTPUT}.choices.0.provider_specific_fields.token_ids",
)
_RESPONSE_ID_KEYS = (GEN_AI_RESPONSE_ID, f"{_OPERATION_OUTPUT}.id")
_LOGPROBS_CONTENT = "logprobs.content"


class RewardMatchPolicy(str, Enum):
    """How reward spans are assigned to LLM calls."""

    FIRST_SIBLING = "first_sibling"
    """A reward goes to the latest finished LLM call among its siblings in the span tree."""
    FIRST_OCCURRENCE = "first_occurrence"
    """A reward goes to the latest LLM call (anywhere in the trace) that finished before the reward started."""


class Transition(BaseModel):
    """One token-level transition: state (prompt tokens), action (response tokens) and reward."""

    state: List[int]
    action: List[int]
    response_id: Optional[str]
    agent_name: str
    reward: Optional[float]


# -- reading the triplets built here --------------------------------------------------------------------------------


def triplet_token_ids(part: Any) -> List[int]:
    """The ``token_ids`` of a triplet's ``prompt`` or ``response`` dict; ``[]`` when absent or not a list of token ids
    (see :func:`is_token_id_list`)."""
    ids = part.get("token_ids") if isinstance(part, dict) else None
    return list(ids) if is_token_id_list(ids) else []


def parse_logprobs(raw: Any, expected_length: int) -> Optional[List[float]]:
    """Read per-token log-probs from a triplet's ``response["logprobs"]``.

    Accepts a list of floats or OpenAI-style entries (``{"token": ..., "logprob": x, ...}``), optionally wrapped in a
    ``{"content": [...]}`` dict. Returns None when the value is absent, malformed, not finite, or does not have one
    entry per response token.
    """
    if isinstance(raw, dict):
        raw = raw.get("content")
    if not isinstance(raw, (list, tuple)) or len(raw) != expected_length:
        return None
    values: List[float] = []
    for entry in raw:
        value = entry.get("logprob") if isinstance(entry, dict) else entry
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        values.append(float(value))
    return values


# -- attribute helpers ----------------------------------------------------------------------------------------------


def is_token_id_list(value: Any) -> bool:
    """Whether ``value`` is a list (or tuple) of token ids: ints (not bools) that are not negative."""
    return isinstance(value, (list, tuple)) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value
    )


def _as_token_ids(value: Any) -> Optional[List[int]]:
    """``value`` as a list of token ids (a list, a tuple, or their string repr), else None."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    return list(value) if is_token_id_list(value) else None


def _first_token_ids(span: Span, keys: Iterable[str]) -> Optional[List[int]]:
    """The token ids under the first of ``keys`` that holds a valid list; a key holding something else is skipped
    with a warning (the call then has no token ids to train on, rather than wrong ones)."""
    for key in keys:
        value = span.attributes.get(key)
        if value is None:
            continue
        ids = _as_token_ids(value)
        if ids is not None:
            return ids
        logger.warning(
            "Span %s (%s): %r is not a list of non-negative integer token ids (%.80r); ignored.",
            span.span_id,
            span.name,
            key,
            value,
        )
    return None


def _first_str(attributes: Dict[str, Any], keys: Iterable[str]) -> Optional[str]:
    for key in keys:
        value = attributes.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _unflatten_first(attributes: Dict[str, Any], prefixes: Iterable[str]) -> Any:
    """The nested value under the first prefix that has dotted keys below it, else None."""
    for prefix in prefixes:
        value = group_genai_dict(attributes, prefix)
        if value:
            return value
    return None


def _response_id(span: Span) -> Optional[str]:
    return _first_str(span.attributes, _RESPONSE_ID_KEYS)


def _as_float(value: Any) -> Optional[float]:
    """A number as a float; also the strings stored JSON holds for non-finite floats (``"-Infinity"``...)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return NON_FINITE_FLOATS.get(value) if isinstance(value, str) else None


def _as_float_list(value: Any) -> Optional[List[float]]:
    if not isinstance(value, (list, tuple)):
        return None
    floats = [_as_float(x) for x in value]
    return None if any(x is None for x in floats) else floats  # type: ignore[return-value]


def _response_logprobs(span: Span) -> Optional[List[Any]]:
    """Logprobs of the response: the parsed ``logprobs.content`` JSON (OpenAI's per-token entries) when present,
    else the gateway's ``response_logprobs`` floats."""
    raw = span.attributes.get(_LOGPROBS_CONTENT)
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            logger.warning("Span %s has an invalid %r attribute (not JSON); logprobs omitted.", span.span_id, raw[:80])
        else:
            if isinstance(parsed, list):
                return parsed
            logger.warning("Span %s: %r is not a JSON list; logprobs omitted.", span.span_id, _LOGPROBS_CONTENT)
    return _as_float_list(span.attributes.get(RESPONSE_LOGPROBS))


def span_reward_value(span: Span) -> Optional[float]:
    """The primary reward recorded on ``span``, or None when it is not a reward span.

    Uses :func:`agentbolt.utils.reward_spans.recorded_reward`: the rewards of
    :func:`agentbolt.emitter.reward.get_reward_value`, and the output of a legacy ``agentlightning.operation`` span
    named ``agentlightning.reward``. A malformed reward (a string that is not a number...) counts as none, with a
    warning.
    """
    try:
        return recorded_reward(span)
    except (ValueError, TypeError) as exc:  # e.g. a reward recorded as a string that is not a number
        reason = " ".join(str(exc).split())
        logger.warning("Span %s (%s) has a malformed reward, ignored: %.200s", span.span_id, span.name, reason)
        return None


def _message_image_urls(message: Any) -> List[str]:
    if not isinstance(message, dict):
        return []
    content = decode_content(message.get("content"), text=message.get(CONTENT_IS_TEXT) is True)
    if not isinstance(content, list):
        return []
    urls: List[str] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if isinstance(url, str):
                urls.append(url)
    return urls


def _index_key(key: Any) -> Tuple[int, Union[int, str]]:
    text = str(key)
    return (0, int(text)) if text.isdigit() else (1, text)


def _time_or(value: Optional[float], default: float) -> float:
    return default if value is None else value


# -- trace tree -----------------------------------------------------------------------------------------------------


def _enclosing_span(span_id: str, name: str, nodes: Sequence[TraceTree]) -> Span:
    """A span standing for a missing parent of ``nodes``: same rollout, attempt and trace, spanning their times."""
    first = nodes[0].span
    starts = [node.start_time for node in nodes if node.start_time is not None]
    ends = [node.end_time for node in nodes if node.end_time is not None]
    return Span.from_attributes(
        attributes={},
        span_id=span_id,
        name=name,
        rollout_id=first.rollout_id,
        attempt_id=first.attempt_id,
        sequence_id=first.sequence_id,
        trace_id=first.trace_id,
        start_time=min(starts) if starts else None,
        end_time=max(ends) if ends else None,
    )


def _has_time_range(node: TraceTree) -> bool:
    start, end = node.start_time, node.end_time
    return start is not None and end is not None and start <= end


def _tightest_enclosing(candidates: Sequence[TraceTree], nodes: Sequence[TraceTree]) -> Dict[int, TraceTree]:
    """For each of ``nodes`` (keyed by ``id(node)``), the shortest of ``candidates`` (the first in their order among
    equally short ones) whose time range contains the node's with a positive slack, if any.

    A positive slack means starting strictly earlier, or ending strictly later. Both cases are found by a sweep over
    start times with a Fenwick tree of the shortest candidate per end time, so a trace of ``n`` spans takes
    ``O(n log n)``. All time ranges must be known and not end before they start.
    """
    ends = sorted({node.end_time for node in candidates})  # type: ignore[type-var]
    by_start = sorted(range(len(candidates)), key=lambda i: candidates[i].start_time)  # type: ignore[arg-type,return-value]
    queries = sorted(nodes, key=lambda node: node.start_time)  # type: ignore[arg-type,return-value]
    best: Dict[int, Tuple[float, int]] = {}
    for strict_start in (True, False):
        # Slot r holds the smallest (duration, index) among inserted candidates of end rank r, where rank 1 is the
        # latest end; slots 1..r are then "ends at or after a time".
        tree: MinimumTree[Tuple[float, int]] = MinimumTree(len(ends))
        inserted = 0
        for query in queries:
            start, end = query.start_time, query.end_time
            while inserted < len(by_start):
                index = by_start[inserted]
                candidate = candidates[index]
                if candidate.start_time > start or (strict_start and candidate.start_time == start):  # type: ignore[operator]
                    break
                key = (candidate.end_time - candidate.start_time, index)  # type: ignore[operator]
                tree.lower(len(ends) - bisect.bisect_left(ends, candidate.end_time), key)
                inserted += 1
            # With a strictly earlier start the candidate may end with the node; otherwise it must end later.
            cut = bisect.bisect_left(ends, end) if strict_start else bisect.bisect_right(ends, end)
            found = tree.minimum(len(ends) - cut)
            if found is not None and (id(query) not in best or found < best[id(query)]):
                best[id(query)] = found
    return {key: candidates[index] for key, (_, index) in best.items()}


class TraceTree:
    """A span and its children: the tree structure of one rollout's trace.

    Args:
        id: The node id (the span id, or ``"virtual-root"`` for a synthetic root).
        span: The span at this node.
        children: Child nodes, in chronological / input order.
    """

    def __init__(self, id: str, span: Span, children: Optional[List[TraceTree]] = None) -> None:
        self.id = id
        self.span = span
        self.children: List[TraceTree] = children if children is not None else []

    def __repr__(self) -> str:
        return f"TraceTree(id={self.id!r}, name={self.span.name!r}, children={len(self.children)})"

    @property
    def start_time(self) -> Optional[float]:
        """Start time of the span (seconds since the epoch), if known."""
        return self.span.start_time

    @property
    def end_time(self) -> Optional[float]:
        """End time of the span (seconds since the epoch), if known."""
        return self.span.end_time

    # -- structure -----------------------------------------------------------------------------------------------

    def find_id(self, id: str) -> Optional[TraceTree]:
        """The node with this id in the subtree, or None."""
        for node in self.traverse():
            if node.id == id:
                return node
        return None

    def add_child(self, child: TraceTree) -> None:
        """Append a child node."""
        self.children.append(child)

    def traverse(self) -> List[TraceTree]:
        """All nodes of the subtree in pre-order (depth first, parents before children)."""
        nodes: List[TraceTree] = []
        stack: List[TraceTree] = [self]
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(reversed(node.children))
        return nodes

    def names_tuple(self) -> Tuple[str, List[Any]]:
        """``(name, [children's tuples])``; agent spans get an ``" [agent]"`` suffix. Handy in tests and logs."""
        name = self.span.name
        if self.agent_name() is not None:
            name += " [agent]"
        return (name, [child.names_tuple() for child in self.children])

    def to_json(self) -> Dict[str, Any]:
        """The subtree as JSON-compatible dicts: ``{"id", "span", "children"}``."""
        return {
            "id": self.id,
            "span": self.span.model_dump(),
            "children": [child.to_json() for child in self.children],
        }

    def visualize(self, filename: str, interested_span_match: Optional[str] = None) -> None:
        """Render the tree to ``<filename>.png`` with graphviz.

        Args:
            filename: Output path without extension.
            interested_span_match: Regex; only spans whose name matches (and their ancestors) are drawn.

        Raises:
            ImportError: If the ``graphviz`` Python package is not installed (the ``dot`` program is needed too).
        """
        try:
            import graphviz
        except ImportError as exc:
            raise ImportError(
                "TraceTree.visualize needs the `graphviz` Python package and the Graphviz `dot` program: "
                "pip install graphviz (and install Graphviz from your package manager)."
            ) from exc

        pattern = re.compile(interested_span_match) if interested_span_match is not None else None
        keep: Set[str] = set()

        def mark(node: TraceTree) -> bool:
            interesting = pattern is None or bool(pattern.search(node.span.name))
            for child in node.children:
                interesting = mark(child) or interesting
            if interesting:
                keep.add(node.id)
            return interesting

        mark(self)
        graph = graphviz.Digraph(comment="Trace tree")
        for node in self.traverse():
            if node.id not in keep:
                continue
            label = node.span.name
            agent = node.agent_name()
            if agent is not None:
                label += f"\n[agent: {agent}]"
            graph.node(node.id, label)
            for child in node.children:
                if child.id in keep:
                    graph.edge(node.id, child.id)
        graph.render(filename, format="png", cleanup=True)

    @classmethod
    def from_spans(cls, spans: List[Span]) -> TraceTree:
        """Build the tree of ``spans`` from their parent ids.

        Spans whose parent is missing hang under a virtual node standing for that parent; several roots hang under
        a synthetic ``"virtual-root"`` node. Children keep the input order. Spans whose parent links form a cycle
        beside a root are kept: the cycle is cut above its first span (in input order), which becomes a root, with
        a warning.

        Args:
            spans: The spans of one rollout (any order).

        Returns:
            The root node.

        Raises:
            ValueError: If ``spans`` is empty or no span is a root (every span is in or below a cycle).
        """
        if not spans:
            raise ValueError("No spans provided to create TraceTree.")
        nodes: Dict[str, TraceTree] = {}
        ordered: List[TraceTree] = []
        for span in spans:
            if span.span_id in nodes:
                logger.warning("Duplicate span id %s in trace; keeping the first occurrence.", span.span_id)
                continue
            node = cls(span.span_id, span)
            nodes[span.span_id] = node
            ordered.append(node)

        # Parents that are referenced but missing become virtual nodes spanning their children.
        orphans: Dict[str, List[TraceTree]] = {}
        for node in ordered:
            parent_id = node.span.parent_id
            if parent_id is not None and parent_id != node.id and parent_id not in nodes:
                orphans.setdefault(parent_id, []).append(node)
        for parent_id, children in orphans.items():
            node = cls(parent_id, _enclosing_span(parent_id, AGL_VIRTUAL, children))
            nodes[parent_id] = node
            ordered.append(node)

        roots: List[TraceTree] = []
        for node in ordered:
            parent_id = node.span.parent_id
            if parent_id is None or parent_id == node.id:
                roots.append(node)
            else:
                nodes[parent_id].add_child(node)
        if not roots:
            raise ValueError("No root span found: the spans' parent links form a cycle.")
        roots.extend(cls._break_cycles(roots, ordered, nodes))
        if len(roots) == 1:
            return roots[0]
        return cls(VIRTUAL_ROOT_ID, _enclosing_span(VIRTUAL_ROOT_ID, VIRTUAL_ROOT_ID, roots), roots)

    @staticmethod
    def _break_cycles(roots: List[TraceTree], ordered: List[TraceTree], nodes: Dict[str, TraceTree]) -> List[TraceTree]:
        """Make the spans whose parent links form a cycle reachable: each cycle is cut above its first span met
        (in input order), which becomes an extra root. Returns those roots."""
        reachable: Set[str] = {n.id for root in roots for n in root.traverse()}
        extra: List[TraceTree] = []
        for node in ordered:
            if node.id in reachable:
                continue
            # Walk up from this node until a span repeats: that span is on the cycle.
            seen: Set[str] = set()
            current = node
            while current.id not in seen:
                seen.add(current.id)
                current = nodes[str(current.span.parent_id)]
            parent = nodes[str(current.span.parent_id)]
            parent.children.remove(current)
            logger.warning(
                "The parent links of span %s (%s) form a cycle; it is kept as a root of the trace.",
                current.id,
                current.span.name,
            )
            extra.append(current)
            reachable.update(n.id for n in current.traverse())
        return extra

    def repair_hierarchy(self) -> None:
        """Re-attach top-level spans to the span that encloses them in time.

        Spans recorded in another thread, process or service often lose their parent link and end up as roots.
        Starting from the first node with more than one child, each direct child is moved under the tightest other
        node (outside its own subtree) whose time range contains it with a positive total slack; among equally
        tight ones, the first in depth-first order. Spans without a time range, or ending before they start, are
        neither moved nor chosen as parents.
        """
        node = self
        while len(node.children) == 1:
            node = node.children[0]
        candidates = [n for n in node.traverse() if n is not node and _has_time_range(n)]
        movable = [child for child in node.children if _has_time_range(child)]
        tightest = _tightest_enclosing(candidates, movable)
        moved: Set[int] = set()
        adopters: Dict[int, Tuple[TraceTree, int]] = {}  # new parent -> (itself, its number of children before)
        for child in movable:
            best = tightest.get(id(child))
            if best is None:
                continue
            own_subtree = {id(n) for n in child.traverse()}
            if id(best) in own_subtree:  # a descendant outliving the child: look again, outside the subtree
                outside = [c for c in candidates if id(c) not in own_subtree]
                best = _tightest_enclosing(outside, [child]).get(id(child))
                if best is None:
                    continue
            moved.add(id(child))
            adopters.setdefault(id(best), (best, len(best.children)))
            best.children.append(child)
        node.children = [child for child in node.children if id(child) not in moved]
        for adopter, kept in adopters.values():
            adopter._place_chronologically(kept)

    def _place_chronologically(self, kept: int) -> None:
        """Move the children after the first ``kept`` ones to their place in time: each after the last earlier child
        that started no later than it (a stable merge when the children were in chronological order)."""

        def start(node: TraceTree) -> float:
            return _time_or(node.start_time, float("-inf"))

        old, new = self.children[:kept], self.children[kept:]
        if all(start(a) <= start(b) for a, b in itertools.pairwise(old)):
            self.children = sorted(old + new, key=start)
            return
        self.children = old
        for child in new:
            index = len(self.children)
            while index > 0 and start(self.children[index - 1]) > start(child):
                index -= 1
            self.children.insert(index, child)

    # -- semantics -----------------------------------------------------------------------------------------------

    def agent_name(self) -> Optional[str]:
        """The agent this span represents, if it is an agent span (as recorded by common agent frameworks)."""
        attrs = self.span.attributes

        def text(key: str) -> Optional[str]:
            value = attrs.get(key)
            return value if isinstance(value, str) and value else None

        name = text("agent.name")
        if name is not None:
            return name
        if attrs.get("agentops.span.kind") == "agent" and text("operation.name") is not None:
            return text("operation.name")
        for key in ("recipient_agent_type", "langchain.chain.type", "executor.id"):
            name = text(key)
            if name is not None:
                return name
        if attrs.get("type") == "agent" and text(f"{_OPERATION_INPUT}.name") is not None:
            return text(f"{_OPERATION_INPUT}.name")
        prefix = "langchain.Chain."
        if self.span.name.startswith(prefix):
            # A LangGraph node by its path ("researcher/agent": the prebuilt agents of a multi-agent graph all call
            # their model node "agent"), another chain by its name: the lc_name attribute, else the span name's rest.
            return text(LANGGRAPH_NODE_PATH) or text("lc_name") or (self.span.name[len(prefix) :] or None)
        return None

    @functools.cached_property
    def _reward_value(self) -> Optional[float]:
        # Read once per node: finding the calls and matching the rewards both ask, and a malformed reward warns.
        return span_reward_value(self.span)

    def maybe_reward_dict(self) -> Dict[str, Any]:
        """``{"type": "reward", "value": v}`` when this is a reward span, else ``{}``.

        The span's reward is read on the first call (a malformed one is reported then) and remembered.
        """
        value = self._reward_value
        return {"type": "reward", "value": value} if value is not None else {}

    def is_reward_span(self) -> bool:
        """Whether this span records a reward."""
        return is_reward_operation(self.span) or bool(self.maybe_reward_dict())

    def response_id(self) -> Optional[str]:
        """The response id of an LLM-call span, if recorded."""
        return _response_id(self.span)

    def find_llm_calls(
        self,
        *,
        llm_call_match: str,
        agent_match: Optional[str],
        within_matching_subtree: Optional[str] = None,
        within_reward: Optional[bool] = None,
        within_llm_call: Optional[bool] = None,
        existing_llm_call_response_ids: Optional[Set[str]] = None,
    ) -> List[Tuple[TraceTree, str]]:
        """LLM-call nodes of the subtree (depth-first order) with the name of the agent that made each call.

        Args:
            llm_call_match: Regex (``re.search``) on span names identifying LLM calls.
            agent_match: Regex searched in agent names (:mod:`agentbolt.adapter.agent_match`); only calls of
                matching agents are kept. A call's agent is the ``agentbolt.llm.agent_name`` (the gateway's
                header) carried by any record of the call (:mod:`agentbolt.adapter.calls`), else the innermost agent
                span enclosing it (a LangChain composition such as ``RunnableSequence`` inside a named agent does not
                rename its calls). A call without an agent name is kept only when this is None (None keeps all).
            within_matching_subtree: Name of the enclosing matching agent (``""`` for "no agent, but everything
                matches"); None when outside any matching agent.
            within_reward: None disables the check; otherwise calls nested under a reward span are skipped.
            within_llm_call: None disables de-duplication; otherwise a call recorded several times (same call id,
                or same response id, see :mod:`agentbolt.adapter.calls`) is kept once, by its best record
                (:func:`~agentbolt.adapter.calls.record_rank`: the gateway's, with the engine's token ids, before the
                SDK's), in the place of its first; a nested call without either id under an accepted call is
                skipped.
            existing_llm_call_response_ids: Identities of the calls already accepted (updated in place):
                response ids of records without a call id, plus the call identities of the others.

        Returns:
            ``(node, agent_name)`` pairs.
        """
        if agent_match is None and within_matching_subtree is None:
            within_matching_subtree = ""
        if within_llm_call is not None and existing_llm_call_response_ids is None:
            existing_llm_call_response_ids = set()
        identities = (
            CallIdentities(existing_llm_call_response_ids) if existing_llm_call_response_ids is not None else None
        )
        call_pattern = re.compile(llm_call_match)
        agent_pattern = compile_agent_match(agent_match)

        # Depth-first with an explicit stack (traces can nest deeper than Python's recursion limit); each entry
        # carries the state inherited from its parent: the innermost agent's name (None: no agent) and whether
        # agent_match selects it.
        header_names = self._call_agent_names()
        results: List[Tuple[TraceTree, str]] = []
        taken: Dict[str, int] = {}  # identity key of a call taken here -> its place in results
        excluded: List[Optional[str]] = []  # agent names of the calls agent_match leaves out
        stack: List[Tuple[TraceTree, Optional[str], bool, Optional[bool], Optional[bool]]] = [
            (self, within_matching_subtree, within_matching_subtree is not None, within_reward, within_llm_call)
        ]
        while stack:
            node, subtree_agent, subtree_selected, in_reward, in_call = stack.pop()
            agent = node.agent_name()
            if agent is not None and not (subtree_agent and _is_langchain_composition(node.span)):
                subtree_agent, subtree_selected = agent, agent_selected(agent_pattern, agent)
            if in_reward is not None and node.is_reward_span():
                in_reward = True
            if not in_reward and call_pattern.search(node.span.name):
                call_agent, call_selected = subtree_agent, subtree_selected
                own_agent = _own_agent_name(node.span)
                if own_agent is None and header_names is not None:  # another record of the call may carry it
                    own_agent = header_names.get(*call_identity(node.span.attributes, _RESPONSE_ID_KEYS))
                if own_agent is not None:  # the gateway's header name wins over the enclosing agent spans
                    call_agent, call_selected = own_agent, agent_selected(agent_pattern, own_agent)
                if not call_selected:
                    excluded.append(call_agent)
                else:
                    accepted = True
                    if identities is not None:
                        call_id, response_id = call_identity(node.span.attributes, _RESPONSE_ID_KEYS)
                        if call_id is None and response_id is None:
                            accepted = not in_call
                        else:
                            accepted = identities.claim(call_id, response_id)
                            if accepted:
                                taken.update(dict.fromkeys(stored_keys(call_id, response_id), len(results)))
                            else:  # a better record of a call taken here (the gateway's) takes its place
                                keys = matching_keys(call_id, response_id)
                                earlier = next((taken[key] for key in keys if key in taken), None)
                                if earlier is not None and record_rank(node.span) < record_rank(
                                    results[earlier][0].span
                                ):
                                    results[earlier] = (node, results[earlier][1])
                    if accepted:
                        results.append((node, call_agent or ""))
                        if in_call is not None:
                            in_call = True
            stack.extend(
                (child, subtree_agent, subtree_selected, in_reward, in_call) for child in reversed(node.children)
            )
        report_agent_selection(
            agent_pattern, [name for _, name in results] + excluded, len(results), self.span.rollout_id
        )
        return results

    def _call_agent_names(self) -> Optional[CallAgentNames]:
        """The agent names the subtree's call records carry (``agentbolt.llm.agent_name``), by call; None if none."""
        names: Optional[CallAgentNames] = None
        for node in self.traverse():
            name = _own_agent_name(node.span)
            if name is not None:
                names = names or CallAgentNames()
                names.add(*call_identity(node.span.attributes, _RESPONSE_ID_KEYS), name)
        return names

    def match_rewards(self, reward_match: str, llm_calls: List[TraceTree]) -> Dict[str, Optional[float]]:
        """Assign each reward span of the tree to at most one LLM call.

        A reward goes to the LLM call that ended most recently at or before the reward's start and has no reward
        yet; rewards are taken in chronological order. With ``first_sibling`` only siblings of the reward compete.

        Args:
            reward_match: A :class:`RewardMatchPolicy` value.
            llm_calls: The LLM-call nodes that may receive rewards.

        Returns:
            LLM-call node id -> reward (None for calls that received none).
        """
        policy = RewardMatchPolicy(reward_match)
        call_ids = {call.id for call in llm_calls}
        assigned: Dict[str, Optional[float]] = {call.id: None for call in llm_calls}
        if policy == RewardMatchPolicy.FIRST_OCCURRENCE:
            groups = [self.traverse()]
        else:
            groups = [node.children for node in self.traverse()]
        for group in groups:
            calls = [n for n in group if n.id in call_ids and n.end_time is not None]
            rewards = []
            for n in group:
                value = n.maybe_reward_dict().get("value")
                if value is not None and n.id not in call_ids:
                    rewards.append((n, value))
            rewards.sort(key=lambda item: _time_or(item[0].start_time, float("inf")))
            # Calls by end time; those ended by a reward's start wait in a heap, latest end (then latest start, then
            # first in the group) on top.
            by_end = sorted(calls, key=lambda c: c.end_time)  # type: ignore[arg-type,return-value]
            ended: List[Tuple[float, float, int, TraceTree]] = []
            position = {id(c): i for i, c in enumerate(calls)}
            next_call = 0
            for reward_node, value in rewards:
                reward_start = _time_or(reward_node.start_time, float("inf"))
                while next_call < len(by_end) and by_end[next_call].end_time <= reward_start:  # type: ignore[operator]
                    call = by_end[next_call]
                    entry = (-call.end_time, -_time_or(call.start_time, 0.0), position[id(call)], call)  # type: ignore[operator]
                    heapq.heappush(ended, entry)
                    next_call += 1
                if ended:
                    target = heapq.heappop(ended)[3]
                    assigned[target.id] = value
                else:
                    logger.debug(
                        "Reward %s (span %s) goes to no LLM call: none %s finished before it without a reward",
                        value,
                        reward_node.id,
                        "in the trace" if policy == RewardMatchPolicy.FIRST_OCCURRENCE else "among its siblings",
                    )
        return assigned

    @staticmethod
    def extract_prompt_image_urls(prompt_raw_content: Any) -> List[str]:
        """Image URLs in the prompt's messages (``image_url`` content parts).

        Args:
            prompt_raw_content: A list of messages, or a dict of messages keyed by index (or a single message).

        Returns:
            The URLs in message order; malformed entries are skipped.
        """
        if isinstance(prompt_raw_content, dict):
            if prompt_raw_content and all(str(k).isdigit() for k in prompt_raw_content):
                messages = [prompt_raw_content[k] for k in sorted(prompt_raw_content, key=_index_key)]
            else:
                messages = [prompt_raw_content]
        elif isinstance(prompt_raw_content, list):
            messages = prompt_raw_content
        else:
            return []
        urls: List[str] = []
        for message in messages:
            urls.extend(_message_image_urls(message))
        return urls

    def span_to_triplet(self, span: Span, agent_name: str) -> Triplet:
        """Convert one LLM-call span into a triplet (reward left empty).

        Args:
            span: The LLM-call span.
            agent_name: The agent that made the call (``""`` if unknown).

        Returns:
            ``Triplet(prompt={"token_ids", "raw_content", "image_urls"}, response={"token_ids", "raw_content"[,
            "logprobs"]}, metadata={"request", "response", "response_id", "agent_name"})``.
        """
        attrs = dict(span.attributes)
        prompt_ids = _first_token_ids(span, _PROMPT_TOKEN_KEYS) or []
        response_ids = _first_token_ids(span, _RESPONSE_TOKEN_KEYS) or []
        prompt_raw = _unflatten_first(attrs, (GEN_AI_PROMPT, f"{_OPERATION_INPUT}.messages"))
        response_raw = _unflatten_first(attrs, (GEN_AI_COMPLETION, f"{_OPERATION_OUTPUT}.choices"))

        request = _unflatten_first(attrs, ("gen_ai.request", _OPERATION_INPUT))
        if isinstance(request, dict):
            request.pop("messages", None)
        response_meta = _unflatten_first(attrs, ("gen_ai.response", _OPERATION_OUTPUT))
        if isinstance(response_meta, dict):
            for key in ("choices", "prompt_token_ids", "response_token_ids"):
                response_meta.pop(key, None)

        response: Dict[str, Any] = {"token_ids": response_ids, "raw_content": response_raw}
        logprobs = _response_logprobs(span)
        if logprobs is not None:
            response["logprobs"] = logprobs
        return Triplet(
            prompt={
                "token_ids": prompt_ids,
                "raw_content": prompt_raw,
                "image_urls": self.extract_prompt_image_urls(prompt_raw),
            },
            response=response,
            reward=None,
            metadata={
                "request": request if request is not None else {},
                "response": response_meta if response_meta is not None else {},
                "response_id": _response_id(span),
                "agent_name": agent_name,
            },
        )

    def to_trajectory(
        self,
        llm_call_match: str = DEFAULT_LLM_CALL_MATCH,
        agent_match: Optional[str] = None,
        exclude_llm_call_in_reward: bool = True,
        dedup_llm_call: bool = True,
        reward_match: RewardMatchPolicy = RewardMatchPolicy.FIRST_OCCURRENCE,
        final_reward: Optional[float] = None,
        _skip_empty_token_spans: bool = False,
    ) -> List[Triplet]:
        """The triplets of the tree's LLM calls, in depth-first order, with rewards assigned.

        Args:
            llm_call_match: Regex on span names identifying LLM calls.
            agent_match: Regex selecting the agents whose calls are kept (None keeps all).
            exclude_llm_call_in_reward: Skip LLM calls made inside reward spans (e.g. an LLM judge).
            dedup_llm_call: Keep one call per response id (instrumentations at several levels may record the same
                call).
            reward_match: How rewards are assigned to calls.
            final_reward: If given, overrides the reward of the last triplet.
            _skip_empty_token_spans: Drop calls without prompt or response token ids.

        Returns:
            The triplets.
        """
        calls = self.find_llm_calls(
            llm_call_match=llm_call_match,
            agent_match=agent_match,
            within_reward=False if exclude_llm_call_in_reward else None,
            within_llm_call=False if dedup_llm_call else None,
        )
        pairs = [(node, self.span_to_triplet(node.span, agent)) for node, agent in calls]
        if _skip_empty_token_spans:
            pairs = [(n, t) for n, t in pairs if t.prompt["token_ids"] and t.response["token_ids"]]
        rewards = self.match_rewards(reward_match, [node for node, _ in pairs])
        triplets: List[Triplet] = []
        for node, triplet in pairs:
            triplet.reward = rewards.get(node.id)
            triplets.append(triplet)
        if final_reward is not None and triplets:
            triplets[-1].reward = final_reward
        return triplets


# -- adapters -------------------------------------------------------------------------------------------------------


_LANGCHAIN_CHAIN = "langchain.Chain."
_LANGCHAIN_COMPOSITION = re.compile(r"Runnable[A-Z]\w*")


def _is_langchain_composition(span: Span) -> bool:
    """Whether the span is one of LangChain's or LangGraph's anonymous building blocks (``RunnableSequence``,
    ``RunnableLambda``, ``RunnableCallable``...: ``prompt | model`` inside a graph node), which names no agent of its
    own: the calls inside it belong to the node or agent that runs it."""
    if not span.name.startswith(_LANGCHAIN_CHAIN):
        return False
    name = span.attributes.get("lc_name")
    name = name if isinstance(name, str) and name else span.name[len(_LANGCHAIN_CHAIN) :]
    return _LANGCHAIN_COMPOSITION.fullmatch(name) is not None


def _own_agent_name(span: Span) -> Optional[str]:
    """The agent name an LLM-call record carries itself (the gateway copies it from the request's header)."""
    name = span.attributes.get(LLM_AGENT_NAME)
    return name if isinstance(name, str) and name else None


def calls_under_their_twins(spans: Sequence[Span]) -> List[Span]:
    """The spans, with each record of an LLM call that has no parent moved under another record of the same call.

    The gateway records a call in a trace of its own, without a parent, and :meth:`TraceTree.repair_hierarchy` would
    put it under the tightest span enclosing it in time: when agents call the LLM at the same moment, that can be
    another agent's call. A record of the same call made where the call was made (the OpenAI SDK's, with the same call
    id or, without one, the same response id: :mod:`agentbolt.adapter.calls`) knows its place; the tightest such
    record becomes the parent. The spans given are not changed (moved ones are copies).
    """
    twins: Dict[str, Span] = {}
    for span in spans:
        if span.parent_id is None:
            continue
        for key in stored_keys(*call_identity(span.attributes, _RESPONSE_ID_KEYS)):
            current = twins.get(key)
            if current is None or _duration(span) < _duration(current):
                twins[key] = span
    if not twins:
        return list(spans)
    placed: List[Span] = []
    for span in spans:
        if span.parent_id is None:
            keys = matching_keys(*call_identity(span.attributes, _RESPONSE_ID_KEYS))
            twin = next((twins[key] for key in keys if key in twins), None)
            if twin is not None and twin.span_id != span.span_id:
                span = span.model_copy(update={"parent_id": twin.span_id})
        placed.append(span)
    return placed


def _duration(span: Span) -> float:
    return _time_or(span.end_time, float("inf")) - _time_or(span.start_time, float("-inf"))


def _to_spans(source: Sequence[Union[Span, ReadableSpan]]) -> List[Span]:
    return [s if isinstance(s, Span) else Span.from_opentelemetry(s, "dummy", "dummy", 0) for s in source]


class TracerTraceToTriplet(TraceToTripletBase):
    """Triplets from the agent-side tracer's spans: one per LLM call, rewards from reward spans.

    Args:
        repair_hierarchy: Re-attach spans that lost their parent to the span enclosing them in time.
        llm_call_match: Regex (``re.search``) on span names identifying LLM calls. The default,
            ``openai\\.chat\\.completion``, matches the OpenAI SDK instrumentation's chat completions; its legacy text
            completions (``client.completions.create``) are ``openai.completion`` spans, which
            ``r"openai\\.(chat\\.)?completion"`` matches too.
        agent_match: Regex searched in agent names; only calls made by matching agents are kept (None keeps all,
            see :mod:`agentbolt.adapter.agent_match`). This selects which agents of a multi-agent system are trained.
        exclude_llm_call_in_reward: Skip LLM calls made inside reward computations.
        reward_match: How reward spans are assigned to LLM calls.
        _skip_empty_token_spans: Drop calls without prompt or response token ids.
    """

    tree_type: Type[TraceTree] = TraceTree
    """The trace tree the spans are read into; a subclass of :class:`TraceTree` may build its triplets otherwise."""

    def __init__(
        self,
        repair_hierarchy: bool = True,
        llm_call_match: str = DEFAULT_LLM_CALL_MATCH,
        agent_match: Optional[str] = None,
        exclude_llm_call_in_reward: bool = True,
        reward_match: RewardMatchPolicy = RewardMatchPolicy.FIRST_OCCURRENCE,
        _skip_empty_token_spans: bool = False,
    ) -> None:
        self.repair_hierarchy = repair_hierarchy
        self.llm_call_match = llm_call_match
        self.agent_match = agent_match
        self.exclude_llm_call_in_reward = exclude_llm_call_in_reward
        self.reward_match = RewardMatchPolicy(reward_match)
        self._skip_empty_token_spans = _skip_empty_token_spans
        re.compile(llm_call_match)  # fail early on an invalid regex
        compile_agent_match(agent_match)

    def _tree(self, source: Sequence[Union[Span, ReadableSpan]]) -> TraceTree:
        spans = _to_spans(source)
        if not self.repair_hierarchy:
            return self.tree_type.from_spans(spans)
        tree = self.tree_type.from_spans(calls_under_their_twins(spans))
        tree.repair_hierarchy()
        return tree

    def adapt(self, source: Sequence[Union[Span, ReadableSpan]], /) -> List[Triplet]:  # type: ignore[override]
        """Convert the spans of one rollout (store spans or OpenTelemetry spans) into triplets.

        Args:
            source: The spans; an empty trace gives no triplets.

        Returns:
            The triplets in the trace tree's depth-first (pre-)order: call order for calls made one after another;
            the calls of agents running at once come grouped by their place in the tree (each agent's in order).
        """
        source = span_list(source)
        if not source:
            return []
        return self._tree(source).to_trajectory(
            llm_call_match=self.llm_call_match,
            agent_match=self.agent_match,
            exclude_llm_call_in_reward=self.exclude_llm_call_in_reward,
            reward_match=self.reward_match,
            _skip_empty_token_spans=self._skip_empty_token_spans,
        )

    def visualize(
        self,
        source: Sequence[Union[Span, ReadableSpan]],
        /,
        filename: str = "trace_tree",
        interested_span_match: Optional[str] = None,
    ) -> TraceTree:
        """Build (and repair) the tree of ``source``, render it to ``<filename>.png`` and return it."""
        tree = self._tree(source)
        tree.visualize(filename, interested_span_match=interested_span_match)
        return tree


_GATEWAY_SPAN_MATCH = r"^(raw_gen_ai_request|litellm_request|" + re.escape(AGL_LLM_CALL) + r")$"
_VLLM = "llm.hosted_vllm"


def _literal(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return ast.literal_eval(value.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            try:
                return json.loads(value)
            except (ValueError, RecursionError):
                return None
    return value


def _request_parameters(span: Span) -> Dict[str, Any]:
    """The request's scalar ``gen_ai.request.<name>`` attributes (model and sampling parameters), by name."""
    prefix = "gen_ai.request."
    return {
        key[len(prefix) :]: value
        for key, value in span.attributes.items()
        if key.startswith(prefix) and "." not in key[len(prefix) :]
    }


def _gateway_token_ids(span: Span) -> Tuple[Optional[List[int]], Optional[List[int]]]:
    attrs = span.attributes
    if span.name == "raw_gen_ai_request":
        prompt = _first_token_ids(span, (f"{_VLLM}.prompt_token_ids",))
        response: Optional[List[int]] = None
        nested = _literal(attrs.get(f"{_VLLM}.response_token_ids"))
        if isinstance(nested, (list, tuple)) and nested:
            response = _as_token_ids(nested[0])
        if response is None:
            choices = _literal(attrs.get(f"{_VLLM}.choices"))
            if isinstance(choices, (list, tuple)) and choices and isinstance(choices[0], dict):
                response = _as_token_ids(choices[0].get("token_ids"))
        return prompt, response
    return _first_token_ids(span, (PROMPT_TOKEN_IDS,)), _first_token_ids(span, (RESPONSE_TOKEN_IDS,))


class LlmProxyTraceToTriplet(TraceToTripletBase):
    """Triplets from LLM-gateway spans, with token ids (and logprobs) exactly as the backend produced them.

    Reads agentbolt gateway spans (``agentbolt.llm_call``, see the module docs) and the reference LiteLLM proxy's
    ``raw_gen_ai_request`` / ``litellm_request`` spans. Calls are ordered by sequence id and de-duplicated by
    response id; each reward span goes to the latest earlier call without a reward (spans of equal sequence ids, as a
    tracer counting ids on its own may write, are ordered by start time).

    Args:
        agent_match: Regex searched in agent names; only matching agents' calls are kept (None keeps all, see
            :mod:`agentbolt.adapter.agent_match`). A call's agent is the span's ``agentbolt.llm.agent_name`` or,
            when absent, the nearest enclosing agent span of the rollout's tracer spans (by parent link, or by time
            when the gateway span has no parent).
    """

    def __init__(self, agent_match: Optional[str] = None) -> None:
        self.agent_match = agent_match
        compile_agent_match(agent_match)  # fail early on an invalid regex

    def adapt(self, source: Sequence[Span], /) -> List[Triplet]:
        """Convert the spans of one rollout into triplets, in call order.

        Args:
            source: The rollout's spans (gateway spans, plus tracer spans for rewards and agent structure).

        Returns:
            One triplet per LLM call that has both prompt and response token ids (calls without them are skipped,
            with a warning counting them). Its ``metadata`` holds ``response_id``, ``agent_name`` and ``request`` (the request's model and sampling parameters, e.g.
            ``{"model": ..., "temperature": 0.7}``).
        """
        source = span_list(source)
        if not source:
            return []
        spans = sorted(source, key=lambda s: (s.sequence_id, _time_or(s.start_time, 0.0)))
        tree = TraceTree.from_spans(calls_under_their_twins(spans))
        tree.repair_hierarchy()
        call_agents = {
            node.id: agent
            for node, agent in tree.find_llm_calls(llm_call_match=_GATEWAY_SPAN_MATCH, agent_match=self.agent_match)
        }

        triplets: List[Triplet] = []
        # Spans are in sequence order (then start time, for spans of equal sequence ids): the calls before a reward
        # that are still without one wait on a stack, the latest on top.
        waiting: List[Triplet] = []
        without_token_ids = 0
        identities = CallIdentities()
        for span in spans:
            if span.span_id in call_agents:
                prompt_ids, response_ids = _gateway_token_ids(span)
                if prompt_ids is None or response_ids is None:
                    without_token_ids += 1
                    continue
                call_id, request_id = call_identity(span.attributes, (GEN_AI_RESPONSE_ID, f"{_VLLM}.id"))
                if not identities.claim(call_id, request_id):
                    continue
                response: Dict[str, Any] = {"token_ids": response_ids}
                logprobs = _as_float_list(span.attributes.get(RESPONSE_LOGPROBS))
                if logprobs is not None:
                    response["logprobs"] = logprobs
                prompt: Dict[str, Any] = {"token_ids": prompt_ids}
                image_urls = TraceTree.extract_prompt_image_urls(_unflatten_first(span.attributes, (GEN_AI_PROMPT,)))
                if image_urls:
                    prompt["image_urls"] = image_urls
                triplet = Triplet(
                    prompt=prompt,
                    response=response,
                    metadata={
                        "response_id": request_id,
                        "agent_name": call_agents[span.span_id],
                        "request": _request_parameters(span),
                    },
                )
                triplets.append(triplet)
                waiting.append(triplet)
                continue
            value = span_reward_value(span)
            if value is None:
                continue
            if waiting:
                waiting.pop().reward = value
            else:
                logger.debug(
                    "Reward %s (span %s, sequence id %s) goes to no LLM call: none before it is without a reward",
                    value,
                    span.span_id,
                    span.sequence_id,
                )

        if without_token_ids:
            logger.warning(
                "%d LLM call(s) of rollout %s were skipped: their spans have no valid prompt and response token ids "
                "(an errored or cut-off call, or a backend that does not return token ids).",
                without_token_ids,
                spans[0].rollout_id,
            )
        return triplets
