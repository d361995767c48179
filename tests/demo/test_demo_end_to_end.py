"""The demo end to end on the embedded model: a reduced run completes, writes its outputs and improves."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest
from support.embedded import SKIP_REASON, embedded_model_available
from support.interrupt import ctrl_c_when

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


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_ctrl_c_during_training_exits_130_with_one_line_and_leaves_no_process(tmp_path: Path) -> None:
    if not embedded_model_available():
        pytest.skip(SKIP_REASON)
    output_dir = tmp_path / "out"
    # The baseline validation is logged as step 0: training has started, Ctrl-C then.
    process, out, err = ctrl_c_when(
        [sys.executable, "-m", "agentbolt", "demo", "--quick", "--steps", "2", "--output-dir", str(output_dir)],
        lambda: any(path.read_text().strip() for path in output_dir.glob("run-*/logs/metrics.jsonl")),
        wait_seconds=1500,
    )
    assert process.returncode == 130, err
    (run_dir,) = output_dir.glob("run-*")
    assert f"agentbolt demo: interrupted after 0 of 2 training steps; the partial run is in {run_dir}" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "held-out accuracy after" not in out
    with pytest.raises(ProcessLookupError):  # no process of the group is left: runners, store server, engine
        os.killpg(process.pid, 0)
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
