"""Each trained example's real training on the embedded model, with its default (measured) configuration.

One run per example, about 10 to 15 minutes each on 2 cores (``make test-slow``). A run must complete every step,
record both held-out passes over every held-out task, and leave its LoRA checkpoint. Whether it gained is not
asserted: the measured runs are in docs/benchmarks.md, and the sql example's gain is within its interval of none.
The held-out table is in the returned result.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from support.embedded import SKIP_REASON, embedded_model_available

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("mcp")
pytest.importorskip("langgraph")


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("example", ["calc", "sql", "rag", "search_r1"])
def test_default_training_run(example: str, tmp_path: Path) -> None:
    if not embedded_model_available():
        pytest.skip(SKIP_REASON)
    module = importlib.import_module(f"examples.{example}.train")
    defaults = module.SPEC.defaults
    result = module.run(["--quiet", "--output-dir", str(tmp_path / "runs"), "--no-result"])

    assert result.steps == defaults.steps
    assert result.train_rollouts == defaults.steps * defaults.batch_size * defaults.group_size
    overall = result.row("all", "accuracy")
    assert overall["n"] == result.n_test == len(module.SPEC.load_test()[: defaults.n_test])
    for metric in module.SPEC.metrics:
        assert 0.0 <= result.row("all", metric)["after"] <= 1.0
    assert (Path(result.checkpoint_dir or "") / "adapter").is_dir()
