"""Train the search_r1 agent with GRPO on the embedded model; held-out exact match and F1 per question kind.

``python -m examples.search_r1.train`` (from the repository root); every option of
:class:`examples.common.training.TrainingConfig` is a flag (``--steps``, ``--n-test``...). See the README.
"""

from __future__ import annotations

from typing import Optional, Sequence

from examples.common.training import ExampleSpec, TrainingConfig, TrainingResult, main
from examples.rag.corpus import load_questions
from examples.search_r1.agent import SearchR1Agent

SPEC = ExampleSpec(
    name="search_r1",
    description="Train the <search>-tag agent with GRPO; held-out exact match and F1, one-hop and two-hop.",
    make_agent=lambda config: SearchR1Agent(format_credit=config.format_credit, max_tokens=config.max_tokens),
    load_train=lambda: list(load_questions("train")),
    load_test=lambda: list(load_questions("test")),
    slice_of=lambda task: str(task["kind"]),
    metrics=("accuracy", "f1"),
    defaults=TrainingConfig(steps=8, batch_size=4, group_size=8, temperature=0.7, max_tokens=32, n_test=64),
)


def run(argv: Optional[Sequence[str]] = None) -> TrainingResult:
    """Run the command line."""
    return main(SPEC, argv)


if __name__ == "__main__":
    run()
