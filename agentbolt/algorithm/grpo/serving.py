"""Serve the policy being trained from the trainer's own model object.

On CPU the cheapest weight sync is none at all: the transformers engine generates with the very ``PeftModel`` (or
full model) the trainer updates in place. Updates run inside :meth:`TransformersEngine.weights_update`, which
holds generation between two decoding steps, so a request never sees half-updated weights.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from agentbolt.algorithm.grpo.trainer import PolicyTrainer

__all__ = ["InProcessPolicyServer"]

logger = logging.getLogger(__name__)


class InProcessPolicyServer:
    """An OpenAI-compatible server (127.0.0.1, free port) over the trainer's live model.

    Args:
        trainer: The policy trainer whose model is served.
        tokenizer: The model's tokenizer (its chat template renders prompts).
        model_name: Name clients request.
        threads: torch threads of the engine (None keeps torch's setting).
        max_batch_size: Sequences the engine decodes together.
    """

    def __init__(
        self,
        trainer: PolicyTrainer,
        tokenizer: Any,
        *,
        model_name: str,
        threads: Optional[int] = None,
        max_batch_size: int = 16,
    ) -> None:
        from agentbolt.serving.server import InferenceServer
        from agentbolt.serving.transformers_engine import TransformersEngine

        self.model_name = model_name
        self.engine = TransformersEngine.from_model(
            trainer.model, tokenizer, served_name=model_name, threads=threads, max_batch_size=max_batch_size
        )
        if trainer.uses_lora:
            # Requests for the served name must run through the adapter being trained, not the bare base model.
            self.engine.default_adapter = trainer.model.active_adapter
        self.server = InferenceServer(self.engine, host="127.0.0.1", port=0)
        self.server.start()
        self.base_url = self.server.base_url
        logger.info("Serving the policy %r at %s", model_name, self.base_url)

    def weights_update(self) -> AbstractContextManager[Any]:
        """Hold generation while the trainer updates the shared weights."""
        return self.engine.weights_update()

    def after_update(self, trainer: PolicyTrainer) -> None:
        """Nothing to copy: the engine already uses the updated tensors."""

    def stop(self) -> None:
        """Stop the HTTP server and the engine."""
        self.server.stop()
