"""FewShotAPO: add worked examples, taken from the agent's own best training runs, to the prompt.

Small models follow an example far better than an instruction, and writing a useful critique is beyond them, so
this optimizer needs no optimizer model at all:

1. *Bootstrap*: run the seed prompt on ``bootstrap_tasks`` training tasks (``bootstrap_repeats`` times each, so a
   sampling agent gets several chances) and keep the runs whose reward reaches ``demo_min_reward``, best first, one
   per task. Each becomes a demonstration: the conversation the adapter extracted (the request, the tool calls with
   their arguments, the tool results, the final answer), written as text.
2. *Search*: build ``num_candidate_sets`` candidate prompts, each the seed followed by a different selection of 1
   to ``max_demos`` demonstrations (the first: the top ones; the rest: random draws, favouring high rewards); score
   them all on one shared validation batch, then the ``finalists`` best on the full validation set.

The best prompt is the seed or the candidate with the highest full-validation score.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple

from agentbolt.types import Dataset, PromptTemplate

from .prompts import conversation_of
from .search import PromptSearch, RolloutResultForAPO, VersionedPromptTemplate, keyed
from .templates import escape_literal

__all__ = ["Demonstration", "FewShotAPO", "render_demonstration"]


@dataclass
class Demonstration:
    """One worked example.

    Attributes:
        task_key: Index of its training task.
        reward: The reward its run earned.
        text: The example as it is written into the prompt.
    """

    task_key: str
    reward: float
    text: str


def _static_lines(template: PromptTemplate) -> set[str]:
    """Lines of the template that hold no placeholder: the instructions, as they appear in every request."""
    lines = set()
    for line in template.template.splitlines():
        if "{" not in line and line.strip():
            lines.add(line.strip())
    return lines


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def render_demonstration(
    messages: Sequence[Mapping[str, Any]], seed: PromptTemplate, *, max_chars: int = 600
) -> Optional[str]:
    """Write a conversation as an example: request, tool calls, tool results, answer.

    The request keeps only what differs from the seed template's fixed lines (the task's own data), so an example
    does not repeat the instructions. Tool calls are written ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``.

    Returns:
        The example text, or None when the conversation has no final answer.
    """
    instructions = _static_lines(seed)
    lines: List[str] = []
    answer: Optional[str] = None
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content) if content else ""
        if role in ("system", "developer"):
            continue
        if role == "user":
            kept = [line for line in text.splitlines() if line.strip() and line.strip() not in instructions]
            if kept:
                lines.append("Request: " + _clip("\n".join(kept), max_chars))
        elif role == "tool":
            lines.append("Tool result: " + _clip(text, max_chars))
        elif role == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                arguments = function.get("arguments")
                with contextlib.suppress(json.JSONDecodeError):
                    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
                body = json.dumps({"name": function.get("name"), "arguments": arguments})
                lines.append(f"Assistant: <tool_call>{body}</tool_call>")
            if text.strip():
                answer = text.strip()
                lines.append("Assistant: " + _clip(answer, max_chars))
    return "\n".join(lines) if answer is not None else None


class FewShotAPO(PromptSearch):
    """Few-shot prompt optimization from the agent's own rewarded traces (see the module description).

    Args:
        async_openai_client: Not used (the search asks no optimizer model); accepted so that the three optimizers
            are built alike.
        max_demos: Most demonstrations in one prompt.
        bootstrap_tasks: Training tasks run with the seed to collect demonstrations (at most the training set).
        bootstrap_repeats: Runs per bootstrap task.
        demo_min_reward: Reward a run needs to become a demonstration.
        num_candidate_sets: Candidate selections of demonstrations scored on the validation batch.
        val_batch_size: Validation tasks shared by the candidates.
        finalists: Candidates (best on the batch) scored on the full validation set.
        demo_header: Line introducing the examples in the prompt.
        demo_position: Examples ``before`` (default) or ``after`` the seed's text. Before is safer for small
            models: with the examples last, they tend to continue the list of examples instead of answering.
        max_demo_chars: Longest message text kept in a demonstration.
        **search_options: Options of :class:`~agentbolt.algorithm.apo.search.PromptSearch` (``run_id``,
            ``resume``, ``max_rollouts``, ``rollout_batch_timeout``, ``seed``...).
    """

    log_name = "agentbolt.algorithm.apo.fewshot"

    def __init__(
        self,
        async_openai_client: Any = None,
        *,
        max_demos: int = 3,
        bootstrap_tasks: int = 32,
        bootstrap_repeats: int = 1,
        demo_min_reward: float = 1.0,
        num_candidate_sets: int = 6,
        val_batch_size: int = 16,
        finalists: int = 2,
        demo_header: str = "Examples of solved tasks:",
        demo_position: Literal["before", "after"] = "before",
        max_demo_chars: int = 600,
        **search_options: Any,
    ) -> None:
        for name, value in (
            ("max_demos", max_demos),
            ("bootstrap_tasks", bootstrap_tasks),
            ("bootstrap_repeats", bootstrap_repeats),
            ("num_candidate_sets", num_candidate_sets),
            ("val_batch_size", val_batch_size),
            ("finalists", finalists),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if demo_position not in ("before", "after"):
            raise ValueError(f"demo_position must be 'before' or 'after', got {demo_position!r}")
        super().__init__(async_openai_client, **search_options)
        self.max_demos = max_demos
        self.bootstrap_tasks = bootstrap_tasks
        self.bootstrap_repeats = bootstrap_repeats
        self.demo_min_reward = demo_min_reward
        self.num_candidate_sets = num_candidate_sets
        self.val_batch_size = val_batch_size
        self.finalists = finalists
        self.demo_header = demo_header
        self.demo_position = demo_position
        self.max_demo_chars = max_demo_chars
        self.demonstrations: List[Demonstration] = []

    def collect_demonstrations(
        self, results: Sequence[Tuple[str, float, RolloutResultForAPO]], seed: PromptTemplate
    ) -> List[Demonstration]:
        """The usable demonstrations among bootstrap runs: rewarded enough, one per task, best first.

        Args:
            results: ``(task key, reward, rollout)`` of each bootstrap run.
            seed: The seed template (its fixed lines are left out of each example's request).
        """
        best: Dict[str, Demonstration] = {}
        for key, reward, result in results:
            if reward < self.demo_min_reward or result["status"] != "succeeded":
                continue
            text = render_demonstration(conversation_of(result["messages"]), seed, max_chars=self.max_demo_chars)
            if text is None:
                continue
            current = best.get(key)
            if current is None or (reward, -len(text)) > (current.reward, -len(current.text)):
                best[key] = Demonstration(key, reward, text)
        return sorted(best.values(), key=lambda d: (-d.reward, len(d.text), d.task_key))

    def with_demonstrations(self, seed: PromptTemplate, demos: Sequence[Demonstration]) -> PromptTemplate:
        """``seed`` with ``demos`` written in (escaped so that the engine leaves them verbatim)."""
        blocks = [f"Example {i}:\n{demo.text}" for i, demo in enumerate(demos, start=1)]
        section = escape_literal(self.demo_header + "\n\n" + "\n\n".join(blocks), seed.engine)
        text = f"{seed.template}\n\n{section}" if self.demo_position == "after" else f"{section}\n\n{seed.template}"
        return PromptTemplate(template=text, engine=seed.engine)

    def candidate_selections(self, pool_size: int) -> List[Tuple[int, ...]]:
        """Distinct selections of demonstration indices: the top ones first, then random draws favouring the top."""
        if pool_size == 0:
            return []
        top = tuple(range(min(self.max_demos, pool_size)))
        selections: List[Tuple[int, ...]] = [top]
        weights = [1.0 / (rank + 1) for rank in range(pool_size)]
        attempts = 0
        while len(selections) < self.num_candidate_sets and attempts < 50 * self.num_candidate_sets:
            attempts += 1
            size = self.rng.randint(1, min(self.max_demos, pool_size))
            chosen: List[int] = []
            while len(chosen) < size:
                index = self.rng.choices(range(pool_size), weights=weights, k=1)[0]
                if index not in chosen:
                    chosen.append(index)
            selection = tuple(sorted(chosen))
            if selection not in selections:
                selections.append(selection)
        return selections

    async def _bootstrap(
        self, seed: VersionedPromptTemplate, train: List[Tuple[str, Any]]
    ) -> List[Tuple[str, float, RolloutResultForAPO]]:
        count = min(self.bootstrap_tasks, len(train))
        tasks = self.rng.sample(train, count) * self.bootstrap_repeats
        evaluation = await self.evaluate(seed, tasks, mode="train", purpose="bootstrap", prefix="[Bootstrap]")
        runs = [
            (key, reward, outcome)
            for key, reward, outcome in zip(evaluation.task_keys, evaluation.rewards, evaluation.outcomes, strict=True)
            if outcome is not None
        ]
        self._log(
            logging.INFO,
            f"Seed scores {evaluation.mean:.3f} on {len(tasks)} bootstrap runs; "
            f"{sum(1 for _, r, _ in runs if r >= self.demo_min_reward)} reach reward {self.demo_min_reward}.",
            prefix="[Bootstrap]",
        )
        return runs

    async def run(
        self, train_dataset: Optional[Dataset[Any]] = None, val_dataset: Optional[Dataset[Any]] = None
    ) -> None:
        """Bootstrap demonstrations and search over them; the result is :meth:`get_best_prompt`.

        Raises:
            ValueError: No PromptTemplate in the initial resources, a missing or empty dataset, or an adapter that
                is not TraceToMessages.
        """
        seed = self._set_seed(train_dataset, val_dataset)
        assert train_dataset is not None and val_dataset is not None
        val, train = keyed(val_dataset), keyed(train_dataset)
        async with self._search_session():
            if self.resume:
                await self._resume_state()
            seed_version = self._create_versioned_prompt(seed)
            seed_version.lineage = {"origin": "seed", "parents": [], "round": 0}
            await self._validate_full(seed_version, val, prefix="[Seed]")
            self.current_round = 1
            runs = await self._bootstrap(seed_version, train)
            self.demonstrations = self.collect_demonstrations(runs, seed)
            if not self.demonstrations:
                self._log(
                    logging.WARNING,
                    f"No bootstrap run reached reward {self.demo_min_reward}: no demonstration to add; the seed stays.",
                )
                return
            self._log(logging.INFO, f"{len(self.demonstrations)} demonstration(s) collected.")
            candidates = []
            for selection in self.candidate_selections(len(self.demonstrations)):
                demos = [self.demonstrations[i] for i in selection]
                candidate = self._create_versioned_prompt(self.with_demonstrations(seed, demos))
                candidate.lineage = {
                    "origin": "demonstrations",
                    "parents": [seed_version.version],
                    "note": "demonstrations from training tasks " + ", ".join(d.task_key for d in demos),
                    "round": 1,
                }
                candidates.append(candidate)
            batch = self.rng.sample(val, min(self.val_batch_size, len(val)))
            for candidate in candidates:
                await self.evaluate(
                    candidate, batch, mode="val", purpose="val-batch", prefix=f"[Search | Prompt {candidate.version}]"
                )
            ranked = sorted(candidates, key=lambda c: c.score or 0.0, reverse=True)
            scores = ", ".join(f"{c.version}={c.score:.3f}" for c in ranked)
            self._log(logging.INFO, f"Validation batch scores: {scores}", prefix="[Search]")
            for candidate in ranked[: self.finalists]:
                await self._validate_full(candidate, val, prefix=f"[Final | Prompt {candidate.version}]")
