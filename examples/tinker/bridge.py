"""Train any agent with Tinker: its sampling client behind the LLM gateway, its training client fed from the spans.

Tinker (``pip install tinker``, ``TINKER_API_KEY``) trains LoRA adapters of hosted models through three public
calls: ``TrainingClient.forward_backward(data, loss_fn)``, ``optim_step(AdamParams)`` and
``save_weights_and_get_sampling_client(name)``, whose ``SamplingClient.sample(prompt, num_samples, sampling_params)``
generates tokens with their logprobs (each call returns a future to await; written against tinker 0.38). Its cookbook asks for the agent to be rewritten as a callback-style
environment. This bridge keeps the agent as it is:

* :class:`TinkerChatServer` is an OpenAI-compatible ``/v1/chat/completions`` endpoint answered by the current
  ``SamplingClient``: it renders the messages with the model's chat template, samples, and returns the text with
  vLLM-style ``prompt_token_ids``, ``token_ids`` and ``logprobs``;
* the LLM gateway sits in front of it (provider ``hosted_vllm/``), so each call of each rollout is recorded as a span
  with its exact token ids and sampling logprobs;
* :func:`rollout_datums` turns a finished group of rollouts into Tinker ``Datum`` objects for the
  ``importance_sampling`` loss: for every LLM call, ``model_input`` = prompt + response without its last token,
  ``target_tokens`` = the same sequence shifted by one, ``logprobs`` = the sampling logprobs on response positions,
  ``advantages`` = the rollout's reward minus its group's mean on response positions (0 on prompt positions);
* :class:`TinkerGRPO` is the loop, as an ``agl.Algorithm`` under ``agl.Trainer``: roll out groups, build datums,
  ``forward_backward``, ``optim_step``, publish new weights to the chat server.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import agentbolt as agl
from agentbolt.adapter.triplet import LlmProxyTraceToTriplet
from agentbolt.utils.server_launcher import pick_free_port
from examples.common.rollouts import roll_out

logger = logging.getLogger("examples.tinker.bridge")

LOSS_FN = "importance_sampling"


def _tinker() -> Any:
    try:
        import tinker
    except ImportError as exc:
        raise ImportError("The Tinker bridge needs the tinker SDK: pip install 'agentbolt[tinker]'") from exc
    return tinker


def tinker_base_url() -> str:
    """The address of the Tinker service the SDK's clients call: ``$TINKER_BASE_URL``, else the SDK's default.

    Raises:
        ImportError: The tinker SDK is not installed.
    """
    _tinker()
    from tinker.lib.base_url import resolve_base_url

    return resolve_base_url()


# ---------------------------------------------------------------------------------------------------- sampling side


class TinkerChatServer:
    """An OpenAI-compatible chat endpoint over a Tinker ``SamplingClient`` (a uvicorn server in a thread).

    Args:
        sampling_client: The client to sample with; replace it with :meth:`set_sampling_client` after training.
        tokenizer: The model's tokenizer (``TrainingClient.get_tokenizer()``); its chat template renders prompts.
        model_name: The name clients request.
        port: Port on 127.0.0.1 (None: a free one).
    """

    def __init__(self, sampling_client: Any, tokenizer: Any, model_name: str, port: Optional[int] = None) -> None:
        self._sampling_client = sampling_client
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.port = port or pick_free_port("127.0.0.1")
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def set_sampling_client(self, sampling_client: Any) -> None:
        """Serve new weights: later requests sample with ``sampling_client``."""
        self._sampling_client = sampling_client

    def model_config(self) -> Dict[str, Any]:
        """The gateway's ``model_list`` entry for this server (token ids and logprobs recorded)."""
        return {"model_name": self.model_name, "litellm_params": {"model": f"hosted_vllm/{self.model_name}",
                                                                  "api_base": self.base_url}}  # fmt: skip

    async def complete(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """Answer one chat completion request body (OpenAI format).

        Raises:
            ValueError: No messages, or a sampling parameter of the wrong type.
        """
        tinker = _tinker()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        rendered = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids: List[int] = list(self.tokenizer.encode(rendered, add_special_tokens=False))
        stop = body.get("stop")
        params = tinker.types.SamplingParams(
            max_tokens=int(body.get("max_tokens") or body.get("max_completion_tokens") or 256),
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            stop=[stop] if isinstance(stop, str) else stop,
            seed=body.get("seed"),
        )
        response = await self._sampling_client.sample(
            prompt=tinker.types.ModelInput.from_ints(prompt_ids), num_samples=1, sampling_params=params
        )
        sequence = response.sequences[0]
        tokens = list(sequence.tokens)
        logprobs = list(sequence.logprobs or [0.0] * len(tokens))
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        finish = "length" if getattr(sequence, "stop_reason", "") == "length" else "stop"
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "prompt_token_ids": prompt_ids,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "token_ids": tokens,
                "logprobs": {"content": [
                    {"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(tokens, logprobs, strict=True)
                ]},
            }],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(tokens),
                      "total_tokens": len(prompt_ids) + len(tokens)},
        }  # fmt: skip

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> Dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models() -> Dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "tinker"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            try:
                body = await request.json()
                if body.get("stream"):
                    raise ValueError("stream is not supported by the Tinker chat server")
                return await self.complete(body)
            except ValueError as exc:
                return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, status_code=400)

        return app

    def start(self) -> TinkerChatServer:
        """Start serving; returns once the server accepts connections."""
        import uvicorn

        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="tinker-chat", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the Tinker chat server did not start on port {self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


# ---------------------------------------------------------------------------------------------------- training side


@dataclass
class TracedRollout:
    """A finished rollout: its task group, its reward and its LLM calls as triplets (token ids and logprobs)."""

    group: str
    reward: float
    triplets: List[agl.Triplet]


def group_advantages(rollouts: Sequence[TracedRollout]) -> List[float]:
    """Each rollout's reward minus the mean reward of its group (GRPO's advantage, without std scaling)."""
    groups: Dict[str, List[float]] = defaultdict(list)
    for rollout in rollouts:
        groups[rollout.group].append(rollout.reward)
    return [rollout.reward - sum(groups[rollout.group]) / len(groups[rollout.group]) for rollout in rollouts]


def _token_ids(side: Any) -> List[int]:
    return [int(t) for t in (side or {}).get("token_ids", [])]


def rollout_datums(rollouts: Sequence[TracedRollout]) -> List[Any]:
    """Tinker ``Datum`` objects for the ``importance_sampling`` loss, one per LLM call with a non-zero advantage.

    Raises:
        ValueError: A call has response logprobs of another length than its response tokens.
    """
    tinker = _tinker()
    datums = []
    for rollout, advantage in zip(rollouts, group_advantages(rollouts), strict=True):
        if advantage == 0.0:
            continue  # no signal: the whole group scored the same
        for triplet in rollout.triplets:
            prompt, response = _token_ids(triplet.prompt), _token_ids(triplet.response)
            if not prompt or not response:
                continue
            logprobs = [float(lp) for lp in (triplet.response.get("logprobs") or [])]
            if len(logprobs) != len(response):
                raise ValueError(
                    f"{len(response)} response tokens but {len(logprobs)} logprobs in a call of {rollout.group}"
                )
            full = prompt + response
            padding = [0.0] * (len(prompt) - 1)
            datums.append(tinker.types.Datum(
                model_input=tinker.types.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={
                    "target_tokens": tinker.types.TensorData(data=full[1:], dtype="int64", shape=[len(full) - 1]),
                    "logprobs": tinker.types.TensorData(data=padding + logprobs, dtype="float32", shape=[len(full) - 1]),
                    "advantages": tinker.types.TensorData(
                        data=padding + [advantage] * len(response), dtype="float32", shape=[len(full) - 1]
                    ),
                },
            ))  # fmt: skip
    return datums


class TinkerGRPO(agl.Algorithm):
    """Group-relative policy optimisation of a Tinker LoRA model on any agent (see the module docstring).

    Args:
        base_model: The Tinker model to train (e.g. ``Qwen/Qwen3-4B-Instruct-2507``).
        service_client: A ``tinker.ServiceClient`` (default: one made from ``$TINKER_API_KEY``).
        lora_rank: LoRA rank.
        learning_rate: Adam learning rate.
        group_size: Rollouts per task (the advantage baseline is their mean reward).
        tasks_per_step: Tasks per optimisation step.
        n_steps: Optimisation steps.
        rollout_timeout: Seconds to wait for one step's rollouts.
        served_name: The model name agents request through the gateway.

    Raises:
        ValueError: An argument out of range.
    """

    def __init__(
        self,
        base_model: str,
        *,
        service_client: Any = None,
        lora_rank: int = 32,
        learning_rate: float = 4e-5,
        group_size: int = 8,
        tasks_per_step: int = 8,
        n_steps: int = 10,
        rollout_timeout: float = 1800.0,
        served_name: str = "tinker",
    ) -> None:
        super().__init__()
        if group_size < 2 or tasks_per_step < 1 or n_steps < 1:
            raise ValueError(f"group_size >= 2, tasks_per_step >= 1 and n_steps >= 1 are needed, got "
                             f"{group_size}, {tasks_per_step}, {n_steps}")  # fmt: skip
        self.base_model = base_model
        self.service_client = service_client
        self.lora_rank = lora_rank
        self.learning_rate = learning_rate
        self.group_size = group_size
        self.tasks_per_step = tasks_per_step
        self.n_steps = n_steps
        self.rollout_timeout = rollout_timeout
        self.served_name = served_name
        self.history: List[Dict[str, float]] = []

    async def _roll_out(
        self, tasks: Sequence[Any], mode: str, resources_id: str, group_size: int
    ) -> List[TracedRollout]:
        finished = await roll_out(self.get_store(), tasks, resources_id=resources_id, mode=mode,
                                  timeout=self.rollout_timeout, repeats=group_size)  # fmt: skip
        adapter = LlmProxyTraceToTriplet()
        return [
            TracedRollout(f"{mode}-{r.task_index}", r.reward, adapter.adapt(r.spans) if r.succeeded else [])
            for r in finished
        ]

    async def run(self, train_dataset: Optional[Any] = None, val_dataset: Optional[Any] = None) -> None:
        """Train for ``n_steps`` steps; validation (one rollout per task) before the first and after the last."""
        tinker = _tinker()
        train = list(train_dataset or [])
        if not train:
            raise ValueError("TinkerGRPO needs a train_dataset")
        service = self.service_client or tinker.ServiceClient()
        training = await service.create_lora_training_client(base_model=self.base_model, rank=self.lora_rank)
        server = TinkerChatServer(
            await training.save_weights_and_get_sampling_client(name="step-0"),
            training.get_tokenizer(), self.served_name,
        ).start()  # fmt: skip
        proxy = agl.LLMProxy(port=pick_free_port("127.0.0.1"), model_list=[server.model_config()],
                             store=self.get_store(), launch_mode="thread")  # fmt: skip
        await proxy.start()
        try:
            resources = await self.get_store().update_resources("tinker", {"main_llm": proxy.as_resource()})
            if val_dataset:
                await self._validate(list(val_dataset), resources.resources_id, step=0)
            for step in range(1, self.n_steps + 1):
                first = (step - 1) * self.tasks_per_step
                batch = [train[(first + i) % len(train)] for i in range(self.tasks_per_step)]
                rollouts = await self._roll_out(batch, "train", resources.resources_id, self.group_size)
                await proxy.flush()
                datums = rollout_datums(rollouts)
                mean = sum(r.reward for r in rollouts) / len(rollouts)
                if datums:
                    # Both submitted before waiting, as Tinker recommends: the step runs right after the gradients.
                    gradients = training.forward_backward(datums, LOSS_FN)
                    update = training.optim_step(tinker.types.AdamParams(learning_rate=self.learning_rate))
                    result = await gradients
                    await update
                    server.set_sampling_client(await training.save_weights_and_get_sampling_client(name=f"step-{step}"))
                    loss = float(getattr(result, "metrics", {}).get("loss:sum", float("nan")))
                else:
                    loss = float("nan")
                logger.info(
                    "Step %d: mean reward %.3f over %d rollouts, %d datums.", step, mean, len(rollouts), len(datums)
                )
                self.history.append({"step": step, "train_reward": mean, "datums": len(datums), "loss": loss})
            if val_dataset:
                await self._validate(list(val_dataset), resources.resources_id, step=self.n_steps)
        finally:
            await proxy.stop()
            server.stop()

    async def _validate(self, tasks: List[Any], resources_id: str, step: int) -> None:
        rollouts = await self._roll_out(tasks, "val", resources_id, group_size=1)
        score = sum(r.reward for r in rollouts) / len(rollouts)
        logger.info("Validation after step %d: mean reward %.3f on %d tasks.", step, score, len(tasks))
        self.history.append({"step": step, "val_reward": score})
