"""SFT: supervised fine-tuning of the model behind an agent, from its traces or from chat data.

* :class:`SFT` is an ``Algorithm`` for ``Trainer.fit``: collect rollouts, select the best LLM calls, train on them,
  publish the new weights, repeat (optionally collecting from a teacher model: distillation);
* :func:`train_from_messages` and :func:`train_from_store` train offline, from a JSONL/parquet file of chat
  conversations (with tool calls) or from the calls recorded in a store;
* :func:`export_store` writes a store's rollouts, spans or samples to JSONL or parquet.

``SFT`` and the offline functions are imported on first access, so importing this package does not pull torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentbolt.algorithm.sft.config import SFTConfig
from agentbolt.algorithm.sft.data import ChatSample, DataError, read_samples, write_samples
from agentbolt.utils.lazy import LazyExports

if TYPE_CHECKING:
    from agentbolt.algorithm.sft.algorithm import SFT
    from agentbolt.algorithm.sft.export import ExportFilter, export_store
    from agentbolt.algorithm.sft.offline import OfflineResult, train_from_messages, train_from_store

__all__ = [
    "SFT",
    "SFTConfig",
    "ChatSample",
    "DataError",
    "ExportFilter",
    "OfflineResult",
    "export_store",
    "read_samples",
    "train_from_messages",
    "train_from_store",
    "write_samples",
]

_LAZY = LazyExports(
    __name__,
    {
        "agentbolt.algorithm.sft.algorithm": ["SFT"],
        "agentbolt.algorithm.sft.export": ["ExportFilter", "export_store"],
        "agentbolt.algorithm.sft.offline": ["OfflineResult", "train_from_messages", "train_from_store"],
    },
)


def __getattr__(name: str) -> Any:
    if name in ("SFT", "train_from_messages", "train_from_store"):
        # Before torch loads: idle OpenMP threads must sleep, since engine, trainer and runners share the CPUs.
        from agentbolt.serving.transformers_engine import configure_openmp

        configure_openmp()
    return _LAZY.load(name)
