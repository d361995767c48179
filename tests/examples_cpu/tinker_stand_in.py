"""A stand-in for Tinker's hosted service, behind the SDK's public client interface, on a tiny local model.

The Tinker service cannot be reached here, and its wire protocol is private to the SDK, so the stand-in replaces
``tinker.ServiceClient`` (the network boundary) with objects that have the same public methods as tinker 0.38's
clients (each returning an awaitable future) and exchange the SDK's own ``tinker.types``
values. Behind them is real work on the tiny random Llama of tests/support: sampling with ``generate`` (tokens and
their logprobs), the ``importance_sampling`` loss computed with torch from each ``Datum`` and back-propagated, and
Adam steps. Each datum is checked the way the service documents: the loss's input keys present, every tensor as
long as ``model_input``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import tinker
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

IMPORTANCE_SAMPLING_KEYS = {"target_tokens", "logprobs", "advantages"}


class Future:
    """What the SDK's calls return (an ``APIFuture``): awaitable, with ``result()`` and ``result_async()``."""

    def __init__(self, value: Any) -> None:
        self._value = value

    async def result_async(self) -> Any:
        return self._value

    def result(self) -> Any:
        return self._value

    def __await__(self) -> Any:
        return self.result_async().__await__()


@dataclass
class StandInLog:
    """What the service was asked; tests read it."""

    created: List[Dict[str, Any]] = field(default_factory=list)
    forward_backward: List[int] = field(default_factory=list)  # datums per call
    optim_steps: List[float] = field(default_factory=list)  # learning rates
    saved: List[str] = field(default_factory=list)
    samples: int = 0


class SamplingClient:
    def __init__(self, model: Any, tokenizer: Any, log: StandInLog) -> None:
        self.model, self.tokenizer, self.log = model, tokenizer, log

    def sample(
        self, prompt: tinker.types.ModelInput, num_samples: int, sampling_params: tinker.types.SamplingParams
    ) -> Future:
        self.log.samples += 1
        ids = torch.tensor([prompt.to_ints()])
        temperature = sampling_params.temperature or 1.0
        with torch.no_grad():
            out = self.model.generate(ids, do_sample=True, temperature=temperature, max_new_tokens=sampling_params.max_tokens or 16,
                                      num_return_sequences=num_samples, output_scores=True, return_dict_in_generate=True,
                                      pad_token_id=self.tokenizer.eos_token_id)  # fmt: skip
        sequences = []
        for row in range(num_samples):
            tokens = out.sequences[row, ids.shape[1] :].tolist()
            logprobs = [float(torch.log_softmax(out.scores[i][row].float(), -1)[t]) for i, t in enumerate(tokens)]
            reason = "stop" if tokens and tokens[-1] == self.tokenizer.eos_token_id else "length"
            sequences.append(tinker.types.SampledSequence(
                stop_reason=reason, sequence_id=f"seq-{self.log.samples}-{row}",
                tokens_np=np.array(tokens, dtype=np.int32), logprobs_np=np.array(logprobs, dtype=np.float32),
            ))  # fmt: skip
        return Future(tinker.types.SampleResponse(sequences=sequences))


class TrainingClient:
    def __init__(self, model_dir: Path, log: StandInLog) -> None:
        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.log = log

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def forward_backward(self, data: List[tinker.types.Datum], loss_fn: str) -> Future:
        if loss_fn != "importance_sampling":
            raise ValueError(f"the stand-in implements importance_sampling only, not {loss_fn!r}")
        total = 0.0
        for datum in data:
            length = datum.model_input.length
            inputs = datum.loss_fn_inputs
            if set(inputs) != IMPORTANCE_SAMPLING_KEYS:
                raise ValueError(f"importance_sampling needs {sorted(IMPORTANCE_SAMPLING_KEYS)}, got {sorted(inputs)}")
            if any(len(tensor.data) != length for tensor in inputs.values()):
                raise ValueError("every loss input must be as long as model_input")
            logits = self.model(torch.tensor([datum.model_input.to_ints()])).logits[0].float()
            targets = torch.tensor(inputs["target_tokens"].data)
            logp = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
            ratio = torch.exp(logp - torch.tensor(inputs["logprobs"].data))
            loss = -(ratio * torch.tensor(inputs["advantages"].data)).sum()
            loss.backward()
            total += float(loss.detach())
        self.log.forward_backward.append(len(data))
        assert math.isfinite(total)
        return Future(
            tinker.types.ForwardBackwardOutput(
                loss_fn_output_type="ArrayRecord", loss_fn_outputs=[], metrics={"loss:sum": total}
            )
        )

    def optim_step(self, params: tinker.types.AdamParams) -> Future:
        for group in self.optimizer.param_groups:
            group["lr"] = params.learning_rate
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.log.optim_steps.append(params.learning_rate)
        return Future(tinker.types.OptimStepResponse())

    def save_weights_and_get_sampling_client(self, name: str) -> Future:
        self.log.saved.append(name)
        return Future(SamplingClient(self.model, self.tokenizer, self.log))


class ServiceClient:
    """The stand-in for ``tinker.ServiceClient()``: every model name maps to the tiny model at ``model_dir``."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.log = StandInLog()

    def create_lora_training_client(self, base_model: str, rank: int = 32, **kwargs: Any) -> Future:
        self.log.created.append({"base_model": base_model, "rank": rank})
        return Future(TrainingClient(self.model_dir, self.log))
