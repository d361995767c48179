"""What the algorithms that train the served model's weights share (GRPO, SFT).

* :mod:`.config`: :class:`FinetuningConfig`, the model, serving, optimizer, schedule, validation, checkpoint and
  logging options;
* :mod:`.trainer`: ``ModelTrainer``, the torch side (model set-up, LoRA, AdamW, schedule, checkpoints);
* :mod:`.algorithm`: ``FinetuningAlgorithm``, loading and serving the model, the gateway, resources and rollouts.

Importing this package does not import torch.
"""

from __future__ import annotations

from agentbolt.algorithm.finetuning.config import FinetuningConfig

__all__ = ["FinetuningConfig"]
