"""The search_r1 agent: multi-turn search-then-answer with ``<search>`` tags, in the style of Search-R1.

The model writes ``<search> query </search>`` to search the local corpus; the agent stops generation at
``</search>``, retrieves the best passage (BM25, :class:`examples.rag.corpus.Retriever`) and sends it back as
``<information> ... </information>``; the model searches again or writes ``<answer> ... </answer>``. Each turn is
one chat call (the conversation grows turn by turn), so GRPO trains every turn in its own context. The reward is
exact match of the committed answer (Search-R1's outcome reward).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import agentbolt as agl
from examples.common.chat import rollout_client
from examples.common.rewards import check_format_credit, join_digit_groups
from examples.rag.corpus import QATask, Retriever, exact_match, f1_score

__all__ = ["SYSTEM_PROMPT", "SearchR1Agent", "Trajectory", "few_shot", "parse_answer", "parse_search", "solve"]

SYSTEM_PROMPT = (
    "Answer the question. To search the encyclopedia, write <search> name </search> and wait for the "
    "<information>. Search again if you need another fact. When you know the answer, write <answer> answer </answer>."
)
STOP = ["</search>", "</answer>"]
_SEARCH = re.compile(r"<search>(.*?)(?:</search>|$)", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_SEVERAL = re.compile(r",|;|/|\bor\b|\band\b", re.IGNORECASE)
MAX_ANSWER_WORDS = 6


def few_shot() -> List[Dict[str, str]]:
    """A one-hop and a two-hop worked conversation about entities that are not in the corpus."""
    coldwick = (
        "Coldwick: Coldwick is a town on the Ambel river. It was founded in 1650 by Ora Lind. Coldwick is known for "
        "its rope nets."
    )
    eskel = "Tam Eskel: Tam Eskel was an engineer born in Coldwick. In 1801, Tam Eskel built the first river dredge."
    return [
        {"role": "user", "content": "Which river is Coldwick on?"},
        {"role": "assistant", "content": "<search> Coldwick </search>"},
        {"role": "user", "content": f"<information> {coldwick} </information>"},
        {"role": "assistant", "content": "<answer> Ambel </answer>"},
        {"role": "user", "content": "Who founded the town where Tam Eskel was born?"},
        {"role": "assistant", "content": "<search> Tam Eskel </search>"},
        {"role": "user", "content": f"<information> {eskel} </information>"},
        {"role": "assistant", "content": "<search> Coldwick </search>"},
        {"role": "user", "content": f"<information> {coldwick} </information>"},
        {"role": "assistant", "content": "<answer> Ora Lind </answer>"},
    ]


def parse_search(text: str) -> Optional[str]:
    """The query of a turn that searches (``<search> q`` up to ``</search>`` or the end), else None."""
    if "<answer>" in text:
        return None
    found = _SEARCH.search(text)
    query = found.group(1).strip() if found else ""
    return query or None


def parse_answer(text: Optional[str]) -> Optional[str]:
    """The one answer a turn commits to, from ``<answer> ... </answer>``.

    None without an answer tag, with several answer tags, with an empty answer, with several candidates (commas,
    ``or``, ``and``, slashes) or with more than :data:`MAX_ANSWER_WORDS` words. A number's digit-group commas are
    not a list: ``1,262`` is read as ``1262``.
    """
    if not text or text.count("<answer>") != 1:
        return None
    found = _ANSWER.search(text)
    answer = join_digit_groups(found.group(1).strip()) if found else ""
    if not answer or _SEVERAL.search(answer) or len(answer.split()) > MAX_ANSWER_WORDS:
        return None
    return answer


@dataclass
class Trajectory:
    """One search-then-answer episode.

    Attributes:
        searches: ``(query, retrieved title)`` of every search, in order.
        answer: The committed answer (None: no valid answer).
        turns: LLM calls made.
        texts: What the model wrote at each turn.
    """

    searches: List[Tuple[str, str]] = field(default_factory=list)
    answer: Optional[str] = None
    turns: int = 0
    texts: List[str] = field(default_factory=list)


async def solve(
    client: Any,
    model: str,
    question: str,
    retriever: Retriever,
    *,
    sampling_parameters: Optional[Dict[str, Any]] = None,
    max_turns: int = 3,
    max_tokens: int = 32,
) -> Trajectory:
    """Run the search loop for one question with an ``openai.AsyncOpenAI`` client.

    Args:
        client: The OpenAI client.
        model: Model name to request.
        question: The question.
        retriever: The search engine.
        sampling_parameters: Extra ``chat.completions.create`` arguments.
        max_turns: LLM calls at most (searches plus the answer).
        max_tokens: Completion budget per call.
    """
    params = {"max_tokens": max_tokens, **dict(sampling_parameters or {}), "stop": STOP}
    messages: List[Dict[str, str]] = [{"role": "system", "content": SYSTEM_PROMPT}, *few_shot()]
    messages.append({"role": "user", "content": question})
    trajectory = Trajectory()
    for _ in range(max_turns):
        response = await client.chat.completions.create(model=model, messages=messages, **params)
        trajectory.turns += 1
        choice = response.choices[0]
        text = (choice.message.content or "").strip()
        trajectory.texts.append(text)
        query = parse_search(text)
        if query is None:
            trajectory.answer = parse_answer(text)
            break
        found = retriever.search(query, top_k=1)
        title, information = (
            (found[0]["title"], f"{found[0]['title']}: {found[0]['text']}") if found else ("", "no result")
        )
        trajectory.searches.append((query, title))
        messages.append({"role": "assistant", "content": f"<search> {query} </search>"})
        messages.append({"role": "user", "content": f"<information> {information} </information>"})
    return trajectory


class SearchR1Agent(agl.LitAgent[QATask]):
    """The search_r1 agent as a ``LitAgent``.

    Args:
        format_credit: Training-only credit for a wrong answer that was well formed after at least one search.
        max_turns: LLM calls per episode at most.
        max_tokens: Completion budget per call.
    """

    def __init__(self, *, format_credit: float = 0.1, max_turns: int = 3, max_tokens: int = 32) -> None:
        super().__init__()
        self.format_credit = check_format_credit(format_credit)
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self._retriever: Optional[Retriever] = None

    @property
    def retriever(self) -> Retriever:
        """The BM25 index over the shipped corpus, built once per runner process."""
        if self._retriever is None:
            self._retriever = Retriever()
        return self._retriever

    async def _trajectory(self, task: QATask, resources: agl.NamedResources, rollout: agl.Rollout) -> Trajectory:
        async with rollout_client(resources, rollout) as (client, llm):
            return await solve(
                client, llm.model, task["question"], self.retriever,
                sampling_parameters=llm.sampling_parameters, max_turns=self.max_turns, max_tokens=self.max_tokens,
            )  # fmt: skip

    async def training_rollout_async(self, task: QATask, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        """A training episode: exact match, or the format credit for a searched, well-formed wrong answer."""
        trajectory = await self._trajectory(task, resources, rollout)
        if exact_match(trajectory.answer, task["answers"]):
            return 1.0
        return self.format_credit if trajectory.answer is not None and trajectory.searches else 0.0

    async def validation_rollout_async(self, task: QATask, resources: agl.NamedResources, rollout: agl.Rollout) -> None:
        """A held-out episode: emits exact match (primary) and F1."""
        trajectory = await self._trajectory(task, resources, rollout)
        scores = {
            "em": exact_match(trajectory.answer, task["answers"]),
            "f1": f1_score(trajectory.answer, task["answers"]),
        }
        agl.emit_reward(scores, primary_key="em")
