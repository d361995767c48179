"""Shared fixtures: a tiny random Llama directory, an engine on it, and a live server on a free port."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentbolt.models.tiny import create_tiny_model
from agentbolt.serving.server import InferenceServer
from agentbolt.serving.transformers_engine import TransformersEngine


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def kernel_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama whose head_dim (16) the fused decoding kernels cover (the default tiny model's is 8)."""
    return create_tiny_model(tmp_path_factory.mktemp("tiny-llama-16"), seed=1, hidden_size=64)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[TransformersEngine]:
    # float32 keeps batched and unbatched logits equal to ~1e-6, so greedy results can be compared exactly.
    engine = TransformersEngine(tiny_model_dir, dtype="float32", max_batch_size=4, served_name="tiny")
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    engine = TransformersEngine(tiny_model_dir, dtype="float32", max_batch_size=4, served_name="tiny")
    server = InferenceServer(engine, port=0)
    server.start()
    yield server
    server.stop()
