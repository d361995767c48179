"""ParetoAPO: reflective prompt evolution over a Pareto front of candidates (in the spirit of GEPA).

Every accepted candidate is scored task by task on the whole validation set. The *front* holds the candidates that
are best on at least one validation task and dominated by no other (another at least as good on every task and
better on one). Each round:

1. draw a parent from the front, with odds proportional to the number of tasks it is best on;
2. run it on a minibatch of training tasks and show the optimizer model the complete records (every message,
   tool call and tool result, the reward, the status and any feedback the agent emitted with ``emit_message``);
   the model answers with a rewritten template (*reflective mutation*);
3. run the child on the same minibatch; only a child that does strictly better than its parent there is scored on
   the validation set and joins the pool (the others are stored with their minibatch scores and dropped);
4. every ``merge_every`` rounds, two front candidates that win on different tasks are merged by the optimizer
   model into one template, accepted on the same minibatch rule against the better parent.

The best prompt is the pool's candidate with the highest mean validation score. Unlike a single score, the front
keeps prompts that are the only ones to solve some tasks, so their instructions survive into later mutations.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from agentbolt.types import PromptTemplate

from .optimizer import check_temperature
from .prompts import (
    MERGE_CONTEXT,
    MERGE_PROMPT_FILES,
    REFLECT_CONTEXT,
    REFLECT_PROMPT_FILES,
    extract_template_text,
    format_experiments,
)
from .search import PromptSearch, VersionedPromptTemplate
from .templates import format_placeholders

__all__ = ["ParetoAPO", "pareto_front"]


def pareto_front(scores: Mapping[str, Mapping[str, float]]) -> Dict[str, List[str]]:
    """The Pareto front of candidates scored task by task, with the tasks each one is best on.

    A task on which every candidate scores the same, 0 or less, tells nothing and is ignored (with rewards of 0 or
    more: a task nobody solved; with negative rewards, a task whose top score is 0 or less still counts when the
    candidates differ on it). A candidate is on the front when it has the top
    score on at least one task and no other candidate dominates it (at least as good on every task, better on
    one); a missing score counts as 0.

    Args:
        scores: Candidate -> task key -> reward.

    Returns:
        Front candidate -> sorted task keys it is best on (ties count for every tied candidate).
    """
    tasks = sorted({task for per_task in scores.values() for task in per_task})

    def score(candidate: str, task: str) -> float:
        return scores[candidate].get(task, 0.0)

    wins: Dict[str, List[str]] = {candidate: [] for candidate in scores}
    for task in tasks:
        top = max(score(c, task) for c in scores)
        if top <= 0 and all(score(c, task) == top for c in scores):
            continue
        for candidate in scores:
            if score(candidate, task) == top:
                wins[candidate].append(task)

    def dominates(a: str, b: str) -> bool:
        at_least = all(score(a, t) >= score(b, t) for t in tasks)
        return at_least and any(score(a, t) > score(b, t) for t in tasks)

    return {
        candidate: won
        for candidate, won in wins.items()
        if won and not any(dominates(other, candidate) for other in scores if other != candidate)
    }


class ParetoAPO(PromptSearch):
    """Reflective prompt evolution keeping a Pareto front of prompts (see the module description).

    Args:
        async_openai_client: Client of the optimizer model (``openai.AsyncOpenAI`` or compatible).
        reflection_model: Model that reflects on traces and merges prompts.
        temperature: Sampling temperature of the optimizer calls (0 to 2, the OpenAI API's range).
        reflection_batch_size: Training tasks per minibatch (shown to the model and used to accept a child).
        rounds: Mutation rounds.
        merge_every: Try a merge every this many rounds (0: never).
        reflect_prompt_files: Reflection prompt files (POML); default ships one.
        merge_prompt_files: Merge prompt files (POML); default ships one.
        **search_options: Options of :class:`~agentbolt.algorithm.apo.search.PromptSearch` (``run_id``,
            ``resume``, ``max_optimizer_tokens``, ``max_rollouts``, ``rollout_batch_timeout``, ``seed``...).
    """

    log_name = "agentbolt.algorithm.apo.pareto"

    def __init__(
        self,
        async_openai_client: Any,
        *,
        reflection_model: str = "gpt-5-mini",
        temperature: float = 1.0,
        reflection_batch_size: int = 4,
        rounds: int = 8,
        merge_every: int = 3,
        reflect_prompt_files: Optional[List[Path]] = None,
        merge_prompt_files: Optional[List[Path]] = None,
        **search_options: Any,
    ) -> None:
        self._check_counts(1, reflection_batch_size=reflection_batch_size)
        self._check_counts(0, rounds=rounds, merge_every=merge_every)
        check_temperature(temperature, "temperature")
        super().__init__(async_openai_client, **search_options)
        self.reflection_model = reflection_model
        self.temperature = temperature
        self.reflection_batch_size = reflection_batch_size
        self.rounds = rounds
        self.merge_every = merge_every
        self.reflect_prompt_files = self._prompt_files(
            reflect_prompt_files, REFLECT_PROMPT_FILES, names=REFLECT_CONTEXT, option="reflect_prompt_files"
        )
        self.merge_prompt_files = self._prompt_files(
            merge_prompt_files, MERGE_PROMPT_FILES, names=MERGE_CONTEXT, option="merge_prompt_files"
        )

    def _reset_run_state(self) -> None:
        super()._reset_run_state()
        self.pool: Dict[str, VersionedPromptTemplate] = {}
        self.val_scores: Dict[str, Dict[str, float]] = {}

    def _needs_optimizer(self) -> bool:
        return self.rounds > 0

    def front(self) -> Dict[str, List[str]]:
        """The current Pareto front: candidate version -> validation tasks it is best on."""
        return pareto_front(self.val_scores)

    def _prefix(self, round_num: int, version: Optional[str] = None) -> str:
        return f"[Round {round_num:02d}" + (f" | Prompt {version}]" if version else "]")

    async def _ask(self, path: Path, context: Dict[str, Any], purpose: str, like: PromptTemplate) -> Optional[str]:
        """The template the optimizer model writes for ``context`` (placeholders shown in ``like``'s syntax)."""
        placeholders = format_placeholders(self._placeholders, like.engine)
        messages = await self._render(path, {**context, "placeholders": placeholders})
        reply = await self.optimizer.chat(
            model=self.reflection_model,
            messages=messages,
            temperature=self.temperature,
            purpose=purpose,
            option="reflection_model",
        )
        return extract_template_text(reply, usable=lambda text: self._keeps_placeholders(text, like))

    async def _admit(self, candidate: VersionedPromptTemplate, val: Sequence[Tuple[str, Any]], prefix: str) -> None:
        evaluation = await self._validate_full(candidate, val, prefix=prefix)
        self.pool[candidate.version] = candidate
        self.val_scores[candidate.version] = evaluation.by_task()
        front = self.front()
        summary = ", ".join(f"{v} best on {len(t)}" for v, t in sorted(front.items()))
        self._log(logging.INFO, f"Pareto front: {summary or '(empty: no task solved yet)'}.", prefix=prefix)

    def _pick_parent(self) -> VersionedPromptTemplate:
        front = self.front()
        if not front:  # nothing solved yet: mutate the best-scoring candidate
            best = max(self.pool.values(), key=lambda c: c.score or 0.0)
            return best
        versions = sorted(front)
        weights = [len(front[v]) for v in versions]
        return self.pool[self.rng.choices(versions, weights=weights, k=1)[0]]

    async def _reflect(self, parent: VersionedPromptTemplate, batch: Sequence[Tuple[str, Any]], round_num: int) -> None:
        prefix = self._prefix(round_num, parent.version)
        parent_eval = await self.evaluate(parent, batch, mode="train", purpose="train", prefix=prefix)
        path = self.rng.choice(self.reflect_prompt_files)
        text = await self._ask(
            path,
            {
                "prompt_template": parent.prompt_template.template,
                "experiments": [{k: v for k, v in r.items() if k != "spans"} for r in parent_eval.results],
                "experiments_text": format_experiments(parent_eval.results),
            },
            "reflection",
            parent.prompt_template,
        )
        child = self._candidate_from_text(text, parent.prompt_template, prefix=prefix)
        if child is None:
            return
        child.lineage = {
            "origin": "reflection",
            "parents": [parent.version],
            "note": f"reflected on {len(batch)} training runs scoring {parent_eval.mean:.3f}",
            "round": round_num,
        }
        await self._accept_if_better(child, batch, parent_eval.mean, round_num)

    async def _accept_if_better(
        self, child: VersionedPromptTemplate, batch: Sequence[Tuple[str, Any]], bar: float, round_num: int
    ) -> None:
        prefix = self._prefix(round_num, child.version)
        child_eval = await self.evaluate(child, batch, mode="train", purpose="train", prefix=prefix)
        if child_eval.mean <= bar:
            self._log(
                logging.INFO,
                f"Rejected: {child_eval.mean:.3f} on the minibatch, not above {bar:.3f}.",
                prefix=prefix,
            )
            return
        self._log(logging.INFO, f"Accepted: {child_eval.mean:.3f} on the minibatch (> {bar:.3f}).", prefix=prefix)
        await self._admit(child, self._val, prefix)

    def _merge_pair(self) -> Optional[Tuple[VersionedPromptTemplate, VersionedPromptTemplate]]:
        front = self.front()
        best: Optional[Tuple[int, str, str]] = None
        versions = sorted(front)
        for i, a in enumerate(versions):
            for b in versions[i + 1 :]:
                complementary = len(set(front[a]) ^ set(front[b]))
                if best is None or complementary > best[0]:
                    best = (complementary, a, b)
        if best is None or best[0] == 0:
            return None
        return self.pool[best[1]], self.pool[best[2]]

    async def _merge(self, batch: Sequence[Tuple[str, Any]], round_num: int) -> None:
        pair = self._merge_pair()
        if pair is None:
            self._log(logging.INFO, "No two front candidates to merge.", prefix=self._prefix(round_num))
            return
        a, b = pair
        front = self.front()
        path = self.rng.choice(self.merge_prompt_files)
        text = await self._ask(
            path,
            {
                "template_a": a.prompt_template.template,
                "template_b": b.prompt_template.template,
                "wins_a": len(front.get(a.version, [])),
                "wins_b": len(front.get(b.version, [])),
            },
            "merge",
            a.prompt_template,
        )
        child = self._candidate_from_text(text, a.prompt_template, prefix=self._prefix(round_num))
        if child is None:
            return
        child.lineage = {
            "origin": "merge",
            "parents": [a.version, b.version],
            "note": f"merge of {a.version} and {b.version}",
            "round": round_num,
        }
        bars = []
        for parent in (a, b):
            evaluation = await self.evaluate(
                parent, batch, mode="train", purpose="train", prefix=self._prefix(round_num, parent.version)
            )
            bars.append(evaluation.mean)
        await self._accept_if_better(child, batch, max(bars), round_num)

    async def _search(self, seed: PromptTemplate, train: List[Tuple[str, Any]], val: List[Tuple[str, Any]]) -> None:
        """Evolve the prompt from the seed, or from the stored pool with ``resume``."""
        self._val = val
        first_round = 1
        if self.resume:
            first_round = await self._restore_pool() + 1
        if not self.pool:
            seed_version = self._create_seed_version(seed)
            await self._admit(seed_version, self._val, self._prefix(0, seed_version.version))
        for round_num in range(first_round, self.rounds + 1):
            self.current_round = round_num
            batch = self.rng.sample(train, min(self.reflection_batch_size, len(train)))
            if self.merge_every and round_num % self.merge_every == 0 and len(self.front()) >= 2:
                await self._merge(batch, round_num)
            else:
                await self._reflect(self._pick_parent(), batch, round_num)

    _val: List[Tuple[str, Any]] = []

    async def _restore_pool(self) -> int:
        """Rebuild the pool from the stored run; returns the last round it reached."""
        records = await self._resume_state()
        last_round = 0
        for record in records:
            last_round = max(last_round, record.round, record.validated_in_round)
            full = self._stored_full_val(record)
            if record.template is None or full is None:
                continue
            candidate = VersionedPromptTemplate(
                record.version, record.template, sum(full.values()) / len(full), self._lineage_of(record)
            )
            self.pool[record.version] = candidate
            self.val_scores[record.version] = full
        return last_round
