"""Shared fixtures: an engine on the tiny random Llama, and a live server on a free port."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.models import serving

from agentbolt.serving.server import InferenceServer
from agentbolt.serving.transformers_engine import TransformersEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[TransformersEngine]:
    # float32 keeps batched and unbatched logits equal to ~1e-6, so greedy results can be compared exactly.
    engine = TransformersEngine(tiny_model_dir, dtype="float32", max_batch_size=4, served_name="tiny")
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def adapter_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the ``server`` fixture loads LoRA adapters from over HTTP."""
    return tmp_path_factory.mktemp("served-adapters")


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, adapter_root: Path) -> Iterator[InferenceServer]:
    with serving(tiny_model_dir, max_batch_size=4, server_options={"adapter_dirs": [adapter_root]}) as running:
        yield running
