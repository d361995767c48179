"""APO: beam search over prompts, each step a textual gradient (a critique of sampled rollouts) and an edit.

Each round samples ``beam_width`` parents from the beam; for each parent and each of ``branch_factor`` branches it
runs the parent on a batch of training tasks, asks the optimizer model to critique the prompt from those runs, then
to rewrite the prompt along the critique. Beam and new candidates are scored on one shared validation batch, the top
``beam_width`` form the next beam, and the beam's leader is scored on the whole validation set: the best prompt is
the one with the highest full-validation score seen.
"""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Iterator, List, Optional, Sequence, Tuple, TypeVar

from agentbolt.algorithm.utils import batch_iter_over_dataset
from agentbolt.types import Dataset, PromptTemplate

from .optimizer import check_temperature
from .prompts import (
    APPLY_EDIT_CONTEXT,
    APPLY_EDIT_PROMPT_FILES,
    GRADIENT_CONTEXT,
    GRADIENT_PROMPT_FILES,
    extract_template_text,
    format_experiments,
)
from .search import (
    CandidateRecord,
    PromptSearch,
    RolloutResultForAPO,
    VersionedPromptTemplate,
    keyed,
    template_key,
)
from .templates import format_placeholders

try:  # the contract reaches POML through this module attribute (poml.poml, poml.set_trace)
    import poml
except ImportError:  # rendering falls back to the plain renderer of .prompts
    poml = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from agentbolt.types import Rollout

__all__ = [
    "APO",
    "APPLY_EDIT_PROMPT_FILES",
    "GRADIENT_PROMPT_FILES",
    "RolloutResultForAPO",
    "VersionedPromptTemplate",
    "batch_iter_over_dataset",
]

T_task = TypeVar("T_task")
logger = logging.getLogger(__name__)

KeyedBatches = Iterator[Sequence[Tuple[str, Any]]]


class APO(PromptSearch, Generic[T_task]):
    """Automatic prompt optimization by beam search with textual gradients.

    Args:
        async_openai_client: Client of the optimizer model (``openai.AsyncOpenAI`` or compatible): a hosted model,
            ``agentbolt serve`` or the gateway.
        gradient_model: Model that writes the critiques.
        apply_edit_model: Model that rewrites the prompt along a critique.
        diversity_temperature: Sampling temperature of both calls (0 to 2, the OpenAI API's range).
        gradient_batch_size: Training rollouts shown in one critique.
        val_batch_size: Validation tasks shared by the candidates of one round.
        beam_width: Prompts kept after each round (and parents sampled per round).
        branch_factor: Candidates derived from each parent per round.
        beam_rounds: Rounds of the search.
        rollout_batch_timeout: Seconds an evaluation batch may take; unfinished rollouts score 0.
        run_initial_validation: Score the seed on the whole validation set before the first round.
        gradient_prompt_files: Critique prompt files (POML; default :data:`GRADIENT_PROMPT_FILES`).
        apply_edit_prompt_files: Edit prompt files (POML; default :data:`APPLY_EDIT_PROMPT_FILES`).
        **search_options: Options of :class:`~agentbolt.algorithm.apo.search.PromptSearch` (``run_id``,
            ``resume``, ``max_optimizer_tokens``, ``max_rollouts``, ``optimizer_timeout``, ``optimizer_retries``,
            ``seed``...).
    """

    log_name = "agentbolt.algorithm.apo.apo"

    def __init__(
        self,
        async_openai_client: AsyncOpenAI,
        *,
        gradient_model: str = "gpt-5-mini",
        apply_edit_model: str = "gpt-4.1-mini",
        diversity_temperature: float = 1.0,
        gradient_batch_size: int = 4,
        val_batch_size: int = 16,
        beam_width: int = 4,
        branch_factor: int = 4,
        beam_rounds: int = 3,
        rollout_batch_timeout: float = 3600.0,
        run_initial_validation: bool = True,
        gradient_prompt_files: Optional[List[Path]] = None,
        apply_edit_prompt_files: Optional[List[Path]] = None,
        _poml_trace: bool = False,
        **search_options: Any,
    ) -> None:
        self._check_counts(
            1,
            gradient_batch_size=gradient_batch_size,
            val_batch_size=val_batch_size,
            beam_width=beam_width,
            branch_factor=branch_factor,
        )
        self._check_counts(0, beam_rounds=beam_rounds)
        check_temperature(diversity_temperature, "diversity_temperature")
        super().__init__(async_openai_client, rollout_batch_timeout=rollout_batch_timeout, **search_options)
        self.gradient_model = gradient_model
        self.apply_edit_model = apply_edit_model
        self.diversity_temperature = diversity_temperature
        self.gradient_batch_size = gradient_batch_size
        self.val_batch_size = val_batch_size
        self.beam_width = beam_width
        self.branch_factor = branch_factor
        self.beam_rounds = beam_rounds
        self.run_initial_validation = run_initial_validation
        self.gradient_prompt_files = self._prompt_files(
            gradient_prompt_files, GRADIENT_PROMPT_FILES, names=GRADIENT_CONTEXT, option="gradient_prompt_files"
        )
        self.apply_edit_prompt_files = self._prompt_files(
            apply_edit_prompt_files, APPLY_EDIT_PROMPT_FILES, names=APPLY_EDIT_CONTEXT, option="apply_edit_prompt_files"
        )
        self._poml_trace = _poml_trace

    def _needs_optimizer(self) -> bool:
        return self.beam_rounds > 0

    # -- log prefix ------------------------------------------------------------------------------------------------

    def _format_log_prefix(
        self,
        *,
        round_num: Optional[int] = None,
        beam_idx: Optional[int] = None,
        branch_idx: Optional[int] = None,
        prompt_version: Optional[str] = None,
    ) -> str:
        parts = []
        if round_num is not None:
            parts.append(f"Round {round_num:02d}")
        if beam_idx is not None:
            parts.append(f"Beam {beam_idx:02d}")
        if branch_idx is not None:
            parts.append(f"Branch {branch_idx:02d}")
        if prompt_version is not None:
            parts.append(f"Prompt {prompt_version}")
        return f"[{' | '.join(parts)}]" if parts else ""

    # -- optimizer calls ---------------------------------------------------------------------------------------------

    def _context(self, prompt: PromptTemplate) -> dict:
        return {
            "prompt_template": prompt.template,
            "placeholders": format_placeholders(self._placeholders, prompt.engine),
        }

    async def compute_textual_gradient(
        self,
        current_prompt: VersionedPromptTemplate,
        rollout_results: List[RolloutResultForAPO],
        *,
        prefix: Optional[str] = None,
    ) -> Optional[str]:
        """Ask the gradient model for a critique of ``current_prompt`` from a sample of its rollouts.

        Returns:
            The critique, or None when the call failed after its retries.
        """
        path = random.choice(self.gradient_prompt_files)
        if len(rollout_results) < self.gradient_batch_size:
            self._log(
                logging.WARNING,
                f"Only {len(rollout_results)} rollouts to critique (gradient_batch_size={self.gradient_batch_size}).",
                prefix=prefix,
            )
            sample = list(rollout_results)
        else:
            sample = random.sample(rollout_results, self.gradient_batch_size)
        context = {
            **self._context(current_prompt.prompt_template),
            "experiments": [{k: v for k, v in result.items() if k != "spans"} for result in sample],
            "experiments_text": format_experiments(sample),
        }
        messages = await self._render(path, context)
        self._log(logging.DEBUG, f"Critique prompt {path.name}: {messages}", prefix=prefix)
        critique = await self.optimizer.chat(
            model=self.gradient_model,
            messages=messages,
            temperature=self.diversity_temperature,
            purpose="critique",
            option="gradient_model",
        )
        if critique:
            self._log(logging.INFO, f"Critique: {critique.strip()[:600]}", prefix=prefix)
        return critique

    async def textual_gradient_and_apply_edit(
        self,
        current_prompt: VersionedPromptTemplate,
        rollout: List[RolloutResultForAPO],
        *,
        prefix: Optional[str] = None,
    ) -> Optional[str]:
        """Critique, then rewrite ``current_prompt`` along the critique.

        Returns:
            The new template text (the reply's last fenced block if it has one that keeps the placeholders, else
            the whole reply, stripped: :func:`~agentbolt.algorithm.apo.prompts.extract_template_text`); the current
            text when the critique is empty; None when a call failed.
        """
        text, _ = await self._critique_and_edit(current_prompt, rollout, prefix=prefix)
        return text

    async def _critique_and_edit(
        self, current_prompt: VersionedPromptTemplate, rollout: List[RolloutResultForAPO], *, prefix: Optional[str]
    ) -> Tuple[Optional[str], str]:
        """The edited text (None when a call failed) and the critique behind it."""
        critique = await self.compute_textual_gradient(current_prompt, rollout, prefix=prefix)
        if critique is None:
            return None, ""
        if not critique.strip():
            return current_prompt.prompt_template.template, ""
        path = random.choice(self.apply_edit_prompt_files)
        context = {**self._context(current_prompt.prompt_template), "critique": critique}
        messages = await self._render(path, context)
        reply = await self.optimizer.chat(
            model=self.apply_edit_model,
            messages=messages,
            temperature=self.diversity_temperature,
            purpose="edit",
            option="apply_edit_model",
        )
        if reply is None:
            return None, critique
        like = current_prompt.prompt_template
        return extract_template_text(reply, usable=lambda text: self._keeps_placeholders(text, like)) or "", critique

    # -- store-backed evaluation (contract names) --------------------------------------------------------------------

    async def get_rollout_results(
        self, rollout: List[Rollout], *, prefix: Optional[str] = None
    ) -> List[RolloutResultForAPO]:
        """Read finished rollouts back from the store as the optimizer sees them."""
        return [await self._rollout_result(r, prefix=prefix) for r in rollout]

    async def evaluate_prompt_on_batch(
        self,
        prompt: VersionedPromptTemplate,
        resource_name: str,
        dataset: Sequence[Any],
        mode: str,
        *,
        prefix: Optional[str] = None,
    ) -> Tuple[List[RolloutResultForAPO], float]:
        """Run ``prompt`` on every task of ``dataset``; the finished rollouts and the average reward (0 if unset)."""
        self._resource_name = self._resource_name or resource_name
        purpose = "train" if mode == "train" else "val-batch"
        evaluation = await self.evaluate(prompt, keyed(dataset), mode=mode, purpose=purpose, prefix=prefix)  # type: ignore[arg-type]
        return evaluation.results, evaluation.mean

    # -- the search --------------------------------------------------------------------------------------------------

    def _initialize_beam(
        self, train_dataset: Optional[Dataset[T_task]], val_dataset: Optional[Dataset[T_task]]
    ) -> Tuple[str, PromptTemplate, KeyedBatches, KeyedBatches]:
        seed, train, val = self._start_run(train_dataset, val_dataset)
        assert self._resource_name is not None
        grad_iter = batch_iter_over_dataset(train, self.gradient_batch_size)
        val_iter = batch_iter_over_dataset(val, self.val_batch_size)
        return self._resource_name, seed, grad_iter, val_iter

    def _sample_parent_prompts(
        self, beam: List[VersionedPromptTemplate], round_num: int
    ) -> List[Tuple[int, VersionedPromptTemplate]]:
        if len(beam) < self.beam_width:
            self._log(
                logging.WARNING,
                f"The beam holds {len(beam)} prompt(s), fewer than beam_width={self.beam_width}; reusing them.",
                prefix=self._format_log_prefix(round_num=round_num),
            )
            return [(i % len(beam), beam[i % len(beam)]) for i in range(self.beam_width)]
        return [(i, beam[i]) for i in random.sample(range(len(beam)), self.beam_width)]

    async def _branch(
        self,
        beam_idx: int,
        parent: VersionedPromptTemplate,
        branch_idx: int,
        batch: Sequence[Tuple[str, Any]],
        round_num: int,
    ) -> Optional[VersionedPromptTemplate]:
        prefix = self._format_log_prefix(
            round_num=round_num, beam_idx=beam_idx, branch_idx=branch_idx, prompt_version=parent.version
        )
        evaluation = await self.evaluate(parent, batch, mode="train", purpose="train", prefix=prefix)
        self._log(logging.INFO, f"Parent scores {evaluation.mean:.3f} on {len(batch)} training tasks.", prefix=prefix)
        text, critique = await self._critique_and_edit(parent, evaluation.results, prefix=prefix)
        if text is None:
            self.skipped_candidates += 1
            self._log(logging.WARNING, "Skipped this branch: an optimizer call failed.", prefix=prefix)
            return None
        candidate = self._candidate_from_text(text, parent.prompt_template, prefix=prefix)
        if candidate is not None:
            candidate.lineage = {
                "origin": "edit",
                "parents": [parent.version],
                "note": critique[:2000],
                "round": round_num,
            }
            self._log(logging.INFO, f"New candidate {candidate.version}.", prefix=prefix)
        return candidate

    async def _generate_candidate_prompts(
        self,
        parents: List[Tuple[int, VersionedPromptTemplate]],
        resource_name: str,
        grad_iter: KeyedBatches,
        round_num: int,
    ) -> List[VersionedPromptTemplate]:
        jobs = [
            self._branch(beam_idx, parent, branch_idx, next(grad_iter), round_num)
            for beam_idx, parent in parents
            for branch_idx in range(self.branch_factor)
        ]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        candidates: List[VersionedPromptTemplate] = []
        for result in results:
            if isinstance(result, BaseException):  # a spent budget included: it ends the search
                raise result
            if result is not None:
                candidates.append(result)
        return candidates

    async def _evaluate_and_select_beam(
        self,
        candidates: List[VersionedPromptTemplate],
        resource_name: str,
        val_iter: KeyedBatches,
        round_num: int,
    ) -> List[VersionedPromptTemplate]:
        if not candidates:
            raise ValueError("No beam candidates any more")
        batch = next(val_iter)
        results = await asyncio.gather(
            *(
                self.evaluate(
                    c,
                    batch,
                    mode="val",
                    purpose="val-batch",
                    prefix=self._format_log_prefix(round_num=round_num, prompt_version=c.version),
                )
                for c in candidates
            ),
            return_exceptions=True,  # a spent budget ends the search once the evaluations under way are scored
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        ranked = sorted(candidates, key=lambda c: c.score if c.score is not None else float("-inf"), reverse=True)
        scores = ", ".join(f"{c.version}={c.score:.3f}" for c in ranked)
        self._log(
            logging.INFO, f"Validation batch scores: {scores}", prefix=self._format_log_prefix(round_num=round_num)
        )
        return ranked[: self.beam_width]

    async def _update_best_prompt(
        self,
        beam: List[VersionedPromptTemplate],
        resource_name: str,
        val_dataset: Dataset[T_task],
        round_num: int,
    ) -> None:
        leader = beam[0]
        await self._validate_full(
            leader,
            keyed(val_dataset),
            prefix=self._format_log_prefix(round_num=round_num, prompt_version=leader.version),
        )

    async def run(
        self, train_dataset: Optional[Dataset[T_task]] = None, val_dataset: Optional[Dataset[T_task]] = None
    ) -> None:
        """Search for a better prompt; the result is :meth:`get_best_prompt` (also stored as ``{run_id}-best``).

        With a ``seed``, the module-level :mod:`random` generator (which draws the parents, batches, samples and
        prompt files) is seeded with it first, so two runs with one seed make the same draws. That generator is the
        process's: when runners share the process (a shared-memory strategy) their own use of it (span ids, poll
        jitter) makes the draws that follow the first rollouts differ from run to run.

        Raises:
            ValueError: No PromptTemplate in the initial resources, a seed that is not a valid template, a missing
                or empty dataset, an adapter that is not TraceToMessages, no optimizer client while
                ``beam_rounds > 0``, a seed template no task can fill, or no candidate left to evaluate.
            OptimizerError: The optimizer server refused a call as misconfigured (HTTP 401, 403, 404), or every
                optimizer call of the search failed. The best prompt so far stays available.
        """
        if self.seed is not None:
            random.seed(self.seed)  # the module-level generator the draws below use (as the contract has them)
        resource_name, seed, grad_iter, val_iter = self._initialize_beam(train_dataset, val_dataset)
        assert val_dataset is not None
        if self._poml_trace and poml is not None:
            poml.set_trace(trace_dir="pomltrace")
        async with self._search_session():
            beam = await self._start_beam(seed, val_dataset)
            first_round = self._rounds_done + 1
            for round_num in range(first_round, self.beam_rounds + 1):
                self.current_round = round_num
                prefix = self._format_log_prefix(round_num=round_num)
                self._log(logging.INFO, f"Round {round_num}/{self.beam_rounds}: beam {[c.version for c in beam]}.")
                parents = self._sample_parent_prompts(beam, round_num)
                candidates = await self._generate_candidate_prompts(parents, resource_name, grad_iter, round_num)
                self._log(logging.INFO, f"{len(candidates)} new candidate(s).", prefix=prefix)
                beam = await self._evaluate_and_select_beam(beam + candidates, resource_name, val_iter, round_num)
                await self._update_best_prompt(beam, resource_name, val_dataset, round_num)

    def _reset_run_state(self) -> None:
        super()._reset_run_state()
        self._rounds_done = 0

    def _kept_beam(self, records: Sequence[CandidateRecord], round_num: int) -> List[VersionedPromptTemplate]:
        """The beam round ``round_num`` kept: its candidates ranked by their scores on the validation batch they
        shared that round (ties in version order), the ``beam_width`` best. Empty for round 0."""
        scored = [
            (sum(rewards.values()) / len(rewards), record)
            for record in records
            if record.template is not None and (rewards := record.batch_scores.get(round_num))
        ]
        scored.sort(key=lambda item: item[0], reverse=True)
        return [
            VersionedPromptTemplate(r.version, r.template, score, self._lineage_of(r))
            for score, r in scored[: self.beam_width]
            if r.template is not None
        ]

    async def _start_beam(self, seed: PromptTemplate, val_dataset: Dataset[T_task]) -> List[VersionedPromptTemplate]:
        """The first beam: the stored beam when resuming, else the seed as ``v0`` (validated if asked)."""
        if self.resume:
            records = await self._resume_state()
            # A round counts as done once its leader was scored on the full validation set, or its stored
            # full-validation scores were reused for it (tagged on their rollouts by evaluate()).
            self._rounds_done = max((r.validated_in_round for r in records), default=0)
            beam = self._kept_beam(records, self._rounds_done)
            if beam:
                if self._rounds_done >= self.beam_rounds:
                    self._log(logging.INFO, f"All {self.beam_rounds} rounds are done; nothing to resume.")
                else:
                    self._log(
                        logging.INFO,
                        f"Rounds 1-{self._rounds_done} of {self.beam_rounds} are done; continuing with round "
                        f"{self._rounds_done + 1}. Beam {[c.version for c in beam]}: the one round {self._rounds_done} "
                        "kept.",
                    )
                return beam
        stored = self._known_templates.get(template_key(seed)) if self.resume else None
        if stored is not None:  # no round finished: start again from the stored seed
            seed_version = VersionedPromptTemplate(stored, seed, lineage={"origin": "seed", "parents": [], "round": 0})
        else:
            seed_version = self._create_seed_version(seed)
        if self.run_initial_validation:
            await self._validate_full(
                seed_version,
                keyed(val_dataset),
                prefix=self._format_log_prefix(prompt_version=seed_version.version),
            )
        return [seed_version]
