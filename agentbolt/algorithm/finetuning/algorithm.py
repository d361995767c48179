"""What GRPO and SFT share on the algorithm side: loading and serving the model they train, and running rollouts.

:class:`FinetuningAlgorithm` loads the model (a registry name, a local directory or a model object), builds the
algorithm's trainer around it, serves the very weights being trained (in process, or on a remote vLLM-compatible
server that loads each new LoRA adapter), routes agents to it through the LLM gateway, publishes a new ``main_llm``
resource snapshot after each update, and enqueues rollouts and waits for them, collecting each one's final reward
and the triplets of its LLM calls. Subclasses write the training step and the run loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Callable,
    ClassVar,
    Dict,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Set,
    Tuple,
    Type,
    Union,
)

from agentbolt.algorithm.base import Algorithm
from agentbolt.algorithm.finetuning.config import FinetuningConfig
from agentbolt.store.outage import ride_out_outages
from agentbolt.store.utils import wait_for_finished_rollouts
from agentbolt.types import LLM, EnqueueRolloutRequest, NamedResources, Rollout, RolloutMode, Span

if TYPE_CHECKING:
    from agentbolt.algorithm.finetuning.trainer import ModelTrainer
    from agentbolt.llm_proxy import LLMProxy
    from agentbolt.store.base import LightningStore
    from agentbolt.utils.server_launcher import LaunchMode

__all__ = [
    "FinetuningAlgorithm",
    "POLICY_RESOURCE",
    "PolicyServer",
    "RolloutOutcome",
    "TaskSampler",
    "check_run_directories",
    "check_writable_dir",
    "forget_interrupted_log",
    "mean_std",
    "model_vocab_size",
    "new_run_id",
    "padding_token_id",
]

logger = logging.getLogger(__name__)

POLICY_RESOURCE = "main_llm"
SPAN_SETTLE_SECONDS = 2.0


class PolicyServer(Protocol):
    """Serves the model being trained over an OpenAI-compatible endpoint."""

    base_url: str
    """Endpoint agents (or the gateway) call, ending in ``/v1``."""
    model_name: str
    """Model name to request."""

    def weights_update(self) -> AbstractContextManager[Any]:
        """Context held while the trainer changes the weights (generation pauses)."""

    def after_update(self, trainer: ModelTrainer) -> None:
        """Make the server use the weights just trained (no-op when it shares the model object)."""

    def stop(self) -> None:
        """Release the server."""


_DATA_ORDER_OPTIONS = ("seed",)
"""The options that decide which tasks a resumed step draws, saved with each checkpoint and checked on resume: the
sampler's position is counted in the order its ``seed`` draws. ``batch_size`` is not one: the position counts tasks,
not batches."""


class TaskSampler:
    """Deterministic, resumable batches of dataset indices.

    Each epoch is a permutation drawn from ``seed`` and the epoch number; batches run through it and continue into the
    next epoch, so every task is used once per epoch. The state is two integers, saved with checkpoints.
    """

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("the training dataset is empty")
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.epoch, self.position = 0, 0

    def _order(self) -> List[int]:
        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next_batch(self) -> List[int]:
        """The next ``batch_size`` indices."""
        return self.take(self.batch_size)

    def take(self, count: int) -> List[int]:
        """The next ``count`` indices."""
        order = self._order()
        batch: List[int] = []
        while len(batch) < count:
            if self.position >= self.size:
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            batch.append(order[self.position])
            self.position += 1
        return batch

    def state(self) -> Dict[str, int]:
        """Position to save."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: Dict[str, Any]) -> None:
        """Restore a saved position."""
        self.epoch, self.position = int(state.get("epoch", 0)), int(state.get("position", 0))


@dataclass(eq=False)
class RolloutOutcome:
    """What came back from one rollout.

    ``status`` is the rollout's final status, or ``"late"`` when it did not finish in time (it is then cancelled; one
    that finished between the end of the wait and its cancellation keeps its own status).
    ``reward`` is the final reward of a succeeded rollout (None otherwise); ``triplets`` are the LLM calls of its
    latest attempt, whatever its status.
    """

    rollout_id: str
    group_id: str
    status: str
    reward: Optional[float]
    triplets: List[Any]

    @property
    def usable(self) -> bool:
        """Succeeded with a reward."""
        return self.status == "succeeded" and self.reward is not None

    def reached(self, reward: float) -> bool:
        """Succeeded with a final reward of at least ``reward``."""
        return self.status == "succeeded" and self.reward is not None and self.reward >= reward


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and population standard deviation (NaN, NaN for no values)."""
    if not values:
        return float("nan"), float("nan")
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def model_vocab_size(model: Any) -> Optional[int]:
    """Rows of ``model``'s input embedding: a token id at or above it does not exist for the model (None: unknown)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is None:
        rows = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(rows) if isinstance(rows, int) else None


def padding_token_id(tokenizer: Any) -> int:
    """The token id a trainer pads with: the tokenizer's pad token, else its end-of-sequence token, else 0."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    return int(pad)


def check_run_directories(
    checkpoint_dir: Optional[str | os.PathLike[str]], log_dir: Optional[str | os.PathLike[str]], *, resume: bool
) -> Optional[Path]:
    """Check a run's directories before its model loads; the checkpoint the run resumes from (None: a new run).

    A new run refuses a ``log_dir`` whose ``metrics.jsonl`` holds another run's records (with ``resume``, records of
    the run that :func:`.trainer.interrupted_run` finds are its own); ``checkpoint_dir`` must be writable and,
    without ``resume``, hold no checkpoint (``check_checkpoint_dir`` in
    :mod:`agentbolt.algorithm.finetuning.trainer`, which creates it: checked last).

    Raises:
        CheckpointError: ``checkpoint_dir`` cannot hold checkpoints, or holds another run's.
        ValueError: ``log_dir`` cannot be created or written (see :func:`check_writable_dir`), or a new run's
            ``log_dir`` holds another run's metrics.
    """
    from agentbolt.algorithm.finetuning.trainer import check_checkpoint_dir, interrupted_run, latest_checkpoint
    from agentbolt.algorithm.grpo.metrics import check_log_dir_unused

    check_writable_dir(log_dir, "log_dir")
    checkpoint = latest_checkpoint(checkpoint_dir) if checkpoint_dir and resume else None
    if checkpoint is None and not (resume and interrupted_run(checkpoint_dir, log_dir)):
        check_log_dir_unused(log_dir)
    if checkpoint_dir:
        check_checkpoint_dir(checkpoint_dir, resume=resume)
    return checkpoint


def check_writable_dir(path: Optional[str | os.PathLike[str]], option: str) -> None:
    """Refuse a directory option that cannot be created or written, without creating it (None passes).

    Raises:
        ValueError: ``path`` is a file, lies under a file, or its nearest existing directory is not writable; the
            message starts with ``option``.
    """
    if not path:
        return
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{option}: {directory} is a file, not a directory")
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{option}: {directory} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{option}: {directory} cannot be written: {existing} is not writable")


def new_run_id(log_dir: Optional[str | os.PathLike[str]], algorithm: str) -> str:
    """The id of a new run: its log directory's name (else ``algorithm``), the start time and 4 random hex digits,
    so that runs sharing a store, or log directories of the same name, never share an id."""
    base = Path(log_dir).resolve().name if log_dir else algorithm
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def forget_interrupted_log(run_id: str, log_dir: Optional[str | os.PathLike[str]]) -> None:
    """Start the run ``run_id``, which stopped before its first checkpoint, again from step 0: drop the records its
    stopped process wrote to ``log_dir/metrics.jsonl`` (the run logs those steps again), and say so."""
    from agentbolt.algorithm.grpo.metrics import drop_logged_steps_after

    dropped = drop_logged_steps_after(log_dir, -1) if log_dir else 0
    logger.warning(
        "Run %s stopped before its first checkpoint; it starts again from step 0 under its id%s.",
        run_id,
        f" (its {dropped} record(s) in {log_dir} are logged again)" if dropped else "",
    )


class FinetuningAlgorithm(Algorithm):
    """Base of the algorithms that train the weights of the model their agents call.

    Args:
        config: The algorithm's config object, a dict of its fields, or None for the defaults.
        model: The model to train: a model name or directory (overrides ``config.model``), or an already loaded
            transformers causal LM (then ``tokenizer`` is required). Default: the embedded model.
        tokenizer: Tokenizer of a model object (its chat template renders prompts).
        adapter: Spans-to-triplets adapter (default: :meth:`_default_adapter`).
        **overrides: Config fields overriding ``config``.

    Raises:
        pydantic.ValidationError: An option is invalid.
        ValueError: A model object without its tokenizer.
    """

    config_class: ClassVar[Type[FinetuningConfig]] = FinetuningConfig
    """The config model of the algorithm."""
    group_metadata_key: ClassVar[str] = "group"
    """Rollout metadata key holding the id of the task a rollout belongs to."""
    title: ClassVar[str] = "Finetuning"
    """The algorithm's name in logs, on the progress bar and on the reward curve."""
    trainer: Optional[ModelTrainer] = None
    """The trainer of the current run (set when :meth:`run` starts)."""
    run_id: Optional[str] = None
    """The current run's id (set when :meth:`run` starts; a resumed run keeps the one saved in its checkpoint): it
    names the run's metrics in the store and is in the ``run_id`` metadata of its rollouts."""
    _draw_tasks: Optional[Callable[[int], List[Any]]] = None
    """The next ``count`` training tasks from the run's sampler (set when :meth:`run` starts with training data)."""

    def __init__(
        self,
        config: Union[FinetuningConfig, Dict[str, Any], None] = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        adapter: Any = None,
        **overrides: Any,
    ) -> None:
        super().__init__()
        # Before torch loads (training imports it): idle OpenMP threads must sleep, since the engine, the trainer and
        # the runners share the CPUs. Here too, since the package-level hooks are skipped by ``agl.GRPO``.
        from agentbolt.serving.transformers_engine import configure_openmp

        configure_openmp()
        if config is not None and not isinstance(config, (FinetuningConfig, Mapping)):
            raise TypeError(
                f"config must be a {self.config_class.__name__} or a dict of its fields, got {type(config).__name__}"
            )
        base = config.model_dump() if isinstance(config, FinetuningConfig) else dict(config or {})
        base.update(overrides)
        if isinstance(model, str):
            base["model"] = model
            model = None
        self.config = self.config_class(**base)
        if model is not None and tokenizer is None:
            name = type(self).__name__
            raise ValueError(f"a model object needs its tokenizer: {name}(model=model, tokenizer=tokenizer)")
        self._model = model
        self._tokenizer = tokenizer
        self._adapter = adapter
        self._gateway: Optional[LLMProxy] = None  # the proxy recording the rollouts' LLM calls, once started
        self._routed_names: Set[str] = set()  # names of the served model(s) this run put in the gateway's model list
        self.history: List[Dict[str, float]] = []

    @property
    def reports_progress(self) -> bool:
        """With ``console`` on, the algorithm shows its own progress bar and per-step metrics."""
        return self.config.console

    # ------------------------------------------------------------------------------------------------ set-up
    def _load_policy(self) -> Tuple[Any, Any]:
        """The model to train and its tokenizer (loaded in float32; the trainer casts to ``config.dtype``)."""
        if self._model is not None:
            return self._model, self._tokenizer
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentbolt.models import DEFAULT_MODEL, resolve_model

        name = self.config.model or DEFAULT_MODEL
        resolved = resolve_model(name)
        if resolved.source == "gguf":
            raise ValueError(f"{type(self).__name__} trains a Hugging Face model directory, not a GGUF file: {name!r}")
        tokenizer = AutoTokenizer.from_pretrained(resolved.path)
        model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype="float32")
        return model, tokenizer

    def _served_name(self) -> str:
        return self.config.served_model_name or self.config.model or "policy"

    def _default_adapter(self) -> Any:
        """The adapter used when none was passed to the constructor."""
        from agentbolt.adapter import LlmProxyTraceToTriplet

        return LlmProxyTraceToTriplet()

    def _triplet_adapter(self) -> Any:
        return self._adapter if self._adapter is not None else self._default_adapter()

    def _model_entries(self, server: PolicyServer) -> List[Dict[str, Any]]:
        """The gateway's model list: the served model (subclasses may add other backends)."""
        return [
            {
                "model_name": server.model_name,
                "litellm_params": {"model": f"agentbolt/{server.model_name}", "api_base": server.base_url},
            }
        ]

    async def _start_gateway(self, store: LightningStore, server: PolicyServer) -> Tuple[LLMProxy, bool]:
        """Route the served model through the LLM gateway (the trainer's proxy, or one started here)."""
        from agentbolt.llm_proxy import LLMProxy

        proxy = self.get_llm_proxy()
        owned = proxy is None
        if proxy is None:
            capabilities = store.capabilities
            mode: LaunchMode = (
                "thread" if capabilities.get("thread_safe") else "asyncio" if capabilities.get("async_safe") else "mp"
            )
            proxy = LLMProxy(store=store, launch_mode=mode, host="127.0.0.1")
            proxy.server_launcher_args.log_level = logging.WARNING  # an internal server: no uvicorn lifecycle lines
        else:
            proxy.set_store(store)
        changed = self._route(proxy, server)
        if not proxy.is_running():
            await proxy.start()
        elif changed and proxy.server_launcher_args.launch_mode == "mp":
            await proxy.restart()  # a server in another process only reads the model list when it starts
        self._gateway = proxy
        return proxy, owned

    def _route(self, proxy: LLMProxy, server: PolicyServer) -> bool:
        """Add (or replace) the served model's entries in the gateway's model list; True when it changed.

        Entries of other models (a judge, a tool model the agent also calls through the same gateway) are kept;
        the entries this run added earlier (a previous adapter version's name) are replaced.
        """
        entries = self._model_entries(server)
        ours = self._routed_names | {entry["model_name"] for entry in entries}
        merged = [entry for entry in proxy.model_list if entry["model_name"] not in ours] + entries
        self._routed_names = {entry["model_name"] for entry in entries}
        if proxy.model_list == merged:
            return False
        proxy.update_model_list(merged)  # type: ignore[arg-type]
        return True

    async def _unroute(self, proxy: LLMProxy, original: List[Any]) -> None:
        """Give a trainer's proxy back the model list it had before the run (best effort: a failure is logged)."""
        self._routed_names = set()
        if proxy.model_list == original:
            return
        try:
            proxy.update_model_list(original)
            if proxy.is_running() and proxy.server_launcher_args.launch_mode == "mp":
                await proxy.restart()  # a server in another process only reads the model list when it starts
        except Exception:
            logger.exception("Could not restore the LLM proxy's model list after the run")

    async def _publish(
        self,
        store: LightningStore,
        proxy: LLMProxy,
        server: PolicyServer,
        sampling_parameters: Dict[str, Any],
        model: Optional[str] = None,
    ) -> str:
        """Store a new resource snapshot whose ``main_llm`` routes to ``model`` (default: the current weights)."""
        if self._route(proxy, server) and proxy.is_running() and proxy.server_launcher_args.launch_mode == "mp":
            await proxy.restart()  # a server in another process only reads the model list when it starts
        resources: NamedResources = dict(self.get_initial_resources() or {})
        llm: LLM = proxy.as_resource(model=model or server.model_name, sampling_parameters=dict(sampling_parameters))
        resources[POLICY_RESOURCE] = llm
        with self._riding_out_outages():
            update = await store.add_resources(resources)
        return update.resources_id

    def _start_server(self, trainer: ModelTrainer, tokenizer: Any) -> PolicyServer:
        config = self.config
        if config.policy_server_url is not None:
            import tempfile

            from agentbolt.algorithm.grpo.serving import RemoteAdapterPolicyServer

            adapter_dir = config.adapter_dir or (
                os.path.join(config.checkpoint_dir, "adapters")
                if config.checkpoint_dir
                else tempfile.mkdtemp(prefix="agentbolt-adapters-")
            )
            return RemoteAdapterPolicyServer(
                trainer,
                base_url=config.policy_server_url,
                adapter_dir=adapter_dir,
                name_prefix=self._served_name().replace("/", "-"),
                api_key=config.policy_server_api_key,
            )
        from agentbolt.algorithm.grpo.serving import InProcessPolicyServer

        return InProcessPolicyServer(
            trainer,
            tokenizer,
            model_name=self._served_name(),
            threads=config.threads,
            max_batch_size=config.serve_max_batch_size,
        )

    @contextlib.asynccontextmanager
    async def _serving(
        self, store: LightningStore, trainer: ModelTrainer, tokenizer: Any
    ) -> AsyncIterator[Tuple[PolicyServer, LLMProxy]]:
        """Serve the trained model and route the gateway to it; both are stopped on exit (a proxy set by the
        trainer is left running, with the model list it had before the run)."""
        server = await asyncio.to_thread(self._start_server, trainer, tokenizer)
        proxy: Optional[LLMProxy] = None
        owned_proxy = False
        given = self.get_llm_proxy()
        original = list(given.model_list) if given is not None else []
        try:
            proxy, owned_proxy = await self._start_gateway(store, server)
            yield server, proxy
        finally:
            if proxy is not None and owned_proxy and proxy.is_running():
                await proxy.stop()
            elif given is not None:
                await self._unroute(given, original)
            await asyncio.to_thread(server.stop)

    # -------------------------------------------------------------------------------------------------- rollouts
    async def _run_rollouts(
        self,
        store: LightningStore,
        tasks: Sequence[Any],
        *,
        mode: RolloutMode,
        step: int,
        resources_id: str,
        copies: int = 1,
        first_group: int = 0,
    ) -> List[RolloutOutcome]:
        """Enqueue each task ``copies`` times, wait for the rollouts and collect rewards and triplets.

        The rollouts of task ``i`` form the group ``{mode}-{step}-{first_group + i}``, in each rollout's metadata
        with the run's :attr:`run_id` and ``step``. Every store call rides out a store outage of up to
        ``store_outage_timeout`` seconds.
        """
        with self._riding_out_outages():
            groups = [f"{mode}-{step}-{first_group + i}" for i in range(len(tasks)) for _ in range(copies)]
            requests = [
                EnqueueRolloutRequest(
                    input=tasks[i // copies],
                    mode=mode,
                    resources_id=resources_id,
                    metadata={self.group_metadata_key: group, "run_id": self.run_id, "step": step},
                )
                for i, group in enumerate(groups)
            ]
            rollouts = list(await store.enqueue_many_rollouts(requests))
            group_of = {r.rollout_id: group for r, group in zip(rollouts, groups, strict=True)}
            finished = await self._wait(store, [r.rollout_id for r in rollouts])
            finished.update(
                await self._cancel_late(store, [r.rollout_id for r in rollouts if r.rollout_id not in finished])
            )
            adapter = self._triplet_adapter()
            from agentbolt.utils.reward_spans import training_reward

            outcomes: List[RolloutOutcome] = []
            for rollout in rollouts:
                done = finished.get(rollout.rollout_id)
                status = "late" if done is None else done.status
                # The calls of failed and late rollouts are collected too; each algorithm decides what to do with them.
                spans = await self._settled_spans(store, rollout.rollout_id)
                triplets = list(adapter.adapt(spans)) if spans else []
                reward = training_reward(spans, rollout.rollout_id) if status == "succeeded" else None
                outcomes.append(
                    RolloutOutcome(rollout.rollout_id, group_of[rollout.rollout_id], status, reward, triplets)
                )
            return outcomes

    def _riding_out_outages(self) -> AbstractContextManager[None]:
        """The block in which the run's store calls retry through an outage of ``store_outage_timeout`` seconds."""
        return ride_out_outages(self.config.store_outage_timeout)

    async def _cancel_late(self, store: LightningStore, rollout_ids: Sequence[str]) -> Dict[str, Rollout]:
        """Cancel the rollouts that did not finish within the wait; those that finished since are returned instead.

        Called right after the wait, and each rollout's status is read again just before it is cancelled, so a
        rollout that finished meanwhile keeps its result (the store has no conditional update).
        """
        from agentbolt.store.base import is_finished

        finished_since: Dict[str, Rollout] = {}
        for rollout_id in rollout_ids:
            current = await store.get_rollout_by_id(rollout_id)
            if current is not None and is_finished(current):
                finished_since[rollout_id] = current
                continue
            await store.update_rollout(rollout_id, status="cancelled")
        return finished_since

    async def _settled_spans(self, store: LightningStore, rollout_id: str) -> List[Span]:
        """The latest attempt's spans, once every span whose sequence id the store issued has arrived.

        Spans are written asynchronously (the gateway writes its call spans off the hot path), so a rollout can be
        reported finished while the span of its last LLM call is still on its way: the gateway's ``flush`` waits
        for those. For spans of other sources, the store issues sequence ids 1, 2, 3... per rollout, so a gap below
        the highest stored id means a span is still in flight: wait for it, at most ``SPAN_SETTLE_SECONDS``.
        """
        if self._gateway is not None:
            await self._gateway.flush(SPAN_SETTLE_SECONDS)
        deadline = time.monotonic() + SPAN_SETTLE_SECONDS
        while True:
            spans = list(await store.query_spans(rollout_id))
            ids = {span.sequence_id for span in spans}
            if not ids or len(ids) >= max(ids) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        if ids and len(ids) < max(ids):
            logger.warning("Rollout %s: spans %s never arrived.", rollout_id, sorted(set(range(1, max(ids) + 1)) - ids))
        latest = await store.get_latest_attempt(rollout_id)
        return [span for span in spans if latest is None or span.attempt_id == latest.attempt_id]

    async def _wait(self, store: LightningStore, rollout_ids: List[str]) -> Dict[str, Rollout]:
        """The rollouts of ``rollout_ids`` finished within ``rollout_timeout``, riding out a store outage."""
        with self._riding_out_outages():
            return await wait_for_finished_rollouts(store, rollout_ids, timeout=self.config.rollout_timeout)

    # ---------------------------------------------------------------------------------------------- validation
    def _score(self, outcome: RolloutOutcome) -> Optional[float]:
        """The final reward a rollout counts with in reward means (None: not counted)."""
        return outcome.reward if outcome.usable else None

    async def _validate(
        self, store: LightningStore, proxy: LLMProxy, server: PolicyServer, val_dataset: Sequence[Any], step: int
    ) -> Dict[str, float]:
        resources_id = await self._publish(store, proxy, server, self.config.val_sampling_parameters)
        outcomes = await self._run_rollouts(store, val_dataset, mode="val", step=step, resources_id=resources_id)
        correct = sum(1 for o in outcomes if o.reached(self.config.val_success_reward))
        mean, _ = mean_std([score for score in map(self._score, outcomes) if score is not None])
        return {
            "val/reward_mean": mean,
            "val/accuracy": correct / len(outcomes) if outcomes else float("nan"),
            "val/correct": float(correct),
            "val/total": float(len(outcomes)),
            "val/failed_rollouts": float(sum(1 for o in outcomes if not o.usable)),
        }

    @staticmethod
    async def _update_weights(
        server: PolicyServer, trainer: ModelTrainer, train: Callable[[], Dict[str, float]]
    ) -> Dict[str, float]:
        """Run ``train`` (an update of ``trainer``'s weights) in a worker thread while ``server`` pauses generation,
        then make the server use the new weights; returns what ``train`` returned."""

        def update() -> Dict[str, float]:
            with server.weights_update(), trainer.update_threads():
                metrics = train()
            server.after_update(trainer)
            return metrics

        return await asyncio.to_thread(update)

    def _record(self, metrics: Any, step: int, record: Dict[str, float]) -> None:
        self.history.append({"step": float(step), **record})
        metrics.log(step, record)

    # ------------------------------------------------------------------------------------------------------ run
    def _build_trainer(self) -> Tuple[ModelTrainer, Any]:
        """The algorithm's trainer around the loaded model, and the model's tokenizer."""
        raise NotImplementedError(f"{type(self).__name__} must implement _build_trainer()")

    async def _train_step(
        self,
        store: LightningStore,
        proxy: LLMProxy,
        server: PolicyServer,
        trainer: Any,
        tokenizer: Any,
        tasks: Sequence[Any],
        resources_id: str,
        step: int,
    ) -> Dict[str, float]:
        """Roll out ``tasks`` with the resources ``resources_id``, update the weights; the step's metrics."""
        raise NotImplementedError(f"{type(self).__name__} must implement _train_step()")

    def _check_run(self) -> None:
        """Refuse options that cannot run, before any model is loaded; subclasses check theirs after these.

        The config alone does not refuse periodic checkpoints without a directory: a script may fill
        ``checkpoint_dir`` in after validating the rest.

        Raises:
            ValueError: ``checkpoint_interval > 0`` and no ``checkpoint_dir``.
        """
        config = self.config
        if config.checkpoint_interval > 0 and not config.checkpoint_dir:
            raise ValueError(
                f"checkpoint_interval={config.checkpoint_interval} needs a checkpoint_dir to write checkpoints to: "
                "without one no checkpoint is saved and the run cannot be resumed"
            )

    def _data_order(self) -> Dict[str, Any]:
        """This run's values of ``_DATA_ORDER_OPTIONS``, as its checkpoints save them."""
        return {name: getattr(self.config, name) for name in _DATA_ORDER_OPTIONS}

    def _new_run_id(self) -> str:
        return new_run_id(self.config.log_dir, self.title.lower())

    async def _cancel_interrupted_rollouts(self, store: LightningStore) -> None:
        """Cancel the rollouts of this run that an interrupted process left unfinished in the store.

        They belong to the steps after the checkpoint the run resumes from, which it rolls out again: left alone,
        queued ones would take the runners' time and running ones would end as failures, long after anyone waits
        for them. Rollouts are found by their ``run_id`` metadata (see :meth:`_run_rollouts`).
        """
        with self._riding_out_outages():
            unfinished = await store.query_rollouts(status_in=["queuing", "preparing", "running", "requeuing"])
            stale = [r for r in unfinished if (r.metadata or {}).get("run_id") == self.run_id]
            for rollout in stale:
                await store.update_rollout(rollout.rollout_id, status="cancelled")
        if stale:
            steps = sorted({step for r in stale if isinstance(step := (r.metadata or {}).get("step"), int)})
            logger.warning(
                "Cancelled %d rollout(s) of step(s) %s that the interrupted process of run %s left unfinished in the "
                "store; the run rolls those steps out again.",
                len(stale),
                ", ".join(map(str, steps)) or "?",
                self.run_id,
            )

    def _after_resume(self, trainer: Any) -> None:
        """Called once the trainer is built and resumed, before the first step."""

    def _after_last_step(self, trainer: Any, start_step: int) -> None:
        """Called after the last step of the run (its checkpoint is written)."""

    async def run(  # type: ignore[override]  # datasets must be sized sequences here
        self, train_dataset: Optional[Sequence[Any]] = None, val_dataset: Optional[Sequence[Any]] = None
    ) -> None:
        """Train on ``train_dataset`` for ``max_steps`` steps, validating on ``val_dataset``.

        The run resumes from the latest checkpoint in ``checkpoint_dir`` when ``resume`` is set. It validates before
        the first step (``val_before_train``), every ``val_interval`` steps and after the last one, publishes a
        new ``main_llm`` resource snapshot after every update, and checkpoints every ``checkpoint_interval`` steps
        and after the last one.

        A resumed run keeps its :attr:`run_id` and continues ``log_dir/metrics.jsonl`` (dropping the records of the
        steps after its checkpoint, which it runs again), and first cancels the rollouts of this run that the
        interrupted process left unfinished in the store. A run stopped before its first checkpoint is started again
        from step 0 under its id (see :func:`.trainer.interrupted_run`). A resumed run whose checkpoint is at
        ``max_steps`` or beyond logs that it is already complete and returns without serving or training anything.

        Raises:
            ValueError: No training data while ``max_steps > 0``, no store set, options the algorithm refuses, or a
                new run (not resumed from a checkpoint) whose ``log_dir`` already holds another run's metrics
                (checked before the model loads).
            CheckpointError: ``checkpoint_dir`` cannot be created or written to (checked before the model loads), the
                checkpoint to resume from is corrupt, was trained with another ``seed`` (checked before the model
                loads: its sampler's position is in that seed's order) or belongs to another policy (another base
                model or LoRA settings), or one cannot be written.
        """
        config = self.config
        store = self.get_store()
        train = list(train_dataset or [])
        val = list(val_dataset or [])
        if config.max_steps > 0 and not train:
            raise ValueError(f"{self.title} needs a non-empty train_dataset (or max_steps=0 to only validate)")
        self._check_run()
        from agentbolt.algorithm.finetuning.trainer import (
            check_data_order,
            checkpoint_state,
            interrupted_run,
            write_run_file,
        )

        # Checked before the model loads, not after the last step.
        checkpoint = check_run_directories(config.checkpoint_dir, config.log_dir, resume=config.resume)
        restarted = interrupted_run(config.checkpoint_dir, config.log_dir) if config.resume else None
        if checkpoint is None:
            self.run_id = restarted or self._new_run_id()
            if config.checkpoint_dir:
                write_run_file(config.checkpoint_dir, self.run_id, config.log_dir)
        else:
            check_data_order(checkpoint, self._data_order(), "use a new checkpoint_dir (and log_dir)")
            saved = checkpoint_state(checkpoint).get("extra")
            saved_id = saved.get("run_id") if isinstance(saved, dict) else None
            self.run_id = saved_id if isinstance(saved_id, str) and saved_id else self._new_run_id()
        if restarted:
            forget_interrupted_log(self.run_id, config.log_dir)
        if checkpoint is not None or restarted:
            # Before the model loads, so that the runners spend as little time as possible on them.
            await self._cancel_interrupted_rollouts(store)
        trainer, tokenizer = await asyncio.to_thread(self._build_trainer)
        self.trainer = trainer
        try:
            await self._train(store, trainer, tokenizer, train, val, checkpoint)
        finally:
            await asyncio.to_thread(trainer.close)

    async def _train(
        self,
        store: LightningStore,
        trainer: ModelTrainer,
        tokenizer: Any,
        train: Sequence[Any],
        val: Sequence[Any],
        checkpoint: Optional[Path],
    ) -> None:
        """Resume from ``checkpoint`` (None: a new run), then validate, train, publish and checkpoint."""
        from agentbolt.algorithm.finetuning.trainer import remove_run_file
        from agentbolt.algorithm.grpo.metrics import TrainingLogger

        config = self.config
        sampler = TaskSampler(len(train), config.batch_size, config.seed) if train else None
        if sampler is not None:
            self._draw_tasks = lambda count: [train[i] for i in sampler.take(count)]
        if checkpoint is not None:
            saved = await asyncio.to_thread(trainer.load_checkpoint, checkpoint)
            if sampler is not None:
                sampler.load_state(saved.get("sampler", {}))
        start_step = trainer.global_step
        if checkpoint is not None and 0 < config.max_steps <= start_step:
            logger.warning(
                "%s run %s is already complete: its latest checkpoint %s is at step %d and max_steps is %d, so "
                "there is nothing to train. To train it further, raise max_steps above %d; to start a new run, use a "
                "new checkpoint_dir (and log_dir).",
                self.title,
                self.run_id,
                checkpoint,
                start_step,
                config.max_steps,
                start_step,
            )
            return
        self._after_resume(trainer)
        metrics = TrainingLogger(
            log_dir=config.log_dir,
            total_steps=config.max_steps,
            start_step=start_step,
            console=config.console,
            tensorboard=config.tensorboard,
            wandb_project=config.wandb_project,
            run_config=config.model_dump(),
            title=self.title,
            run_id=self.run_id,
            resumed=checkpoint is not None,
        )
        try:
            async with self._serving(store, trainer, tokenizer) as (server, proxy):
                if val and config.val_before_train and start_step == 0:
                    self._record(metrics, 0, await self._validate(store, proxy, server, val, 0))
                resources_id = await self._publish(store, proxy, server, config.sampling_parameters)
                for step in range(start_step + 1, config.max_steps + 1):
                    assert sampler is not None
                    tasks = [train[i] for i in sampler.next_batch()]
                    record = await self._train_step(store, proxy, server, trainer, tokenizer, tasks, resources_id, step)
                    resources_id = await self._publish(store, proxy, server, config.sampling_parameters)
                    periodic = config.val_interval > 0 and step % config.val_interval == 0
                    if val and (periodic or step == config.max_steps):
                        record.update(await self._validate(store, proxy, server, val, step))
                        resources_id = await self._publish(store, proxy, server, config.sampling_parameters)
                    self._record(metrics, step, record)
                    last = step == config.max_steps
                    if config.checkpoint_dir and (
                        last or (config.checkpoint_interval and step % config.checkpoint_interval == 0)
                    ):
                        extra = {"sampler": sampler.state(), "run_id": self.run_id, **self._data_order()}
                        await asyncio.to_thread(trainer.save_checkpoint, config.checkpoint_dir, extra)
                self._after_last_step(trainer, start_step)
            if config.checkpoint_dir:
                remove_run_file(config.checkpoint_dir)  # a run without training steps writes no checkpoint
        finally:
            curve = metrics.close()
            if curve is not None:
                logger.info("Reward curve written to %s", curve)
