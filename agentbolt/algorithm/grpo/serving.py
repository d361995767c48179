"""Serve the policy being trained.

* :class:`InProcessPolicyServer` (default): on CPU the cheapest weight sync is none at all: the transformers engine
  generates with the very ``PeftModel`` (or full model) the trainer updates in place. Updates run inside
  :meth:`TransformersEngine.weights_update`, which holds generation between two decoding steps, so a request never
  sees half-updated weights.
* :class:`RemoteAdapterPolicyServer`: an external vLLM (``--enable-lora``) or ``agentbolt serve`` server of the
  base model. After each update the adapter is saved and loaded under a new name with the vLLM-compatible
  ``POST /v1/load_lora_adapter`` route (the previous one is unloaded), and rollouts request that name. Names carry
  a random id of the run, so a restarted or resumed trainer never reuses a name the server still holds.
"""

from __future__ import annotations

import logging
import os
import secrets
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from agentbolt.algorithm.finetuning.trainer import ModelTrainer

__all__ = ["InProcessPolicyServer", "RemoteAdapterPolicyServer"]

logger = logging.getLogger(__name__)


class InProcessPolicyServer:
    """An OpenAI-compatible server (127.0.0.1, free port) over the trainer's live model (its
    :attr:`~agentbolt.algorithm.finetuning.trainer.ModelTrainer.served_model`).

    Args:
        trainer: The trainer whose model is served.
        tokenizer: The model's tokenizer (its chat template renders prompts).
        model_name: Name clients request.
        threads: torch threads of the engine (None keeps torch's setting).
        max_batch_size: Sequences the engine decodes together.
    """

    def __init__(
        self,
        trainer: ModelTrainer,
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
            trainer.served_model, tokenizer, served_name=model_name, threads=threads, max_batch_size=max_batch_size
        )
        if trainer.uses_lora:
            # Requests for the served name must run through the adapter being trained, not the bare base model.
            self.engine.default_adapter = trainer.served_model.active_adapter
        self.server = InferenceServer(self.engine, host="127.0.0.1", port=0)
        self.server.start()
        self.base_url = self.server.base_url
        logger.info("Serving the policy %r at %s", model_name, self.base_url)

    def weights_update(self) -> AbstractContextManager[Any]:
        """Hold generation while the trainer updates the shared weights."""
        return self.engine.weights_update()

    def after_update(self, trainer: ModelTrainer) -> None:
        """Nothing to copy: the engine already uses the updated tensors."""

    def stop(self) -> None:
        """Stop the HTTP server and the engine."""
        self.server.stop()


class RemoteAdapterPolicyServer:
    """Publish each new LoRA adapter to a running vLLM / ``agentbolt serve`` server of the base model.

    The server must serve the same base model with LoRA enabled and be able to read ``adapter_dir`` (same machine or
    shared file system). The adapter before the first update (an identity: LoRA ``B`` starts at zero) is loaded at
    construction, so every rollout runs through an adapter whose weights the trainer knows. Only the latest adapter
    stays loaded: each load unloads the previous one, and :meth:`stop` the last (best effort, logged).

    Args:
        trainer: The trainer (must train LoRA adapters).
        base_url: OpenAI-compatible base URL of the server, ending in ``/v1``.
        adapter_dir: Where adapters are saved for the server to load.
        name_prefix: Adapters are named ``{name_prefix}-{run_id}-v{N}`` (``N`` counts this object's loads) and
            saved under ``adapter_dir`` with that name.
        api_key: Bearer token of the server, if it needs one.
        timeout: Seconds allowed for each load / unload request.
        run_id: Id that keeps these names apart from those of any other trainer of the server, earlier runs and
            resumed ones included (default: 8 random hex digits).

    Raises:
        ValueError: The trainer does full fine-tuning.
        RuntimeError: The server refused the adapter.
    """

    def __init__(
        self,
        trainer: ModelTrainer,
        *,
        base_url: str,
        adapter_dir: str | os.PathLike[str],
        name_prefix: str = "policy",
        api_key: Optional[str] = None,
        timeout: float = 120.0,
        run_id: Optional[str] = None,
    ) -> None:
        import httpx

        if not trainer.uses_lora:
            raise ValueError("a remote policy server is updated by loading LoRA adapters: use finetune='lora'")
        self.base_url = base_url.rstrip("/")
        self.adapter_dir = Path(adapter_dir)
        self.name_prefix = name_prefix
        self.run_id = run_id or secrets.token_hex(4)
        self.model_name = ""
        self._version = 0
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._client = httpx.Client(timeout=timeout, headers=headers)
        self.after_update(trainer)

    def _post(self, route: str, body: dict[str, Any]) -> None:
        response = self._client.post(f"{self.base_url}/{route}", json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"{route} failed with HTTP {response.status_code}: {response.text[:500]}")

    def weights_update(self) -> AbstractContextManager[Any]:
        """Nothing to hold: the server keeps serving the previous adapter until the new one is loaded."""
        return nullcontext()

    def after_update(self, trainer: ModelTrainer) -> None:
        """Save the current adapter, load it under a new name, and unload the previous one."""
        name = f"{self.name_prefix}-{self.run_id}-v{self._version}"
        path = (self.adapter_dir / name).resolve()
        trainer.served_model.save_pretrained(str(path))
        self._post("load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        previous, self.model_name = self.model_name, name
        self._version += 1
        self._unload(previous)
        logger.info("Policy adapter %s loaded by %s", name, self.base_url)

    def _unload(self, name: str) -> None:
        if not name:
            return
        try:
            self._post("unload_lora_adapter", {"lora_name": name})
        except Exception:  # best effort: a stale adapter only costs server memory
            logger.warning("Could not unload adapter %s from %s", name, self.base_url, exc_info=True)

    def stop(self) -> None:
        """Unload the adapter being served (best effort) and close the HTTP client; the server keeps running."""
        if self._client.is_closed:
            return
        last, self.model_name = self.model_name, ""
        self._unload(last)
        self._client.close()
