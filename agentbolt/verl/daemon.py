"""The agent-mode daemon: VERL's generation step, done by agentbolt runners against VERL's vLLM servers.

For each training (or validation) step the daemon

1. points the gateway (:class:`~agentbolt.llm_proxy.LLMProxy`) at VERL's vLLM servers and publishes it as the
   ``main_llm`` resource, so agents reach the policy being trained through it and every call is recorded with the
   exact prompt and response token ids (and logprobs) vLLM used;
2. enqueues ``n`` rollouts of every task of the batch (one GRPO group per task, sharing a ``uid``);
3. waits until the runners finished them (late ones count as failed);
4. reads their spans back, turns them into triplets with the algorithm's adapter, and aggregates them into
   training samples: one per LLM call (``level="transition"``) or one per rollout, its calls joined into one
   sequence whose tool and user turns are masked out (``level="trajectory"``);
5. builds VERL's batch: left-padded prompts, right-padded responses, masks, position ids, the rollout's reward
   on the last response token, and the engine's logprobs when every sample has them.

The store calls run on a private event loop thread, so the daemon's methods are plain blocking calls, as VERL's
trainer loop expects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Dict, List, Literal, Optional, Sequence, Tuple, TypeVar

from agentbolt.adapter.agent_match import compile_agent_match, select_calls
from agentbolt.adapter.triplet import parse_logprobs, triplet_token_ids
from agentbolt.store.utils import wait_for_finished_rollouts
from agentbolt.types import Rollout, RolloutConfig, Triplet
from agentbolt.utils.counters import Counters

if TYPE_CHECKING:
    import torch

    from agentbolt.adapter import TraceAdapter
    from agentbolt.llm_proxy import LLMProxy
    from agentbolt.store.base import LightningStore

__all__ = [
    "AgentModeDaemon",
    "AggregationStats",
    "TrainingSample",
    "aggregate_rollout",
    "build_batch",
    "check_gateway_port",
    "trim_to_multiple",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Level = Literal["transition", "trajectory"]


@dataclass
class TrainingSample:
    """One row of VERL's batch.

    Attributes:
        prompt_ids: Prompt tokens as the engine saw them.
        response_ids: Tokens after the prompt: the model's, and (in a joined trajectory) the tool and user turns
            between its calls.
        response_mask: 1 for tokens the model sampled (trained on), 0 for the others.
        reward: The reward this sample is trained on.
        uid: Group id: every sample of the rollouts of one task shares it (GRPO's advantage group).
        rollout_id: Rollout the sample comes from.
        logprobs: The engine's logprob of each response token (0.0 for masked tokens), or None when unknown.
    """

    prompt_ids: List[int]
    response_ids: List[int]
    response_mask: List[int]
    reward: float
    uid: str
    rollout_id: str
    logprobs: Optional[List[float]] = None


@dataclass
class AggregationStats(Counters):
    """What the aggregation kept, cut and dropped."""

    calls: int = 0
    """LLM calls read from the traces."""
    calls_without_tokens: int = 0
    """Calls without prompt or response token ids (not trained on)."""
    calls_of_other_agents: int = 0
    """Calls of agents that ``agent_match`` excludes (calls without an agent name included)."""
    mismatches: int = 0
    """Calls whose prompt did not continue the trajectory so far (each starts a new sample)."""
    prompts_too_long: int = 0
    """Samples dropped because the prompt exceeds the prompt length."""
    responses_cut: int = 0
    """Samples whose response was cut to the response length."""
    mismatch_cases: List[Dict[str, Any]] = field(default_factory=list)
    """The calls behind each mismatch (filled when debugging); :meth:`add` joins the lists, :meth:`as_metrics` leaves
    them out (``mismatches`` counts them)."""

    def as_metrics(self, prefix: str) -> Dict[str, float]:
        """The counts as ``{prefix + name: value}``."""
        return {prefix + f.name: float(getattr(self, f.name)) for f in fields(self) if f.name != "mismatch_cases"}


def _call_tokens(triplet: Triplet) -> Tuple[List[int], List[int], Optional[List[float]]]:
    prompt, response = triplet_token_ids(triplet.prompt), triplet_token_ids(triplet.response)
    raw = triplet.response.get("logprobs") if isinstance(triplet.response, dict) else None
    return prompt, response, parse_logprobs(raw, len(response))


def aggregate_rollout(
    triplets: Sequence[Triplet],
    *,
    rollout_id: str,
    uid: str,
    reward: float,
    level: Level = "transition",
    agent_match: Optional[str] = None,
    max_prompt_length: Optional[int] = None,
    max_response_length: Optional[int] = None,
    debug: bool = False,
) -> Tuple[List[TrainingSample], AggregationStats]:
    """Training samples of one finished rollout.

    Args:
        triplets: The adapter's output for the rollout, in call order.
        rollout_id: The rollout's id.
        uid: Its group id.
        reward: Its reward (every sample of the rollout is trained on it).
        level: ``"transition"``: one sample per call. ``"trajectory"``: calls joined into one sequence while each
            call's prompt continues the previous context (prompt + response so far); the tokens it adds (tool
            results, the next user turn, the chat template's glue) join the response with mask 0. A call whose
            prompt does not continue it starts a new sample (counted as a mismatch).
        agent_match: Regex searched in agent names (:mod:`agentbolt.adapter.agent_match`); calls of other agents,
            and calls without an agent name, are skipped (None: every call).
        max_prompt_length: Samples with longer prompts are dropped.
        max_response_length: Longer responses are cut to this many tokens.
        debug: Record the token ids of every mismatch in the stats.

    Returns:
        The samples and what happened to the calls.
    """
    stats = AggregationStats()
    calls: List[Tuple[List[int], List[int], Optional[List[float]]]] = []
    for triplet, (_, selected) in zip(triplets, select_calls(triplets, agent_match, rollout_id), strict=True):
        stats.calls += 1
        if not selected:
            stats.calls_of_other_agents += 1
            continue
        prompt, response, logprobs = _call_tokens(triplet)
        if not prompt or not response:
            stats.calls_without_tokens += 1
            continue
        calls.append((prompt, response, logprobs))

    samples: List[TrainingSample] = []
    for prompt, response, logprobs in calls:
        current = samples[-1] if samples and level == "trajectory" else None
        if current is not None:
            context = current.prompt_ids + current.response_ids
            if prompt[: len(context)] == context:
                added = prompt[len(context) :]
                current.response_ids += added + response
                current.response_mask += [0] * len(added) + [1] * len(response)
                if current.logprobs is not None and logprobs is not None:
                    current.logprobs += [0.0] * len(added) + logprobs
                else:
                    current.logprobs = None
                continue
            stats.mismatches += 1
            if debug:
                stats.mismatch_cases.append({"rollout_id": rollout_id, "context": context, "prompt": prompt})
        samples.append(
            TrainingSample(
                prompt_ids=list(prompt),
                response_ids=list(response),
                response_mask=[1] * len(response),
                reward=reward,
                uid=uid,
                rollout_id=rollout_id,
                logprobs=None if logprobs is None else list(logprobs),
            )
        )

    kept: List[TrainingSample] = []
    for sample in samples:
        if max_prompt_length is not None and len(sample.prompt_ids) > max_prompt_length:
            stats.prompts_too_long += 1
            continue
        if max_response_length is not None and len(sample.response_ids) > max_response_length:
            stats.responses_cut += 1
            sample.response_ids = sample.response_ids[:max_response_length]
            sample.response_mask = sample.response_mask[:max_response_length]
            if sample.logprobs is not None:
                sample.logprobs = sample.logprobs[:max_response_length]
        kept.append(sample)
    return kept, stats


def build_batch(
    samples: Sequence[TrainingSample], max_prompt_length: int, max_response_length: int, pad_token_id: int
) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """VERL's tensors for ``samples`` (and the per-row non-tensor data).

    Returns:
        ``tensors``: ``prompts`` [B, P] (left-padded), ``responses`` [B, R] (right-padded), ``response_mask``,
        ``input_ids`` and ``attention_mask`` [B, P+R], ``position_ids`` (0 on the left padding, then 0, 1, 2...),
        ``token_level_scores`` [B, R] (the reward on the last response token), and ``rollout_log_probs`` [B, R]
        when every sample has logprobs. ``non_tensors``: ``uid``, ``rollout_id``, ``reward`` (numpy object
        arrays).

    Raises:
        ValueError: No samples, or a sample longer than the lengths (aggregate with the same limits).
    """
    import numpy as np
    import torch

    if not samples:
        raise ValueError("no training samples: every rollout failed or produced no LLM call with token ids")
    count = len(samples)
    prompts = torch.full((count, max_prompt_length), pad_token_id, dtype=torch.long)
    prompt_attention = torch.zeros((count, max_prompt_length), dtype=torch.long)
    responses = torch.full((count, max_response_length), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((count, max_response_length), dtype=torch.long)
    response_mask = torch.zeros((count, max_response_length), dtype=torch.long)
    scores = torch.zeros((count, max_response_length), dtype=torch.float32)
    with_logprobs = all(sample.logprobs is not None for sample in samples)
    logprobs = torch.zeros((count, max_response_length), dtype=torch.float32)
    for row, sample in enumerate(samples):
        p, r = len(sample.prompt_ids), len(sample.response_ids)
        if p > max_prompt_length or r > max_response_length or r == 0:
            raise ValueError(
                f"sample of rollout {sample.rollout_id} has {p} prompt and {r} response tokens; the batch holds "
                f"1..{max_response_length} response and at most {max_prompt_length} prompt tokens"
            )
        prompts[row, max_prompt_length - p :] = torch.tensor(sample.prompt_ids, dtype=torch.long)
        prompt_attention[row, max_prompt_length - p :] = 1
        responses[row, :r] = torch.tensor(sample.response_ids, dtype=torch.long)
        response_attention[row, :r] = 1
        response_mask[row, :r] = torch.tensor(sample.response_mask, dtype=torch.long)
        scores[row, r - 1] = float(sample.reward)
        if with_logprobs and sample.logprobs is not None:
            logprobs[row, :r] = torch.tensor(sample.logprobs, dtype=torch.float32)
    attention_mask = torch.cat([prompt_attention, response_attention], dim=1)
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=1) - 1, min=0)
    tensors: Dict[str, torch.Tensor] = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "token_level_scores": scores,
    }
    if with_logprobs:
        tensors["rollout_log_probs"] = logprobs
    non_tensors = {
        "uid": np.array([s.uid for s in samples], dtype=object),
        "rollout_id": np.array([s.rollout_id for s in samples], dtype=object),
        "reward": np.array([s.reward for s in samples], dtype=object),
    }
    return tensors, non_tensors


def trim_to_multiple(samples: List[TrainingSample], multiple: int, seed: int = 0) -> List[TrainingSample]:
    """Drop randomly chosen samples so the count is a multiple of ``multiple`` (VERL splits batches evenly).

    Raises:
        ValueError: Fewer samples than ``multiple``.
    """
    if multiple <= 1:
        return list(samples)
    if len(samples) < multiple:
        raise ValueError(f"only {len(samples)} training samples; VERL needs at least {multiple} (one per rank)")
    keep = len(samples) - len(samples) % multiple
    chosen = sorted(random.Random(seed).sample(range(len(samples)), keep))
    return [samples[i] for i in chosen]


def check_gateway_port(host: str, port: Optional[int]) -> None:
    """Fail early when the gateway's port (``agentbolt.port``) is taken on ``host``: the trainer checks it before
    VERL's workers load the model, not at the first step.

    Raises:
        RuntimeError: Nothing can listen on ``host:port`` (in use, or ``host`` is not an address of this machine).
    """
    from agentbolt.utils.server_launcher import bind_socket

    if not port:
        return
    try:
        bind_socket(host, port).close()
    except OSError as exc:
        raise RuntimeError(
            f"agentbolt.port {port}: the gateway cannot listen on {host}:{port} ({exc.strerror or exc}). Choose a free "
            "port for agentbolt.port (or agentbolt.gateway_host for the interface)."
        ) from None


class AgentModeDaemon:
    """Runs VERL's rollouts through the store and builds its training batches (see the module docstring).

    Args:
        store: The store the runners serve (an HTTP client or a served store: it is used from VERL's processes).
        adapter: Turns a rollout's spans into triplets (the Trainer's adapter).
        llm_proxy: Gateway to route through; None starts one on ``host``:``port``.
        host: Interface of the gateway the daemon starts: 127.0.0.1 when the runners are on this machine, 0.0.0.0
            when they run on other nodes (agents then reach it at this node's address).
        port: Port of the gateway the daemon starts.
        train_rollout_n: Rollouts per training task (GRPO group size).
        val_rollout_n: Rollouts per validation task.
        pad_token_id: The tokenizer's padding id.
        level: ``"transition"`` or ``"trajectory"`` (see :func:`aggregate_rollout`).
        max_prompt_length: Prompt width of the batch.
        max_response_length: Response width of the batch.
        agent_match: Regex over agent names of the calls to train (None: all).
        sampling_parameters: Sampling parameters published with the LLM for training rollouts.
        val_sampling_parameters: The same for validation rollouts.
        reward_fillna_value: Reward of rollouts that failed or emitted none.
        rollout_timeout: Seconds to wait for a step's rollouts.
        rollout_config: Retry policy of the rollouts (e.g. ``unresponsive_seconds`` with retries).
        resource_name: Name of the LLM resource agents receive.
        debug: Write mismatching trajectories under ``mismatch_log_dir``.
        mismatch_log_dir: Where mismatches are written.

    Raises:
        ValueError: An unknown level.
        RuntimeError: The daemon is to start the gateway and ``port`` is taken (see :func:`check_gateway_port`).
    """

    def __init__(
        self,
        store: LightningStore,
        *,
        adapter: TraceAdapter[Any],
        llm_proxy: Optional[LLMProxy] = None,
        host: str = "127.0.0.1",
        port: Optional[int] = None,
        train_rollout_n: int = 1,
        val_rollout_n: int = 1,
        pad_token_id: int = 0,
        level: Level = "transition",
        max_prompt_length: int = 2048,
        max_response_length: int = 2048,
        agent_match: Optional[str] = None,
        sampling_parameters: Optional[Dict[str, Any]] = None,
        val_sampling_parameters: Optional[Dict[str, Any]] = None,
        reward_fillna_value: float = 0.0,
        rollout_timeout: float = 3600.0,
        rollout_config: Optional[RolloutConfig] = None,
        resource_name: str = "main_llm",
        debug: bool = False,
        mismatch_log_dir: str = "./mismatch_cases",
    ) -> None:
        if level not in ("transition", "trajectory"):
            raise ValueError(f"trace_aggregator.level must be 'transition' or 'trajectory', got {level!r}")
        if train_rollout_n < 1 or val_rollout_n < 1:
            raise ValueError("the number of rollouts per task must be at least 1")
        compile_agent_match(
            agent_match, "agentbolt.agent_match"
        )  # an invalid pattern fails here, not after the first step's rollouts
        if llm_proxy is None:
            check_gateway_port(host, port)
        self.store = store
        self.adapter = adapter
        self.llm_proxy = llm_proxy
        self.host = host
        self.port = port
        self.train_rollout_n = train_rollout_n
        self.val_rollout_n = val_rollout_n
        self.pad_token_id = pad_token_id
        self.level: Level = level
        self.max_prompt_length = max_prompt_length
        self.max_response_length = max_response_length
        self.agent_match = agent_match
        self.sampling_parameters = dict(sampling_parameters or {})
        self.val_sampling_parameters = dict(val_sampling_parameters or {"temperature": 0.0})
        self.reward_fillna_value = reward_fillna_value
        self.rollout_timeout = rollout_timeout
        self.rollout_config = rollout_config
        self.resource_name = resource_name
        self.debug = debug
        self.mismatch_log_dir = Path(mismatch_log_dir)
        self.model_name: Optional[str] = None
        self.server_addresses: List[str] = []
        self.is_train = True
        self._rollouts: Dict[str, str] = {}  # rollout id -> uid
        self._finished: Dict[str, Rollout] = {}
        self._step = 0
        self._owns_proxy = llm_proxy is None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent-mode-daemon", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ plumbing

    def _call(self, coroutine: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop the gateway the daemon started and its event loop thread."""
        if self._owns_proxy and self.llm_proxy is not None and self.llm_proxy.is_running():
            self._call(self.llm_proxy.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # ------------------------------------------------------------------ the gateway

    @staticmethod
    def served_model_name(address: str, timeout: float = 30.0) -> str:
        """The model id a vLLM server at ``address`` (``host:port``) serves (``GET /v1/models``).

        Raises:
            RuntimeError: The server did not answer with a model.
        """
        import httpx

        try:
            answer = httpx.get(f"http://{address}/v1/models", timeout=timeout)
            answer.raise_for_status()
            return str(answer.json()["data"][0]["id"])
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise RuntimeError(f"the vLLM server at {address} did not list its model: {exc}") from exc

    def _model_list(self, addresses: Sequence[str], model: str) -> List[Dict[str, Any]]:
        return [
            {"model_name": model, "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": f"http://{a}/v1"}}
            for a in addresses
        ]

    async def _ensure_gateway(self, addresses: Sequence[str]) -> None:
        from agentbolt.llm_proxy import LLMProxy

        if self.model_name is None:
            self.model_name = await asyncio.to_thread(self.served_model_name, addresses[0])
        model_list = self._model_list(addresses, self.model_name)
        if self.llm_proxy is None:
            self.llm_proxy = LLMProxy(
                port=self.port,
                host=self.host,
                model_list=model_list,
                store=self.store,
                launch_mode="thread",  # type: ignore[arg-type]
            )
        elif list(addresses) != self.server_addresses:
            self.llm_proxy.update_model_list(model_list)  # type: ignore[arg-type]
        if self.llm_proxy.get_store() is None:
            self.llm_proxy.set_store(self.store)
        if not self.llm_proxy.is_running():
            await self.llm_proxy.start()
        self.server_addresses = list(addresses)

    # ------------------------------------------------------------------ one step

    def set_up_data_and_server(
        self, tasks: Sequence[Any], server_addresses: Sequence[str], is_train: bool = True
    ) -> None:
        """Route the gateway to ``server_addresses`` (``host:port`` of VERL's vLLM servers), publish the LLM and
        enqueue ``n`` rollouts of every task.

        Raises:
            ValueError: No task or no server address.
        """
        if not tasks:
            raise ValueError("no tasks to roll out")
        if not server_addresses:
            raise ValueError("no vLLM server address to route the agents to")
        self._call(self._set_up(list(tasks), list(server_addresses), is_train))

    async def _set_up(self, tasks: List[Any], addresses: List[str], is_train: bool) -> None:
        await self._ensure_gateway(addresses)
        assert self.llm_proxy is not None and self.model_name is not None
        self.is_train = is_train
        self._step += 1
        self._rollouts = {}
        self._finished = {}
        params = self.sampling_parameters if is_train else self.val_sampling_parameters
        # On 0.0.0.0 the gateway announces this node's outbound address, which agents on other nodes can reach.
        resource = self.llm_proxy.as_resource(model=self.model_name, sampling_parameters=params)
        resources_id = (await self.store.add_resources({self.resource_name: resource})).resources_id
        repeats = self.train_rollout_n if is_train else self.val_rollout_n
        mode = "train" if is_train else "val"
        for index, task in enumerate(tasks):
            uid = uuid.uuid4().hex
            for _ in range(repeats):
                rollout = await self.store.enqueue_rollout(
                    input=task,
                    mode=mode,
                    resources_id=resources_id,
                    config=self.rollout_config,
                    metadata={"uid": uid, "task_index": index, "step": self._step},
                )
                self._rollouts[rollout.rollout_id] = uid
        logger.info("Enqueued %d %s rollouts of %d tasks", len(self._rollouts), mode, len(tasks))

    def run_until_all_finished(self) -> Dict[str, int]:
        """Wait until every rollout of the step finished or ``rollout_timeout`` passed; returns counts by status.

        Rollouts still unfinished at the deadline are cancelled and count as failed.
        """
        return self._call(self._wait())

    async def _wait(self) -> Dict[str, int]:
        ids = list(self._rollouts)
        self._finished = await wait_for_finished_rollouts(self.store, ids, timeout=self.rollout_timeout)
        late = [rollout_id for rollout_id in ids if rollout_id not in self._finished]
        for rollout_id in late:
            logger.warning("Rollout %s did not finish within %g s; cancelling it", rollout_id, self.rollout_timeout)
            self._finished[rollout_id] = await self.store.update_rollout(rollout_id, status="cancelled")
        if self.llm_proxy is not None:
            await self.llm_proxy.flush()  # the last calls' spans may still be on their way
        counts: Dict[str, int] = {}
        for rollout in self._finished.values():
            counts[rollout.status] = counts.get(rollout.status, 0) + 1
        return counts

    async def _rollout_samples(
        self, max_prompt_length: int, max_response_length: int
    ) -> Tuple[List[TrainingSample], AggregationStats, List[float]]:
        from agentbolt.utils.reward_spans import training_reward

        samples: List[TrainingSample] = []
        stats = AggregationStats()
        rewards: List[float] = []
        for rollout_id, uid in self._rollouts.items():
            rollout = self._finished.get(rollout_id)
            spans = list(await self.store.query_spans(rollout_id, attempt_id="latest"))
            succeeded = rollout is not None and rollout.status == "succeeded"
            reward = training_reward(spans, rollout_id) if succeeded else None
            value = self.reward_fillna_value if reward is None else float(reward)
            rewards.append(value)
            triplets = list(self.adapter.adapt(spans)) if spans else []
            rollout_samples, rollout_stats = aggregate_rollout(
                triplets,
                rollout_id=rollout_id,
                uid=uid,
                reward=value,
                level=self.level,
                agent_match=self.agent_match,
                max_prompt_length=max_prompt_length,
                max_response_length=max_response_length,
                debug=self.debug,
            )
            samples.extend(rollout_samples)
            stats.add(rollout_stats)
        return samples, stats, rewards

    def _write_mismatches(self, stats: AggregationStats) -> None:
        if not (self.debug and stats.mismatch_cases):
            return
        self.mismatch_log_dir.mkdir(parents=True, exist_ok=True)
        path = self.mismatch_log_dir / f"step-{self._step}.jsonl"
        with path.open("a", encoding="utf-8") as handle:
            for case in stats.mismatch_cases:
                handle.write(json.dumps(case) + "\n")
        logger.warning("%d trajectory mismatches written to %s", len(stats.mismatch_cases), path)

    def get_train_data_batch(
        self,
        max_prompt_length: Optional[int] = None,
        max_response_length: Optional[int] = None,
        device: Any = None,
        multiple: int = 1,
    ) -> Tuple[Any, Dict[str, float]]:
        """VERL's ``DataProto`` of the step's samples, and metrics of the step.

        Args:
            max_prompt_length: Prompt width (default: the daemon's).
            max_response_length: Response width (default: the daemon's).
            device: Device of the tensors (default: CPU).
            multiple: Keep a multiple of this many samples (VERL's data-parallel size).

        Raises:
            ValueError: No sample could be built.
        """
        from verl.protocol import DataProto

        tensors, non_tensors, metrics = self.get_batch_tensors(max_prompt_length, max_response_length, multiple)
        batch = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={})
        if device is not None:
            batch = batch.to(device)
        return batch, metrics

    def get_batch_tensors(
        self, max_prompt_length: Optional[int] = None, max_response_length: Optional[int] = None, multiple: int = 1
    ) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, float]]:
        """The tensors of :meth:`get_train_data_batch` (see :func:`build_batch`), without VERL's container."""
        prompt_length = max_prompt_length or self.max_prompt_length
        response_length = max_response_length or self.max_response_length
        samples, stats, rewards = self._call(self._rollout_samples(prompt_length, response_length))
        self._write_mismatches(stats)
        samples = trim_to_multiple(samples, multiple, seed=self._step)
        tensors, non_tensors = build_batch(samples, prompt_length, response_length, self.pad_token_id)
        statuses = [r.status for r in self._finished.values()]
        metrics = {
            "agent_mode/reward_mean": sum(rewards) / max(1, len(rewards)),
            "agent_mode/rollouts": float(len(self._rollouts)),
            "agent_mode/rollouts_succeeded": float(statuses.count("succeeded")),
            "agent_mode/samples": float(len(samples)),
            **stats.as_metrics("agent_mode/"),
        }
        return tensors, non_tensors, metrics

    def get_test_metrics(self) -> Dict[str, float]:
        """Mean reward and success rate of the step's (validation) rollouts."""
        _, stats, rewards = self._call(self._rollout_samples(self.max_prompt_length, self.max_response_length))
        statuses = [r.status for r in self._finished.values()]
        return {
            "val/reward": sum(rewards) / max(1, len(rewards)),
            "val/rollouts": float(len(rewards)),
            "val/succeeded": float(statuses.count("succeeded")) / max(1, len(statuses)),
            "val/calls": float(stats.calls),
        }

    def clear_data_and_server(self) -> None:
        """Forget the step's rollouts (the gateway keeps running for the next step)."""
        self._rollouts = {}
        self._finished = {}
