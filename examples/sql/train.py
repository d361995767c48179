"""Train the sql agent's query writer with GRPO on the embedded model; held-out execution accuracy per kind.

``python -m examples.sql.train`` (from the repository root); every option of
:class:`examples.common.training.TrainingConfig` is a flag (``--steps``, ``--n-test``...). See the README.
"""

from __future__ import annotations

from typing import Optional, Sequence

from examples.common.training import ExampleSpec, TrainingConfig, TrainingResult, main
from examples.sql.agent import AGENT_MATCH, SqlAgent
from examples.sql.databases import load_split

SPEC = ExampleSpec(
    name="sql",
    description="Train the LangGraph text-to-SQL agent with GRPO; held-out execution accuracy per question kind.",
    make_agent=lambda config: SqlAgent(format_credit=config.format_credit, max_tokens=config.max_tokens),
    load_train=lambda: list(load_split("train")),
    load_test=lambda: list(load_split("test")),
    slice_of=lambda task: str(task["kind"]),
    defaults=TrainingConfig(steps=4, batch_size=4, group_size=6, temperature=0.7, max_tokens=48),
    agent_match=AGENT_MATCH,
)


def run(argv: Optional[Sequence[str]] = None) -> TrainingResult:
    """Run the command line."""
    return main(SPEC, argv)


if __name__ == "__main__":
    run()
