"""The demo end to end on the embedded model: a reduced run completes, writes its outputs and improves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.embedded import SKIP_REASON, embedded_model_available

pytest.importorskip("torch")
pytest.importorskip("peft")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_quick_demo_completes_and_improves(tmp_path: Path) -> None:
    if not embedded_model_available():
        pytest.skip(SKIP_REASON)
    from agentbolt.cli.app import run

    summary_path = tmp_path / "summary.json"
    code = run(["demo", "--quick", "--output-dir", str(tmp_path / "out"), "--summary-json", str(summary_path)])
    assert code == 0
    summary = json.loads(summary_path.read_text())
    for key in ("model", "baseline_val_accuracy", "final_val_accuracy", "steps", "wall_seconds", "train_rollouts"):
        assert key in summary
    assert summary["model"] == "smollm2-135m-instruct" and summary["steps"] > 0
    assert summary["train_rollouts"] == summary["steps"] * 4 * 8
    assert summary["final_val_accuracy"] > summary["baseline_val_accuracy"]
    # Every output the summary names exists: metrics, curve, adapter checkpoint, SQLite store.
    metrics = [json.loads(line) for line in Path(summary["metrics_path"]).read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(summary["steps"] + 1))
    assert Path(summary["curve_path"]).stat().st_size > 0
    assert (Path(summary["checkpoint_dir"]) / "adapter").is_dir()
    assert Path(summary["store_path"]).stat().st_size > 0
