"""Publishing updates to an external server as LoRA adapters (vLLM's load_lora_adapter API).

The external server here is ``agentbolt serve``'s own engine and HTTP server on 127.0.0.1, which implements the
same adapter routes as vLLM (vLLM itself needs a GPU).
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.samples import TokenSample
from agentbolt.algorithm.grpo.serving import RemoteAdapterPolicyServer
from agentbolt.algorithm.grpo.trainer import PolicyTrainer
from agentbolt.models.tiny import create_tiny_model
from agentbolt.serving.server import InferenceServer
from agentbolt.serving.transformers_engine import TransformersEngine

PROMPT = [5, 40, 41, 42, 43]


def _greedy(base_url: str, model: str) -> httpx.Response:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 1,
        "return_token_ids": True,
    }
    return httpx.post(f"{base_url}/completions", json=body, timeout=60)


def test_each_update_is_served_as_a_new_adapter_with_matching_logprobs(tmp_path: Path) -> None:
    model_dir = create_tiny_model(tmp_path / "tiny")
    server = InferenceServer(
        TransformersEngine(str(model_dir), dtype="float32", served_name="base"), port=0, adapter_dirs=[tmp_path]
    )
    server.start()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        trainer = PolicyTrainer(model, GRPOConfig(learning_rate=0.05, max_grad_norm=None))
        remote = RemoteAdapterPolicyServer(trainer, base_url=server.base_url, adapter_dir=tmp_path / "adapters")
        first = remote.model_name
        assert first == f"policy-{remote.run_id}-v0"
        before = _greedy(server.base_url, first).json()["choices"][0]

        samples = [
            TokenSample(PROMPT, before["token_ids"], None, 0.0, "g", "r0", advantage=-1.0),
            TokenSample(PROMPT, [7, 8, 9], None, 1.0, "g", "r1", advantage=1.0),
        ]
        for _ in range(3):
            trainer.train_step(samples)
        remote.after_update(trainer)
        assert remote.model_name == f"policy-{remote.run_id}-v1"

        after = _greedy(server.base_url, remote.model_name).json()["choices"][0]
        served = torch.tensor(after["logprobs"]["token_logprobs"])
        ours = trainer.compute_logprobs([TokenSample(PROMPT, after["token_ids"], None, 0.0, "g", "r")])[0]
        assert torch.allclose(served, ours, atol=1e-4)  # the server runs exactly the trained weights
        assert after["token_ids"] != before["token_ids"] or not torch.allclose(
            served, torch.tensor(before["logprobs"]["token_logprobs"]), atol=1e-3
        )
        assert _greedy(server.base_url, first).status_code == 404  # the previous adapter was unloaded
        assert (tmp_path / "adapters" / remote.model_name / "adapter_config.json").is_file()
        remote.stop()
    finally:
        server.stop()


def test_remote_server_needs_lora_and_reports_refusals(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model_dir = create_tiny_model(tmp_path / "tiny")
    full = PolicyTrainer(AutoModelForCausalLM.from_pretrained(model_dir), GRPOConfig(finetune="full"))
    with pytest.raises(ValueError, match="finetune='lora'"):
        RemoteAdapterPolicyServer(full, base_url="http://127.0.0.1:9/v1", adapter_dir=tmp_path)
    with pytest.raises(ValueError, match="finetune='lora'"):
        GRPOConfig(finetune="full", policy_server_url="http://127.0.0.1:9/v1")
    server = InferenceServer(
        TransformersEngine(str(model_dir), dtype="float32", served_name="base"), port=0, adapter_dirs=[tmp_path]
    )
    server.start()
    try:
        lora = PolicyTrainer(AutoModelForCausalLM.from_pretrained(model_dir), GRPOConfig())
        remote = RemoteAdapterPolicyServer(lora, base_url=server.base_url, adapter_dir=tmp_path / "a", name_prefix="p")
        with pytest.raises(RuntimeError, match="load_lora_adapter failed with HTTP 4"):
            remote._version = 0  # reuse a name the server already has: it refuses
            remote.after_update(lora)
        assert remote.model_name == f"p-{remote.run_id}-v0"  # still serving the adapter that loaded
    finally:
        server.stop()
    with caplog.at_level(logging.WARNING, logger="agentbolt.algorithm.grpo.serving"):
        remote.stop()  # the server is gone: unloading the last adapter is best effort
    assert f"Could not unload adapter p-{remote.run_id}-v0" in caplog.text


def _loaded_adapters(base_url: str) -> list[str]:
    models = httpx.get(f"{base_url}/models", timeout=30).json()["data"]
    return sorted(m["id"] for m in models if m["parent"] is not None)


def test_trainers_sharing_a_server_never_collide_and_unload_their_adapters(tmp_path: Path) -> None:
    # Two trainers of the same base model publish to one server with the same prefix and adapter directory, as a
    # restarted or resumed run does while the server still holds the previous run's adapter.
    model_dir = create_tiny_model(tmp_path / "tiny")
    server = InferenceServer(
        TransformersEngine(str(model_dir), dtype="float32", served_name="base"), port=0, adapter_dirs=[tmp_path]
    )
    server.start()
    try:
        trainers = [PolicyTrainer(AutoModelForCausalLM.from_pretrained(model_dir), GRPOConfig()) for _ in range(2)]
        first = RemoteAdapterPolicyServer(trainers[0], base_url=server.base_url, adapter_dir=tmp_path / "adapters")
        second = RemoteAdapterPolicyServer(trainers[1], base_url=server.base_url, adapter_dir=tmp_path / "adapters")
        assert first.model_name != second.model_name
        assert _loaded_adapters(server.base_url) == sorted([first.model_name, second.model_name])
        second.after_update(trainers[1])
        assert _loaded_adapters(server.base_url) == sorted([first.model_name, second.model_name])
        assert (tmp_path / "adapters" / first.model_name / "adapter_config.json").is_file()  # not overwritten

        first.stop()  # the adapter it served is unloaded too
        assert _loaded_adapters(server.base_url) == [second.model_name]
        second.stop()
        assert _loaded_adapters(server.base_url) == []
    finally:
        server.stop()
