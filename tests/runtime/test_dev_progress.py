"""Trainer.dev and Trainer.fit show their progress on the console by default, in a real process with no logging
configured.

These run in a child interpreter: pytest installs its own logging handlers, which would count as configured
logging inside the test process.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys
    import agentbolt as agl

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        return float(task["n"] % 2)

    def run(**kwargs) -> None:
        trainer = agl.Trainer(
            strategy="shm",
            runner={"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05},
            algorithm=agl.Baseline(polling_interval=0.05, span_verbosity="none"),
            initial_resources={"llm": agl.LLM(endpoint="http://127.0.0.1:9/v1", model="unused")},
        )
        trainer.dev(agent, [{"n": 1}, {"n": 2}, {"n": 3}], **kwargs)

    @agl.algo
    async def three_rollouts(store, initial_resources) -> None:
        await store.add_resources(initial_resources)
        rollouts = [await store.enqueue_rollout(input={"n": n}, mode="train") for n in (1, 2, 3)]
        await store.wait_for_rollouts(rollout_ids=[r.rollout_id for r in rollouts], timeout=120)

    def fit(**kwargs) -> None:
        trainer = agl.Trainer(
            strategy="shm",
            runner={"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05},
            algorithm=three_rollouts,
            initial_resources={"llm": agl.LLM(endpoint="http://127.0.0.1:9/v1", model="unused")},
        )
        trainer.fit(agent, **kwargs)

    command, mode = sys.argv[1], sys.argv[2]
    (run if command == "dev" else fit)(**({"progress": False} if mode == "quiet" else {}))
    """
)


def _stderr(tmp_path: Path, mode: str, command: str = "dev") -> str:
    script = tmp_path / "dev.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), command, mode],
        capture_output=True,
        text=True,
        timeout=240,
        env={"COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_dev_reports_each_rollout_and_a_summary_on_the_console(tmp_path: Path) -> None:
    stderr = _stderr(tmp_path, "default")
    lines = re.findall(r"Rollout (\d)/3 ro-\S+ \(train\) succeeded in [\d.]+ s: reward (\d)", stderr)
    assert [count for count, _ in lines] == ["1", "2", "3"], stderr
    assert sorted(reward for _, reward in lines) == ["0", "1", "1"]
    assert "Done: 3 rollouts (3 succeeded); mean reward 0.667 over 3 rewarded." in stderr


def test_progress_false_keeps_the_console_quiet(tmp_path: Path) -> None:
    assert "Rollout" not in _stderr(tmp_path, "quiet")


def test_fit_reports_each_finished_rollout_and_a_summary_on_the_console(tmp_path: Path) -> None:
    stderr = _stderr(tmp_path, "default", "fit")
    lines = re.findall(r"Rollout (\d) ro-\S+ \(train\) succeeded in [\d.]+ s: reward (\d)", stderr)
    assert [count for count, _ in lines] == ["1", "2", "3"], stderr
    assert sorted(reward for _, reward in lines) == ["0", "1", "1"]
    assert "Done: 3 rollouts (3 succeeded); mean reward 0.667 over 3 rewarded." in stderr


def test_fit_progress_false_keeps_the_console_quiet(tmp_path: Path) -> None:
    assert "Rollout" not in _stderr(tmp_path, "quiet", "fit")
