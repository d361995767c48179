"""``benchmarks/flow_grpo_report.py``: per-source held-out figures read back from a run's SQLite store."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict

import pytest

from agentbolt.emitter.object import encode_object
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import Span
from agentbolt.types.tracer import OtelResource, TraceStatus
from examples.flow_grpo.evaluation import SOLVE_RECORD_KIND

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "flow_grpo_report.py"


@pytest.fixture(scope="module")
def report_module() -> ModuleType:
    sys.path.insert(0, str(SCRIPT.parent))  # result_files, as the script imports it
    spec = importlib.util.spec_from_file_location("flow_grpo_report", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _solve_span(rollout_id: str, attempt_id: str, record: Dict[str, Any]) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=1,
        trace_id="t" * 32,
        span_id=f"s-{rollout_id}",
        parent_id=None,
        name="agentbolt.object",
        status=TraceStatus(status_code="OK"),
        attributes={"flow_grpo.kind": SOLVE_RECORD_KIND, **encode_object(record)},
        events=[],
        links=[],
        start_time=1.0,
        end_time=2.0,
        context=None,
        parent=None,
        resource=OtelResource(attributes={}, schema_url=""),
    )


async def _seed_run(run_dir: Path, outcomes: Dict[int, list[tuple[str, float]]]) -> None:
    """A run's store with validation passes ``{step: [(source, reward), ...]}`` as the solver records them."""
    run_dir.mkdir()
    store = SqliteLightningStore(str(run_dir / "store.sqlite"))
    for step, rows in outcomes.items():
        for index, (source, reward) in enumerate(rows):
            attempted = await store.start_rollout(
                input={"question": f"q{index}"}, mode="val", metadata={"grpo_group": f"val-{step}-{index}"}
            )
            steps = [{"turn": 1, "tool": "search", "sub_goal": "g", "tool_input": "x", "result": "r"}]
            record = {"id": f"t{index}", "source": source, "question": f"q{index}?", "gold": ["g"], "answer": "g",
                      "reward": reward, "planner_turns": 1, "tool_calls": 1, "stop_reason": "planner", "steps": steps}  # fmt: skip
            await store.add_span(_solve_span(attempted.rollout_id, attempted.attempt.attempt_id, record))
            await store.update_attempt(attempted.rollout_id, attempted.attempt.attempt_id, status="succeeded")
    await store.close()


def test_each_pass_is_read_back_per_source_with_intervals(report_module: ModuleType, tmp_path: Path) -> None:
    run = tmp_path / "cpu-run"
    passes = {
        0: [("multihop", 1.0), ("python", 0.0), ("python", 0.0)],
        3: [("multihop", 1.0), ("python", 1.0), ("python", 0.0)],
    }
    asyncio.run(_seed_run(run, passes))
    report = report_module.run_report(run)
    assert sorted(report) == ["step_0", "step_3"]
    rows = {row["source"]: row for row in report["step_3"]["success"]}
    assert (rows["python"]["solved"], rows["python"]["total"]) == (1, 2)
    assert (rows["all"]["solved"], rows["all"]["total"]) == (2, 3) and rows["all"]["low"] < 2 / 3 < rows["all"]["high"]
    assert report["step_0"]["solved_ids"] == ["t0"] and report["step_3"]["loop"]["mean_tool_calls"] == 1.0


def test_a_directory_without_a_run_is_refused_with_exit_status_2(tmp_path: Path) -> None:
    empty = tmp_path / "no-run"
    empty.mkdir()
    asyncio.run(_seed_run(tmp_path / "no-validation", {}))
    for target, message in ((empty, "holds no store.sqlite"), (tmp_path / "no-validation", "no validation pass")):
        done = subprocess.run([sys.executable, str(SCRIPT), str(target), "--no-result"], capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr
