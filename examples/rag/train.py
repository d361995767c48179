"""Train the rag agent with GRPO on the embedded model; held-out exact match and F1 per question kind.

``python -m examples.rag.train`` (from the repository root); every option of
:class:`examples.common.training.TrainingConfig` is a flag (``--steps``, ``--n-test``...). See the README.
"""

from __future__ import annotations

from typing import Optional, Sequence

from examples.common.training import ExampleSpec, TrainingConfig, TrainingResult, main
from examples.rag.agent import RagAgent
from examples.rag.corpus import ONE_HOP_KINDS, load_questions

SPEC = ExampleSpec(
    name="rag",
    description="Train the MCP retrieval agent with GRPO; held-out exact match and F1 per question kind.",
    make_agent=lambda config: RagAgent(format_credit=config.format_credit, max_tokens=config.max_tokens),
    load_train=lambda: list(load_questions("train", ONE_HOP_KINDS)),
    load_test=lambda: list(load_questions("test", ONE_HOP_KINDS)),
    slice_of=lambda task: str(task["kind"]),
    metrics=("accuracy", "f1"),
    defaults=TrainingConfig(steps=4, batch_size=4, group_size=8, max_tokens=32, n_test=64),
)


def run(argv: Optional[Sequence[str]] = None) -> TrainingResult:
    """Run the command line."""
    return main(SPEC, argv)


if __name__ == "__main__":
    run()
