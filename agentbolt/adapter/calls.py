"""Which spans record the same LLM call, so that one call gives one training sample.

One call can be recorded several times: by the LLM gateway (an ``agentbolt.llm_call`` span), by the OpenAI SDK
instrumentation (``openai.chat.completion``, or ``openai.completion`` for a text completion) and by a framework's
callbacks (LangChain's ``langchain.llm.<name>``).
Two records are of the same call when

* both carry a call id (``agentbolt.llm.call_id``: the ``x-request-id`` of the call's HTTP response, which the
  gateway issues uniquely per call and the SDK instrumentation records as it receives it) and the ids are equal, or
* one of them has no call id and both carry the same response id (``gen_ai.response.id``).

Records with neither id are never merged. Comparing call ids first keeps apart two calls that a backend gave the
same response id (some servers number responses per process, or send none).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from agentbolt.semconv import AGL_LLM_CALL, GEN_AI_RESPONSE_ID, LLM_CALL_ID, PROMPT_TOKEN_IDS
from agentbolt.types import Span

__all__ = ["CallAgentNames", "CallIdentities", "call_identity", "matching_keys", "record_rank", "stored_keys"]

_CALL = "\x00call:"
_RESPONSE_OF_CALL = "\x00response:"


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def call_identity(
    attributes: Mapping[str, Any], response_id_keys: Iterable[str] = (GEN_AI_RESPONSE_ID,)
) -> Tuple[Optional[str], Optional[str]]:
    """``(call_id, response_id)`` of an LLM-call span's attributes (None where absent).

    Args:
        attributes: The span's attributes.
        response_id_keys: Keys holding the response id, the first present wins.
    """
    response_id = next((_text(attributes.get(key)) for key in response_id_keys if _text(attributes.get(key))), None)
    return _text(attributes.get(LLM_CALL_ID)), response_id


class CallIdentities:
    """The LLM calls taken so far, by call id and response id (see the module docstring for the rule).

    Args:
        response_ids: A set to keep the identities in, shared with other holders. Response ids of records without
            a call id are stored in it as they are, so a set of plain response ids (the de-duplication set of
            :meth:`~agentbolt.adapter.triplet.TraceTree.find_llm_calls`) keeps its meaning.
    """

    def __init__(self, response_ids: Optional[Set[str]] = None) -> None:
        self.keys: Set[str] = response_ids if response_ids is not None else set()

    def seen(self, call_id: Optional[str], response_id: Optional[str]) -> bool:
        """Whether a record with these ids is of a call already taken."""
        return any(key in self.keys for key in matching_keys(call_id, response_id))

    def claim(self, call_id: Optional[str], response_id: Optional[str]) -> bool:
        """Take the call of a record: True when it is new (it is remembered), False when it was already taken."""
        if self.seen(call_id, response_id):
            return False
        self.keys.update(stored_keys(call_id, response_id))
        return True


class CallAgentNames:
    """The agent name recorded on some record of each LLM call (the gateway's ``agentbolt.llm.agent_name``), so that
    every record of the call (the OpenAI SDK's, a framework's) is attributed to that agent (same rule as
    :class:`CallIdentities`)."""

    def __init__(self) -> None:
        self._names: Dict[str, str] = {}

    def add(self, call_id: Optional[str], response_id: Optional[str], agent_name: str) -> None:
        """Record the agent of a call (the first name recorded for a call is kept)."""
        for key in stored_keys(call_id, response_id):
            self._names.setdefault(key, agent_name)

    def get(self, call_id: Optional[str], response_id: Optional[str]) -> Optional[str]:
        """The agent name recorded for the call of a record with these ids, if any."""
        return next((self._names[key] for key in matching_keys(call_id, response_id) if key in self._names), None)


def stored_keys(call_id: Optional[str], response_id: Optional[str]) -> List[str]:
    """The keys a record with these ids is remembered by."""
    if call_id is not None:
        return [_CALL + call_id] + ([_RESPONSE_OF_CALL + response_id] if response_id is not None else [])
    return [response_id] if response_id is not None else []


def matching_keys(call_id: Optional[str], response_id: Optional[str]) -> List[str]:
    """The keys whose presence means a record with these ids is of a call already remembered."""
    if call_id is not None:
        return [_CALL + call_id] + ([response_id] if response_id is not None else [])
    return [response_id, _RESPONSE_OF_CALL + response_id] if response_id is not None else []


def record_rank(span: Span) -> int:
    """Which record of a call to keep (lowest first): the gateway's, then other wire-level records (the SDK's,
    which carry the call id or the backend's token ids), then framework callbacks' (rebuilt from the framework's
    own message objects)."""
    if span.name == AGL_LLM_CALL:
        return 0
    if LLM_CALL_ID in span.attributes or PROMPT_TOKEN_IDS in span.attributes:
        return 1
    return 2
