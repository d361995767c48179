"""What every prompt optimizer here shares: evaluating a candidate through the store, and keeping every result.

A candidate prompt is published as the resource snapshot ``{run_id}-{version}`` (``v0`` is the seed) holding the
tuned template under its original resource name. Its rollouts are enqueued with that snapshot and tagged in their
metadata (``prompt_search``: run, version, purpose, task key, lineage, and, once finished, the reward), so the store
alone tells which prompts a run tried, how each scored on which task and where it came from: a run can be resumed
(:meth:`PromptSearch.run` with ``resume=True``), compared and inspected (:func:`load_search_run`). When a run ends,
for any reason, the best prompt is published again as ``{run_id}-best``, which makes it the store's latest
resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import re
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from typing_extensions import NotRequired, TypedDict

from agentbolt.adapter import TraceToMessages
from agentbolt.algorithm.base import Algorithm, refuse_data_parallel_launch
from agentbolt.algorithm.utils import task_key
from agentbolt.emitter.message import get_message_value
from agentbolt.semconv import AGL_EXCEPTION
from agentbolt.store.utils import wait_for_finished_rollouts
from agentbolt.types import Dataset, NamedResources, PromptTemplate, Rollout, RolloutMode, RolloutStatus
from agentbolt.utils.checks import check_count
from agentbolt.utils.imports import import_extra
from agentbolt.utils.reward_spans import candidate_score, training_reward

from .optimizer import OptimizerCalls, OptimizerError, OptimizerUsage, SearchBudgetExhausted, check_positive
from .prompts import check_prompt_file, conversation_of, render_prompt_file
from .templates import PlaceholderMismatchError, check_placeholders, template_placeholders

__all__ = [
    "METADATA_KEY",
    "CandidateRecord",
    "Evaluation",
    "PromptSearch",
    "RolloutResultForAPO",
    "VersionedPromptTemplate",
    "load_search_run",
    "optimizer_client",
]

METADATA_KEY = "prompt_search"
"""Key of a rollout's metadata holding what the optimizer recorded about it."""

FULL_VAL = "val-full"
"""Purpose of evaluations on the whole validation set: the scores that decide the best prompt."""
VAL_BATCH = "val-batch"
"""Purpose of evaluations on a validation batch shared by the candidates of one round."""


class RolloutResultForAPO(TypedDict):
    """One finished rollout as the optimizer reads it.

    ``feedback`` holds the texts the agent emitted with ``emit_message`` (a grader's explanation, say);
    ``conversation`` the run's fullest conversation without the prompt template's worked examples
    (:func:`~agentbolt.algorithm.apo.prompts.conversation_of`).
    """

    status: RolloutStatus
    final_reward: Optional[float]
    spans: List[Dict[str, Any]]
    messages: List[Any]
    feedback: NotRequired[List[str]]
    conversation: NotRequired[List[Any]]


@dataclass
class VersionedPromptTemplate:
    """A candidate prompt with its version (``v0``, ``v1``, ...) and its latest score (None until evaluated).

    ``lineage`` (``origin``, ``parents``, ``note``, ``round``) is recorded with the candidate's rollouts.
    """

    version: str
    prompt_template: PromptTemplate
    score: Optional[float] = None
    lineage: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Evaluation:
    """The outcome of running one candidate on a list of tasks.

    Attributes:
        version: The candidate's version.
        purpose: Why it ran (``train``, ``val-batch``, ``val-full``, ...).
        task_keys: Key of each task (see :func:`keyed`).
        rewards: Reward per task in the same order; failed, timed-out or unrewarded rollouts score 0.
        outcomes: Per task, the finished rollout as the optimizer reads it (None: timed out).
        failed: Rollouts that ended failed or cancelled.
        timed_out: Rollouts unfinished at the deadline (cancelled, scored 0).
        unrewarded: Rollouts that succeeded without a finite reward (scored 0).
        rollout_ids: The rollouts, in task order.
    """

    version: str
    purpose: str
    task_keys: List[str]
    rewards: List[float]
    outcomes: List[Optional[RolloutResultForAPO]] = field(default_factory=list)
    failed: int = 0
    timed_out: int = 0
    rollout_ids: List[str] = field(default_factory=list)
    unrewarded: int = 0

    @property
    def results(self) -> List[RolloutResultForAPO]:
        """The finished rollouts (timed-out ones left out)."""
        return [outcome for outcome in self.outcomes if outcome is not None]

    @property
    def mean(self) -> float:
        """Average reward over all tasks (0 for an empty evaluation)."""
        return sum(self.rewards) / max(1, len(self.rewards))

    def by_task(self) -> Dict[str, float]:
        """Reward per task key."""
        return dict(zip(self.task_keys, self.rewards, strict=True))


@dataclass
class CandidateRecord:
    """A candidate of a stored run, read back from the store by :func:`load_search_run`.

    Attributes:
        version: ``v0``, ``v1``, ...
        template: The candidate template (None if its resource snapshot is gone).
        origin: How it was made: ``seed``, ``edit``, ``reflection``, ``merge``, ``demonstrations``.
        parents: Versions it was derived from.
        note: The optimizer's reason for it (the critique that led to an edit, the demonstrations chosen...).
        round: The search round that made it (0 for the seed).
        scores: Reward per task key, per purpose.
        validated_in_round: Last round in which it was scored on the full validation set, or in which its stored
            full-validation scores stood for it again (-1: never).
        rollout_ids: The rollout behind each score, per purpose and task key.
        batch_scores: Reward per task key on the validation batch a round shared among its candidates
            (``val-batch``), per round: the scores that round compared the candidate by.
    """

    version: str
    template: Optional[PromptTemplate]
    origin: str = ""
    parents: List[str] = field(default_factory=list)
    note: str = ""
    round: int = 0
    scores: Dict[str, Dict[str, float]] = field(default_factory=dict)
    validated_in_round: int = -1
    rollout_ids: Dict[str, Dict[str, str]] = field(default_factory=dict)
    batch_scores: Dict[int, Dict[str, float]] = field(default_factory=dict)

    def mean(self, purpose: str = FULL_VAL) -> Optional[float]:
        """Average reward for ``purpose``, or None if the candidate was not evaluated for it."""
        rewards = self.scores.get(purpose)
        if not rewards:
            return None
        return sum(rewards.values()) / len(rewards)


def _new_run_id() -> str:
    return f"apo-{secrets.token_hex(4)}"


def _version_number(version: str) -> int:
    return int(version[1:]) if version.startswith("v") and version[1:].isdigit() else -1


async def load_search_run(store: Any, run_id: str) -> List[CandidateRecord]:
    """Every candidate a run evaluated, with its template, lineage and per-task rewards, by version order.

    Args:
        store: The run's store.
        run_id: The optimizer's ``run_id``.
    """
    records: Dict[str, CandidateRecord] = {}
    for rollout in await store.query_rollouts():
        tag = (rollout.metadata or {}).get(METADATA_KEY)
        if not isinstance(tag, Mapping) or tag.get("run_id") != run_id:
            continue
        version = str(tag.get("version"))
        record = records.get(version)
        if record is None:
            record = records[version] = CandidateRecord(version=version, template=None)
        record.origin = str(tag.get("origin") or record.origin)
        record.parents = list(tag.get("parents") or record.parents)
        record.note = str(tag.get("note") or record.note)
        record.round = int(tag.get("round") or record.round)
        if tag.get("reward") is not None:
            purpose, task = str(tag.get("purpose")), str(tag.get("task"))
            record.scores.setdefault(purpose, {})[task] = float(tag["reward"])
            record.rollout_ids.setdefault(purpose, {})[task] = rollout.rollout_id
            if purpose == VAL_BATCH:
                record.batch_scores.setdefault(int(tag.get("eval_round") or 0), {})[task] = float(tag["reward"])
            if purpose == FULL_VAL:
                rounds = (int(tag.get("eval_round") or 0), int(tag.get("reused_in_round") or 0))
                record.validated_in_round = max(record.validated_in_round, *rounds)
    for version, record in records.items():
        snapshot = await store.get_resources_by_id(f"{run_id}-{version}")
        if snapshot is not None:
            templates = [r for r in snapshot.resources.values() if isinstance(r, PromptTemplate)]
            record.template = templates[0] if templates else None
    return sorted(records.values(), key=lambda r: _version_number(r.version))


def template_key(template: PromptTemplate) -> str:
    """What makes two candidates the same prompt: text, engine and worked examples.

    The text is compared without the spaces at the end of its lines and the blank space around it, which no
    model reads as a different instruction.
    """
    text = "\n".join(line.rstrip() for line in template.template.strip().splitlines())
    return json.dumps([text, template.engine, template.examples], sort_keys=True, default=str)


def keyed(dataset: Dataset[Any]) -> List[Tuple[str, Any]]:
    """``(key, task)`` for each item of a dataset, in order.

    The key is the hash of the task's content (:func:`~agentbolt.algorithm.utils.task_key`), so a stored score
    belongs to the task it was earned on: a resumed run re-runs the tasks that changed, wherever they sit. A task
    repeated in the dataset gets ``#2``, ``#3``... after its key, so every item keeps a score of its own.
    """
    seen: Dict[str, int] = {}
    items: List[Tuple[str, Any]] = []
    for index in range(len(dataset)):
        task = dataset[index]
        key = task_key(task)
        seen[key] = seen.get(key, 0) + 1
        items.append((key if seen[key] == 1 else f"{key}#{seen[key]}", task))
    return items


def optimizer_client(spec: Any) -> Any:
    """The optimizer's client from a client, a base URL, or the keyword arguments of ``openai.AsyncOpenAI``.

    A plain value (a URL string or a dict such as ``{"base_url": ..., "api_key": ...}``) lets an optimizer be built
    from a configuration file; without an ``api_key``, ``OPENAI_API_KEY`` is used, else a placeholder (enough for a
    local server). None and client objects are returned as they are.

    Raises:
        ImportError: A client must be built and the ``openai`` package is missing (the message names the extra).
        TypeError: ``spec`` is the synchronous ``openai.OpenAI`` client (the optimizers await their calls).
        ValueError: ``spec`` is a string that is not an ``http(s)://`` URL (an API key given in its place, say).
    """
    openai = sys.modules.get("openai")
    if openai is not None and isinstance(spec, openai.OpenAI):
        raise TypeError("the optimizer client must be asynchronous: use openai.AsyncOpenAI, not openai.OpenAI")
    if isinstance(spec, str) and not spec.startswith(("http://", "https://")):
        raise ValueError(f"an optimizer client given as a string must be a base URL (http://...), got {spec[:12]!r}...")
    if spec is None or not isinstance(spec, (str, Mapping)):
        return spec
    AsyncOpenAI = import_extra("openai", feature="Building the optimizer client", extra="apo").AsyncOpenAI
    options = {"base_url": spec} if isinstance(spec, str) else dict(spec)
    # a local server needs no key; a hosted one refuses the placeholder with a clear 401
    options.setdefault("api_key", os.environ.get("OPENAI_API_KEY") or "no-key")
    return AsyncOpenAI(**options)


class PromptSearch(Algorithm):
    """Base of the prompt optimizers: seed lookup, store-backed evaluation, optimizer calls, best-prompt tracking.

    Args:
        async_openai_client: The optimizer model's client (``openai.AsyncOpenAI`` or compatible), or what builds
            one (a base URL, or a dict of ``AsyncOpenAI`` keyword arguments, see :func:`optimizer_client`); may be
            None for searches that never ask a model (few-shot selection).
        rollout_batch_timeout: Seconds an evaluation batch may take (a finite number above 0); unfinished rollouts
            are cancelled and score 0.
        run_id: Names this run's candidates in the store (default: a new random id).
        resume: Continue the run ``run_id`` from what the store holds.
        max_optimizer_tokens: Stop the search once the optimizer model has used this many tokens.
        max_rollouts: Stop the search before enqueueing more than this many rollouts in total.
        optimizer_timeout: Seconds allowed for one optimizer call.
        optimizer_retries: Retries of a failed or timed-out optimizer call (with exponential backoff).
        optimizer_backoff: Seconds before the first retry.
        optimizer_max_tokens: Completion budget of each optimizer call (None: the server's default).
        seed: Seed of this optimizer's random choices (None: not seeded). APO draws from the module-level
            :mod:`random` generator, as the reference does, and seeds it when its run starts.
        use_poml: Render the optimizer's prompt files with POML (True), with the plain renderer (False), or with
            POML when it is installed (None). POML runs a separate process per render (seconds each).
    """

    log_name = "agentbolt.algorithm.apo.search"

    def __init__(
        self,
        async_openai_client: Any = None,
        *,
        rollout_batch_timeout: float = 3600.0,
        run_id: Optional[str] = None,
        resume: bool = False,
        max_optimizer_tokens: Optional[int] = None,
        max_rollouts: Optional[int] = None,
        optimizer_timeout: float = 120.0,
        optimizer_retries: int = 3,
        optimizer_backoff: float = 1.0,
        optimizer_max_tokens: Optional[int] = None,
        seed: Optional[int] = None,
        use_poml: Optional[bool] = None,
    ) -> None:
        check_positive(rollout_batch_timeout, "rollout_batch_timeout")
        check_count(max_rollouts, "max_rollouts", optional=True)
        if resume and not run_id:
            raise ValueError("resume=True needs the run_id of the run to continue")
        async_openai_client = optimizer_client(async_openai_client)
        self.async_openai_client = async_openai_client
        self.rollout_batch_timeout = rollout_batch_timeout
        self._given_run_id = run_id
        self.run_id = run_id or _new_run_id()
        self.resume = resume
        self.max_rollouts = max_rollouts
        self.seed = seed
        self.use_poml = use_poml
        self.optimizer = OptimizerCalls(
            async_openai_client,
            timeout=optimizer_timeout,
            retries=optimizer_retries,
            backoff=optimizer_backoff,
            max_tokens=max_optimizer_tokens,
            completion_tokens=optimizer_max_tokens,
        )
        self._history_best_prompt: Optional[PromptTemplate] = None
        self._resource_name: Optional[str] = None
        self._placeholders: frozenset[str] = frozenset()
        self._val_keys: List[str] = []
        self._seed: Optional[PromptTemplate] = None
        self._runs_started = 0
        self._reset_run_state()
        self._logger = logging.getLogger(self.log_name)

    def _reset_run_state(self) -> None:
        """Forget what an earlier run of this optimizer counted, cached and found: every run starts afresh, with its
        own budgets (a resumed run reads its past back from the store)."""
        self.rng = random.Random(self.seed)
        self.optimizer.usage = OptimizerUsage()
        self.rollouts_enqueued = 0
        self.rollouts_failed = 0
        self.rollouts_timed_out = 0
        self.rollouts_unrewarded = 0
        self.skipped_candidates = 0
        self.duplicate_candidates = 0
        self.evaluations: List[Evaluation] = []
        self._history_best_score = float("-inf")
        self._history_best_version: Optional[str] = None
        self._version_counter = 0
        self.current_round = 0
        self._full_val_cache: Dict[str, Dict[str, float]] = {}  # by template_key
        self._full_val_rollouts: Dict[str, Dict[str, str]] = {}  # by template_key: task key -> rollout behind it
        self._known_templates: Dict[str, str] = {}  # template_key -> the version holding it
        self._seed_checked = False
        self._seed_error: Optional[ValueError] = None
        self._resumed = False

    # -- logging ---------------------------------------------------------------------------------------------------

    def _run_as_follower(self) -> bool:
        refuse_data_parallel_launch(self)
        return False

    def _log(self, level: int, message: str, *, prefix: Optional[str] = None) -> None:
        self._logger.log(level, f"{prefix} {message}" if prefix else message)

    async def _render(self, path: Path, context: Mapping[str, Any]) -> List[Dict[str, Any]]:
        """A prompt file's messages, rendered in a worker thread (POML runs a separate process)."""
        return await asyncio.to_thread(render_prompt_file, path, context, use_poml=self.use_poml)

    # -- seed, adapter, versions -----------------------------------------------------------------------------------

    def get_seed_prompt_template(self) -> Tuple[str, PromptTemplate]:
        """The resource name and template of the first :class:`PromptTemplate` in the initial resources.

        Raises:
            ValueError: No initial resources were set, or none of them is a PromptTemplate.
        """
        resources = self.get_initial_resources()
        if resources is None:
            raise ValueError(
                "No initial resources: give the Trainer initial_resources={'prompt_template': PromptTemplate(...)} "
                "holding the prompt to optimize."
            )
        for name, resource in resources.items():
            if isinstance(resource, PromptTemplate):
                return name, resource
        found = {name: type(resource).__name__ for name, resource in resources.items()}
        raise ValueError(f"No PromptTemplate in the initial resources to optimize (found {found}).")

    def get_adapter(self) -> TraceToMessages:  # type: ignore[override]
        """The adapter, which must turn spans into conversations.

        Raises:
            ValueError: No adapter was set or it is not a :class:`~agentbolt.adapter.TraceToMessages`.
        """
        adapter = super().get_adapter()
        if not isinstance(adapter, TraceToMessages):
            raise ValueError(
                f"{type(self).__name__} reads conversations through TraceToMessages, but the adapter is "
                f"{type(adapter).__name__}: pass adapter=agl.TraceToMessages() to the Trainer."
            )
        return adapter

    def get_best_prompt(self) -> PromptTemplate:
        """The best prompt found so far (the seed until a candidate beats it on the full validation set).

        Raises:
            ValueError: Before any run.
        """
        if self._history_best_prompt is None:
            raise ValueError("No best prompt found")
        return self._history_best_prompt

    @property
    def best_score(self) -> float:
        """Full-validation score of :meth:`get_best_prompt` (``-inf`` when the seed was not validated)."""
        return self._history_best_score

    @property
    def best_version(self) -> Optional[str]:
        """Version of :meth:`get_best_prompt`."""
        return self._history_best_version

    def _create_versioned_prompt(
        self, prompt_template: PromptTemplate, *, score: Optional[float] = None
    ) -> VersionedPromptTemplate:
        version = f"v{self._version_counter}"
        self._version_counter += 1
        self._known_templates.setdefault(template_key(prompt_template), version)
        return VersionedPromptTemplate(version=version, prompt_template=prompt_template, score=score)

    def _create_seed_version(self, seed: PromptTemplate) -> VersionedPromptTemplate:
        """A new version of the seed template, with the lineage of a seed (no parents, round 0)."""
        seed_version = self._create_versioned_prompt(seed)
        seed_version.lineage = {"origin": "seed", "parents": [], "round": 0}
        return seed_version

    def _keeps_placeholders(self, text: str, like: PromptTemplate) -> bool:
        """Whether ``text``, in ``like``'s engine, fills exactly the seed's placeholders (:func:`check_placeholders`)."""
        try:
            check_placeholders(PromptTemplate(template=text, engine=like.engine), self._placeholders, seed=self._seed)
        except PlaceholderMismatchError:
            return False
        return True

    def _candidate_from_text(
        self, text: Optional[str], like: PromptTemplate, *, prefix: Optional[str] = None
    ) -> Optional[VersionedPromptTemplate]:
        """A new version holding ``text`` in ``like``'s engine, or None (logged, counted) when it is unusable or
        repeats a prompt this run already has (:func:`template_key`): a repeat would only be scored again."""
        if not text or not text.strip():
            self.skipped_candidates += 1
            self._log(logging.WARNING, "Skipped a candidate: the optimizer returned no text.", prefix=prefix)
            return None
        template = PromptTemplate(template=text, engine=like.engine, examples=like.examples)
        try:
            check_placeholders(template, self._placeholders, seed=self._seed)
        except PlaceholderMismatchError as exc:
            self.skipped_candidates += 1
            self._log(logging.WARNING, f"Skipped a candidate: {exc}.", prefix=prefix)
            return None
        same = self._known_templates.get(template_key(template))
        if same is not None:
            self.duplicate_candidates += 1
            self._log(logging.INFO, f"Skipped a candidate: it repeats {same}.", prefix=prefix)
            return None
        return self._create_versioned_prompt(template)

    def _start_run(
        self, train_dataset: Optional[Dataset[Any]], val_dataset: Optional[Dataset[Any]]
    ) -> Tuple[PromptTemplate, List[Tuple[str, Any]], List[Tuple[str, Any]]]:
        """Find the seed, check the datasets and reset the run's state.

        Returns:
            The seed template, then the training and validation tasks keyed by :func:`keyed`.

        Raises:
            ValueError: No seed template, a seed that is not a valid template for its engine, a dataset missing or
                empty, or no optimizer client for a search that asks the optimizer model.
        """
        name, seed = self.get_seed_prompt_template()
        for label, dataset in (("train_dataset", train_dataset), ("val_dataset", val_dataset)):
            if dataset is None:
                raise ValueError(f"{type(self).__name__} needs a {label}; got None.")
            if len(dataset) == 0:
                raise ValueError(f"{type(self).__name__} needs a non-empty {label}; got an empty one.")
        self.get_adapter()
        try:
            placeholders = template_placeholders(seed)
        except ValueError as exc:
            raise ValueError(
                f"The seed PromptTemplate {name!r} is not a valid {seed.engine} template ({exc}): "
                f"{seed.template[:200]!r}"
            ) from exc
        if self._needs_optimizer() and self.async_openai_client is None:
            raise ValueError(
                f"{type(self).__name__} asks an optimizer model, but async_openai_client is None: pass an "
                "openai.AsyncOpenAI client, a base URL or the keyword arguments of one."
            )
        if self._runs_started and self._given_run_id is None:
            self.run_id = _new_run_id()  # a run of its own in the store, not a second one under the first's id
        self._runs_started += 1
        self._reset_run_state()
        self._resource_name = name
        self._placeholders = placeholders
        self._seed = seed
        self._history_best_prompt = seed
        assert train_dataset is not None and val_dataset is not None
        train, val = keyed(train_dataset), keyed(val_dataset)
        self._val_keys = [key for key, _ in val]
        return seed, train, val

    async def run(
        self, train_dataset: Optional[Dataset[Any]] = None, val_dataset: Optional[Dataset[Any]] = None
    ) -> None:
        """Search for a better prompt; the result is :meth:`get_best_prompt` (also stored as ``{run_id}-best``).

        Raises:
            ValueError: No PromptTemplate in the initial resources, a seed that is not a valid template, a missing or
                empty dataset, an adapter that is not TraceToMessages, or no optimizer client for a search that asks
                the optimizer model.
        """
        seed, train, val = self._start_run(train_dataset, val_dataset)
        async with self._search_session():
            await self._search(seed, train, val)

    async def _search(self, seed: PromptTemplate, train: List[Tuple[str, Any]], val: List[Tuple[str, Any]]) -> None:
        """The search of :meth:`run` over the keyed tasks, from ``seed`` or, with ``resume``, from the stored run."""
        raise NotImplementedError(f"{type(self).__name__} must implement _search().")

    def _needs_optimizer(self) -> bool:
        """Whether the search as configured calls the optimizer model, so that a client is required (checked before
        any rollout). False here; the searches that ask the optimizer model say when they do."""
        return False

    # -- evaluation --------------------------------------------------------------------------------------------------

    def _tag(
        self, candidate: VersionedPromptTemplate, purpose: str, key: str, lineage: Mapping[str, Any]
    ) -> Dict[str, Any]:
        return {
            METADATA_KEY: {
                "run_id": self.run_id,
                "version": candidate.version,
                "purpose": purpose,
                "task": key,
                "eval_round": self.current_round,
                **lineage,
            }
        }

    async def evaluate(
        self,
        candidate: VersionedPromptTemplate,
        tasks: Sequence[Tuple[str, Any]],
        *,
        mode: RolloutMode,
        purpose: str,
        lineage: Optional[Mapping[str, Any]] = None,
        prefix: Optional[str] = None,
    ) -> Evaluation:
        """Run ``candidate`` on ``tasks`` through the store and score it.

        Args:
            candidate: The prompt to run.
            tasks: ``(key, task input)`` pairs.
            mode: Rollout mode (``train`` / ``val``).
            purpose: Recorded with the rollouts; ``val-full`` results are cached by template text. When a cached
                result is reused, its rollouts are tagged with the current round (``reused_in_round``), so that a
                resumed run knows this round's validation is done.
            lineage: Recorded with the rollouts (default: the candidate's own ``lineage``).
            prefix: Log prefix.

        Raises:
            SearchBudgetExhausted: The rollout budget does not cover these tasks.
            ValueError: This is the seed's first evaluation and every rollout failed filling the same placeholder
                of the template (:meth:`_check_seed_fills`).
        """
        prompt_key = template_key(candidate.prompt_template)
        if purpose == FULL_VAL:
            cached = self._full_val_cache.get(prompt_key)
            if cached is not None and all(key in cached for key, _ in tasks):
                self._log(logging.INFO, "Reusing the stored full-validation scores.", prefix=prefix)
                await self._mark_reused(prompt_key, [key for key, _ in tasks])
                return Evaluation(candidate.version, purpose, [k for k, _ in tasks], [cached[k] for k, _ in tasks])
        if self.max_rollouts is not None and self.rollouts_enqueued + len(tasks) > self.max_rollouts:
            raise SearchBudgetExhausted(
                f"rollout budget spent: {self.rollouts_enqueued} of {self.max_rollouts} used, {len(tasks)} more needed"
            )
        # Counted before the first await: evaluations running concurrently check the budget against each other's
        # rollouts, not only against those already enqueued.
        self.rollouts_enqueued += len(tasks)
        store = self.get_store()
        assert self._resource_name is not None
        lineage = candidate.lineage if lineage is None else lineage
        update = await store.update_resources(
            f"{self.run_id}-{candidate.version}", self._resources_with(candidate.prompt_template)
        )
        rollout_ids: List[str] = []
        for key, task in tasks:
            rollout = await store.enqueue_rollout(
                input=task,
                mode=mode,
                resources_id=update.resources_id,
                metadata=self._tag(candidate, purpose, key, lineage),
            )
            rollout_ids.append(rollout.rollout_id)
        finished = await self._wait(rollout_ids, prefix=prefix)
        evaluation = Evaluation(candidate.version, purpose, [k for k, _ in tasks], [], rollout_ids=rollout_ids)
        for rollout_id in rollout_ids:
            rollout = finished.get(rollout_id)
            if rollout is None:
                evaluation.timed_out += 1
                evaluation.rewards.append(0.0)
                evaluation.outcomes.append(None)
                continue
            result = await self._rollout_result(rollout, examples=candidate.prompt_template.examples, prefix=prefix)
            evaluation.outcomes.append(result)
            if result["status"] != "succeeded":
                evaluation.failed += 1
            elif result["final_reward"] is None:
                evaluation.unrewarded += 1
            evaluation.rewards.append(candidate_score(result["status"], result["final_reward"]))
        for rollout_id, reward in zip(rollout_ids, evaluation.rewards, strict=True):
            await self._record_reward(rollout_id, reward)
        self.rollouts_failed += evaluation.failed
        self.rollouts_timed_out += evaluation.timed_out
        self.rollouts_unrewarded += evaluation.unrewarded
        if evaluation.failed or evaluation.timed_out:
            below_zero = sum(
                1
                for outcome in evaluation.outcomes
                if outcome is not None
                and outcome["status"] == "succeeded"
                and outcome["final_reward"] is not None
                and outcome["final_reward"] < 0
            )
            ranking = (
                f" {below_zero} rollout(s) that worked scored below 0, so a prompt whose rollouts fail outranks "
                "them: have the agent catch its own errors and return a reward for them."
                if below_zero
                else ""
            )
            self._log(
                logging.WARNING,
                f"{evaluation.failed} rollout(s) failed and {evaluation.timed_out} timed out of {len(tasks)}; "
                f"each scored 0.{ranking}",
                prefix=prefix,
            )
        if evaluation.unrewarded:
            self._log(
                logging.WARNING,
                f"{evaluation.unrewarded} rollout(s) of {len(tasks)} succeeded without a reward; each scored 0 "
                "(the agent must return a number or call emit_reward).",
                prefix=prefix,
            )
        if purpose == FULL_VAL:
            self._full_val_cache[prompt_key] = evaluation.by_task()
            self._full_val_rollouts[prompt_key] = dict(zip(evaluation.task_keys, rollout_ids, strict=True))
        candidate.score = evaluation.mean
        self.evaluations.append(evaluation)
        seed = self._seed
        if seed is not None and prompt_key == template_key(seed):
            if not self._seed_checked:
                self._seed_checked = True
                try:
                    self._check_seed_fills(evaluation, tasks)
                except ValueError as exc:
                    self._seed_error = exc
                    raise
            if self._seed_error is not None:  # evaluations of the seed that ran alongside the first one
                raise self._seed_error
        return evaluation

    async def _mark_reused(self, prompt_key: str, task_keys: Sequence[str]) -> None:
        """Tag the rollouts behind the cached full-validation scores of the prompt whose :func:`template_key` is
        ``prompt_key`` as reused in the current round."""
        rollouts = self._full_val_rollouts.get(prompt_key, {})
        for key in task_keys:
            if key in rollouts:
                await self._update_tag(rollouts[key], reused_in_round=self.current_round)

    def _check_seed_fills(self, evaluation: Evaluation, tasks: Sequence[Tuple[str, Any]]) -> None:
        """Fail fast when the seed can never be filled: every rollout of its first evaluation failed on one
        placeholder (a ``KeyError`` from ``str.format``, an undefined jinja variable); nothing would ever score.

        Raises:
            ValueError: Naming the placeholder and, for tasks that are mappings, the fields they have.
        """
        outcomes = evaluation.outcomes
        if not outcomes or any(o is None or o["status"] == "succeeded" for o in outcomes):
            return
        missing = {_missing_placeholder(outcome["spans"]) for outcome in outcomes if outcome is not None}
        if len(missing) != 1:
            return
        name = missing.pop()
        if name is None or name not in self._placeholders:
            return
        fields = sorted({str(k) for _, task in tasks if isinstance(task, Mapping) for k in task})
        hint = f" The tasks have the fields {fields}." if fields else ""
        raise ValueError(
            f"The seed template cannot be filled: all {len(outcomes)} rollouts of its first evaluation failed "
            f"with no value for the placeholder {name!r}.{hint} Make the template's placeholders match what the "
            "agent passes to format()."
        )

    async def _record_reward(self, rollout_id: str, reward: float) -> None:
        await self._update_tag(rollout_id, reward=reward)

    async def _update_tag(self, rollout_id: str, **fields: Any) -> None:
        """Set ``fields`` in what the optimizer recorded about a rollout (its metadata under ``METADATA_KEY``)."""
        store = self.get_store()
        rollout = await store.get_rollout_by_id(rollout_id)
        if rollout is None:
            return
        metadata = dict(rollout.metadata or {})
        metadata[METADATA_KEY] = {**metadata.get(METADATA_KEY, {}), **fields}
        await store.update_rollout(rollout_id, metadata=metadata)

    async def _wait(self, rollout_ids: List[str], *, prefix: Optional[str]) -> Dict[str, Rollout]:
        store = self.get_store()
        finished = await wait_for_finished_rollouts(store, rollout_ids, timeout=self.rollout_batch_timeout)
        if len(finished) == len(rollout_ids):
            return finished
        for rollout_id in rollout_ids:
            if rollout_id in finished:
                continue
            self._log(
                logging.WARNING,
                f"Rollout {rollout_id} did not finish within {self.rollout_batch_timeout:.0f} s; cancelling it.",
                prefix=prefix,
            )
            try:
                await store.update_rollout(rollout_id, status="cancelled")
            except ValueError as exc:  # it finished in between, or the store refuses: either way it scores 0
                self._log(logging.INFO, f"Could not cancel {rollout_id}: {exc}", prefix=prefix)
        return finished

    async def _rollout_result(
        self, rollout: Rollout, *, examples: Sequence[Mapping[str, Any]] = (), prefix: Optional[str]
    ) -> RolloutResultForAPO:
        store = self.get_store()
        spans = list(await store.query_spans(rollout.rollout_id, "latest"))
        try:
            messages: List[Any] = list(self.get_adapter().adapt(spans))
        except ValueError as exc:
            self._log(logging.WARNING, f"Cannot read the conversation of {rollout.rollout_id}: {exc}", prefix=prefix)
            messages = []
        feedback = []
        for span in spans:
            try:
                text = get_message_value(span)
            except TypeError:
                text = None
            if text:
                feedback.append(text)
        return RolloutResultForAPO(
            status=rollout.status,
            final_reward=training_reward(spans, rollout.rollout_id),
            spans=[span.model_dump() for span in spans],
            messages=messages,
            feedback=feedback,
            conversation=list(conversation_of(messages, examples)),
        )

    async def _validate_full(
        self,
        candidate: VersionedPromptTemplate,
        val: Sequence[Tuple[str, Any]],
        *,
        lineage: Optional[Mapping[str, Any]] = None,
        prefix: Optional[str] = None,
    ) -> Evaluation:
        """Score ``candidate`` on the whole validation set and make it the best prompt if it beats the best."""
        evaluation = await self.evaluate(candidate, val, mode="val", purpose=FULL_VAL, lineage=lineage, prefix=prefix)
        self._offer_best(candidate, evaluation, prefix=prefix)
        return evaluation

    def _offer_best(
        self, candidate: VersionedPromptTemplate, evaluation: Evaluation, *, prefix: Optional[str] = None
    ) -> None:
        """Make ``candidate`` the best prompt if its full-validation ``evaluation`` beats the best so far."""
        if evaluation.mean > self._history_best_score:
            self._log(
                logging.INFO,
                f"New best prompt {candidate.version}: {evaluation.mean:.3f} on the full validation set "
                f"(was {self._history_best_score:.3f}).",
                prefix=prefix,
            )
            self._history_best_prompt = candidate.prompt_template
            self._history_best_score = evaluation.mean
            self._history_best_version = candidate.version
        else:
            self._log(
                logging.INFO,
                f"{candidate.version} scores {evaluation.mean:.3f} on the full validation set; the best stays "
                f"{self._history_best_version} ({self._history_best_score:.3f}).",
                prefix=prefix,
            )

    async def _resume_state(self) -> List[CandidateRecord]:
        """Read back this run's candidates, restoring the version counter, the score cache and the best prompt."""
        records = await load_search_run(self.get_store(), self.run_id)
        if not records:
            raise ValueError(f"Cannot resume: the store holds no candidates of run {self.run_id!r}.")
        self._resumed = True
        self._version_counter = max(_version_number(r.version) for r in records) + 1
        for record in records:
            if record.template is None:
                continue
            prompt_key = template_key(record.template)
            if record.scores:
                self._known_templates.setdefault(prompt_key, record.version)
            full = self._stored_full_val(record)
            if full is not None:
                self._full_val_cache[prompt_key] = full
                self._full_val_rollouts[prompt_key] = dict(record.rollout_ids.get(FULL_VAL, {}))
                mean = sum(full.values()) / len(full)
                if mean > self._history_best_score:
                    self._history_best_prompt = record.template
                    self._history_best_score = mean
                    self._history_best_version = record.version
        self._log(
            logging.INFO,
            f"Resuming run {self.run_id}: {len(records)} stored candidates, best {self._history_best_version} "
            f"({self._history_best_score:.3f}).",
        )
        return records

    def _stored_full_val(self, record: CandidateRecord) -> Optional[Dict[str, float]]:
        """A stored candidate's full-validation rewards on this run's validation tasks (by :func:`keyed` key).

        None unless it was scored on every one of them: scores on tasks that have since changed or left the
        validation set do not count, and the candidate is validated again when it is needed.
        """
        full = record.scores.get(FULL_VAL) or {}
        if not self._val_keys or any(key not in full for key in self._val_keys):
            return None
        return {key: full[key] for key in self._val_keys}

    @staticmethod
    def _lineage_of(record: CandidateRecord) -> Dict[str, Any]:
        return {"origin": record.origin, "parents": list(record.parents), "note": record.note, "round": record.round}

    @contextlib.asynccontextmanager
    async def _search_session(self) -> AsyncIterator[None]:
        """Wrap a search: a spent budget ends it quietly; whatever ends it, the best prompt is stored and reported.

        Raises:
            ValueError: Not resuming, and the store already holds a run ``run_id`` (nothing is written).
            OptimizerError: The search ended and every optimizer call in it failed (none gave a text).
        """
        if not self.resume:
            await self._check_run_id_is_new()
        try:
            yield
        except SearchBudgetExhausted as exc:
            self._log(logging.WARNING, f"Stopping the search: {exc}. Keeping the best prompt so far.")
        finally:
            await self._publish_best()
            self._log(logging.INFO, f"{self._best_report()}; {self.summary()}")
        usage = self.optimizer.usage
        if usage.failed_calls and not usage.calls:
            message = (
                f"Every optimizer call failed ({usage.failed_calls} of {usage.failed_calls}; the warnings above say "
                f"why): the search wrote no new prompt, and the best prompt stays {self._history_best_version}."
            )
            self._log(logging.WARNING, message)
            raise OptimizerError(message)

    def _best_report(self) -> str:
        """The best prompt in one sentence: its version and its mean reward on how many validation tasks."""
        if self._history_best_version is None:
            return "Best prompt: the seed, never scored on the whole validation set"
        return (
            f"Best prompt {self._history_best_version}: mean reward {self._history_best_score:.3f} on the "
            f"{len(self._val_keys)} validation tasks"
        )

    async def _check_run_id_is_new(self) -> None:
        """Refuse to write a second run under the ``run_id`` of one the store holds: their candidates would share
        versions, and the store could tell neither run apart to compare, inspect or resume it.

        Raises:
            ValueError: The store holds the run's seed (``{run_id}-v0``) or best prompt (``{run_id}-best``).
        """
        store = self.get_store()
        for suffix in ("v0", "best"):
            if await store.get_resources_by_id(f"{self.run_id}-{suffix}") is not None:
                raise ValueError(
                    f"The store already holds run {self.run_id!r}: pass resume=True to continue it, or another "
                    "run_id to start a new run."
                )

    @staticmethod
    def _check_counts(minimum: int, **counts: Any) -> None:
        """Require each of ``counts`` (option name -> value) to be an integer of at least ``minimum``.

        Raises:
            TypeError: The first count that is not an integer (a bool is not one), named.
            ValueError: The first count below ``minimum``, named.
        """
        for name, value in counts.items():
            check_count(value, name, minimum=minimum)

    @staticmethod
    def _prompt_files(
        given: Optional[Sequence[Any]],
        default: Sequence[Path],
        *,
        names: Collection[str] = (),
        option: str = "prompt files",
    ) -> List[Path]:
        """``given`` (else ``default``) as paths; given files are checked against the context ``names`` their
        optimizer fills in (:func:`~agentbolt.algorithm.apo.prompts.check_prompt_file`).

        Raises:
            TypeError: ``given`` is one path instead of a list of them.
            ValueError: A file does not exist, cannot be read, or uses a name the optimizer does not fill in.
        """
        if isinstance(given, (str, Path)):
            raise TypeError(
                f"prompt files must be a list of paths, got the single path {str(given)!r} (wrap it in a list)"
            )
        paths = [Path(p) for p in given or default]
        for path in paths:
            if not path.is_file():
                raise ValueError(f"prompt file {path} does not exist")
            if given:
                check_prompt_file(path, names, option=option)
        return paths

    def _resources_with(self, prompt_template: PromptTemplate) -> NamedResources:
        """The initial resources (the agent's LLM endpoint, other templates...) with the tuned one replaced."""
        assert self._resource_name is not None
        resources: NamedResources = dict(self.get_initial_resources() or {})
        resources[self._resource_name] = prompt_template
        return resources

    async def _publish_best(self) -> None:
        """Store the best prompt as ``{run_id}-best`` (the latest resources), keeping it whatever happened.

        Nothing is stored when ``resume`` found no stored run to continue: the store then holds no run ``run_id``.
        """
        if self._history_best_prompt is None or self._resource_name is None:
            return
        if self.resume and not self._resumed:
            return
        try:
            await self.get_store().update_resources(
                f"{self.run_id}-best", self._resources_with(self._history_best_prompt)
            )
        except Exception:  # the prompt stays available from get_best_prompt()
            self._logger.exception("Could not store the best prompt of run %s.", self.run_id)

    def summary(self) -> Dict[str, Any]:
        """What the run spent and found: best version and score, rollouts, optimizer calls and tokens.

        ``best_score`` is the best prompt's mean reward over the ``validation_tasks`` tasks of the validation set.
        ``best_version`` and ``best_score`` are None while no candidate has been scored on the whole validation set
        (so that the summary is plain JSON; :attr:`best_score` is ``-inf`` then).
        """
        usage = self.optimizer.usage
        validated = self._history_best_version is not None
        return {
            "run_id": self.run_id,
            "best_version": self._history_best_version,
            "best_score": self._history_best_score if validated else None,
            "validation_tasks": len(self._val_keys),
            "candidates": self._version_counter,
            "skipped_candidates": self.skipped_candidates,
            "duplicate_candidates": self.duplicate_candidates,
            "rollouts": self.rollouts_enqueued,
            "rollouts_failed": self.rollouts_failed,
            "rollouts_timed_out": self.rollouts_timed_out,
            "rollouts_unrewarded": self.rollouts_unrewarded,
            "optimizer_calls": usage.calls,
            "optimizer_failed_calls": usage.failed_calls,
            "optimizer_prompt_tokens": usage.prompt_tokens,
            "optimizer_completion_tokens": usage.completion_tokens,
        }


def _missing_placeholder(spans: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """The placeholder a failed rollout could not fill, from its exception span; None for any other failure.

    ``str.format`` raises ``KeyError('name')``; :meth:`PromptTemplate.format` raises a ``ValueError`` saying
    ``'name' is undefined`` for a jinja template.
    """
    for span in spans:
        if span.get("name") != AGL_EXCEPTION:
            continue
        attributes = span.get("attributes") or {}
        kind, message = attributes.get("exception.type"), str(attributes.get("exception.message") or "")
        if kind == "KeyError" and len(message) >= 2 and message[0] == message[-1] and message[0] in "'\"":
            return message[1:-1]
        found = re.search(r"'([^']+)' is undefined", message) if kind == "ValueError" else None
        return found.group(1) if found else None
    return None
