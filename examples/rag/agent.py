"""The rag agent: OpenAI-SDK chat calls with the ``retrieve`` tool of an MCP server over the local corpus.

The model searches with a query of its own, reads the passage the tool returns and answers on a last line
``ANSWER: <answer>``. Two worked conversations come first (question, ``retrieve`` call, passage, answer), about
entities of the training split. The training reward is the answer's token F1 against the gold answers, counted
only for an answer no longer than the gold answer (:func:`training_f1`); held-out rollouts emit exact match (the
primary score, so GRPO's ``val/accuracy`` is EM) and SQuAD's F1.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional

import agentbolt as agl
from examples.common.chat import McpToolAgent, worked_tool_call
from examples.common.rewards import join_digit_groups
from examples.rag.corpus import QATask, exact_match, f1_score, normalize_answer

__all__ = ["SERVER_SCRIPT", "SYSTEM_PROMPT", "RagAgent", "answer_scores", "few_shot", "parse_answer", "training_f1"]

SERVER_SCRIPT = Path(__file__).resolve().with_name("retriever_server.py")
SYSTEM_PROMPT = (
    "You answer questions about an encyclopedia. Call the retrieve tool with the name the question is about, read "
    "the passage, then reply with exactly 'ANSWER: <answer>' using words from the passage."
)
MAX_ANSWER_WORDS = 6
"""Longer answers score 0: every gold answer has at most three words, and length is how a reply games F1."""

_ANSWER_LINE = re.compile(r"ANSWER:\s*(.+?)\s*\.?\s*", re.IGNORECASE)
_SEVERAL = re.compile(r",|;|/|\bor\b|\band\b", re.IGNORECASE)


def few_shot() -> List[Dict[str, Any]]:
    """Two worked conversations (their entities are not in the corpus, so they leak nothing)."""
    first = worked_tool_call(
        "call_example_1", "In what year was Brennholt founded?", "retrieve", {"query": "Brennholt"},
        "Brennholt: Brennholt is a town on the Sarvel river. It was founded in 1433 by Ida Morrow. Brennholt is "
        "known for its oak barrels.",
        "ANSWER: 1433",
    )  # fmt: skip
    second = worked_tool_call(
        "call_example_2", "What did Tam Eskel build first?", "retrieve", {"query": "Tam Eskel"},
        "Tam Eskel: Tam Eskel was an engineer born in Coldwick. In 1801, Tam Eskel built the first river dredge.",
        "ANSWER: river dredge",
    )  # fmt: skip
    return first + second


def parse_answer(text: Optional[str]) -> Optional[str]:
    """The one answer the reply commits to: its last non-empty line, ``ANSWER: <answer>``.

    None when ``ANSWER:`` appears more than once (several answers), when the last line is not an answer line, or
    when the answer lists several candidates (commas, ``or``, ``and``, slashes) or is longer than
    :data:`MAX_ANSWER_WORDS` words. A number's digit-group commas are not a list: ``1,262`` is read as ``1262``.
    """
    if not text or text.upper().count("ANSWER:") != 1:
        return None
    match = _ANSWER_LINE.fullmatch(text.strip().splitlines()[-1].strip())
    if match is None:
        return None
    answer = join_digit_groups(match.group(1).strip())
    if not answer or _SEVERAL.search(answer) or len(answer.split()) > MAX_ANSWER_WORDS:
        return None
    return answer


def answer_scores(reply: Optional[str], task: QATask) -> Dict[str, float]:
    """``{"em", "f1"}`` of the reply's committed answer against the task's gold answers (0 without one)."""
    answer = parse_answer(reply)
    return {"em": exact_match(answer, task["answers"]), "f1": f1_score(answer, task["answers"])}


def training_f1(reply: Optional[str], task: QATask) -> float:
    """The training reward's answer score: the token F1 of the reply's committed answer, or 0 when that answer has
    more words (after SQuAD normalisation) than the longest gold answer.

    SQuAD's F1 pays a list: ``1262 1263`` scores 0.67 against ``1262``, and so do two names against one, so listing
    two candidates would earn more on average than committing to the likelier one. Within the gold answer's length
    a list earns at most what committing earns (each extra candidate's words displace the answer's own), so the
    partial credit of F1 stays for a partly right answer (``Greta`` for ``Greta Vibeth``) and no longer for a list.
    Held-out F1 (:func:`answer_scores`) stays SQuAD's.
    """
    answer = parse_answer(reply)
    if answer is None:
        return 0.0
    longest = max((len(normalize_answer(gold).split()) for gold in task["answers"]), default=0)
    return f1_score(answer, task["answers"]) if len(normalize_answer(answer).split()) <= longest else 0.0


class RagAgent(McpToolAgent[QATask]):
    """The rag agent as a ``LitAgent``.

    Args:
        format_credit: Training-only credit for a retrieval that returned a passage when the answer scores 0.
        max_turns: LLM calls per conversation at most.
        max_tokens: Completion budget per call.
    """

    system_prompt = SYSTEM_PROMPT
    server_script = SERVER_SCRIPT

    def few_shot(self) -> List[Dict[str, Any]]:
        """The two worked conversations of :func:`few_shot`."""
        return few_shot()

    async def training_rollout_async(self, task: QATask, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        """A training conversation: the answer's :func:`training_f1`, or the format credit for a useful retrieval
        when it is 0."""
        episode = await self.episode(task, resources, rollout)
        f1 = training_f1(episode.reply, task)
        retrieved = any(name == "retrieve" and not result.startswith(("error", "no passage"))
                        for name, _, result in episode.tool_calls)  # fmt: skip
        return f1 if f1 > 0 else self.format_credit * float(retrieved)

    async def validation_rollout_async(self, task: QATask, resources: agl.NamedResources, rollout: agl.Rollout) -> None:
        """A held-out conversation: emits exact match (primary) and F1."""
        episode = await self.episode(task, resources, rollout)
        agl.emit_reward(answer_scores(episode.reply, task), primary_key="em")
