"""A whole prompt optimization of the room selector on the embedded model (slow: minutes on 2 cores)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_fewshot_optimization_on_the_embedded_model(tmp_path: pytest.TempPathFactory) -> None:
    pytest.importorskip("torch")
    from examples.apo.room_selector_apo import main

    report = main(["--algorithm", "fewshot", "--limit", "8", "--val-batch-size", "4", "--runners", "2"])
    search = report["search"]
    assert report["variant"] == "lookup" and report["agent_model"] == "smollm2-135m-instruct"
    assert search["rollouts"] >= 8 and search["rollouts_failed"] == 0  # the search alone; the test rollouts below
    assert report["test_seed"]["all"]["total"] == report["test_best"]["all"]["total"] == 8
    assert search["best_score"] >= 0.0 and report["best_prompt"]
