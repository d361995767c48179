"""Train the calc agent with GRPO on the embedded model and report held-out accuracy per operation.

``python -m examples.calc.train`` (from the repository root) runs the measured configuration; every option of
:class:`examples.common.training.TrainingConfig` is a flag (``--steps``, ``--n-test``...). See the README.
"""

from __future__ import annotations

from typing import Optional, Sequence

from examples.calc.agent import CalcAgent
from examples.calc.task import load_split
from examples.common.training import ExampleSpec, TrainingConfig, TrainingResult, main

SPEC = ExampleSpec(
    name="calc",
    description="Train the MCP calculator agent with GRPO; held-out accuracy per operation before and after.",
    make_agent=lambda config: CalcAgent(format_credit=config.format_credit, max_tokens=config.max_tokens),
    load_train=lambda: list(load_split("train")),
    load_test=lambda: list(load_split("test")),
    slice_of=lambda task: str(task["operation"]),
    defaults=TrainingConfig(steps=4, batch_size=4, group_size=8, max_tokens=40, n_test=64),
)


def run(argv: Optional[Sequence[str]] = None) -> TrainingResult:
    """Run the command line."""
    return main(SPEC, argv)


if __name__ == "__main__":
    run()
