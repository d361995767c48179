"""Tiny model fixtures and an in-process inference server, for tests that run a real model.

The fixtures are registered for the whole suite by ``tests/conftest.py``; torch and transformers load only when a
test uses them.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

import pytest

if TYPE_CHECKING:
    from agentbolt.serving.server import InferenceServer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (head_dim 8), built once per session."""
    from agentbolt.models.tiny import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def kernel_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama whose head_dim (16) the fused decoding kernels cover (the default tiny model's is 8)."""
    from agentbolt.models.tiny import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("tiny-llama-16"), seed=1, hidden_size=64)


@contextlib.contextmanager
def serving(
    model_dir: Path, *, server_options: Optional[Dict[str, Any]] = None, **engine_options: Any
) -> Iterator[InferenceServer]:
    """An inference server on a free port, its float32 engine serving ``model_dir`` as ``tiny``, loaded on entry.

    float32 keeps greedy decoding identical between batched and single requests. ``engine_options`` go to
    :class:`~agentbolt.serving.transformers_engine.TransformersEngine`, ``server_options`` (``api_key``,
    ``adapter_dirs``, ``limits``) to :class:`~agentbolt.serving.server.InferenceServer`.
    """
    from agentbolt.serving.server import InferenceServer
    from agentbolt.serving.transformers_engine import TransformersEngine

    engine = TransformersEngine(model_dir, **{"dtype": "float32", "served_name": "tiny", **engine_options})
    server = InferenceServer(engine, port=0, **(server_options or {}))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def write_conversations(path: Path, n: int) -> List[Dict[str, Any]]:
    """Write ``n`` one-turn conversations ("question i" -> "answer i") to ``path`` as chat JSONL; the records."""
    records = [
        {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return records
