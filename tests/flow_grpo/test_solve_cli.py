"""``python -m examples.flow_grpo.solve``: as a real process against scripted endpoints, and with a local engine
plus a LoRA checkpoint for the planner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.flow_grpo.solve import main, resolve_checkpoint, training_solver_config

from .scripted_llm import ScriptedLLM

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = {
    "query_analyzer": ['{"summary": "a year, then arithmetic", "tools": ["search", "calculator"]}'],
    "planner": [
        '{"justification": "look up the year", "sub_goal": "when the Amber Museum was completed", '
        '"tool_name": "search"}',
        '{"justification": "exact math", "sub_goal": "1485 + 15", "tool_name": "calculator"}',
    ],
    "executor": ['{"tool_input": "Amber Museum completed"}', '{"tool_input": "1485 + 15"}'],
    "verifier": ['{"analysis": "need the sum", "stop": false}', '{"analysis": "done", "stop": true}'],
    "solution_generator": ['{"answer": "1500"}'],
}


def test_cli_prints_every_step_against_openai_compatible_endpoints() -> None:
    with ScriptedLLM(SCRIPT) as llm:
        question = "What year comes 15 years after the Amber Museum was completed?"
        command = [sys.executable, "-m", "examples.flow_grpo.solve", question, "--planner-url", llm.base_url]
        command += ["--planner-model", "planner", "--fixed-model", "fixed", "--json"]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for expected in (
        "== Query analysis",
        "== Step 1: plan (valid)",
        "tool: search",
        "== Step 1: command for search\n   Amber Museum completed",
        "== Step 1: search output\n   The Amber Museum was completed in 1485.",
        "== Step 1: verification: CONTINUE",
        "== Step 2: calculator output\n   1500",
        "== Step 2: verification: STOP",
        "== Final answer (verifier)\n   1500",
    ):
        assert expected in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["planner_calls"] == 2 and [s["tool_name"] for s in summary["steps"]] == ["search", "calculator"]
    models = {role: body["model"] for role, body in llm.requests}
    assert models["planner"] == "planner" and models["verifier"] == "fixed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["q", "--planner-url", "http://127.0.0.1:1/v1"], "go together"),
        (["q", "--fixed-url", "http://x/v1"], "need --planner-url"),
        (["q", "--max-turns", "0"], "at least 1"),
        (["q", "--checkpoint", "/nonexistent/ckpt"], "does not exist"),
    ],
)
def test_cli_rejects_bad_arguments_with_exit_code_2(
    args: list, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_checkpoint_resolution(tmp_path: Path) -> None:
    for step in ("step_000002", "step_000010"):
        (tmp_path / step / "adapter").mkdir(parents=True)
        (tmp_path / step / "adapter" / "adapter_config.json").write_text("{}")
        (tmp_path / step / "trainer_state.json").write_text("{}")
    (tmp_path / "step_000020").mkdir()  # incomplete: no trainer_state.json
    assert resolve_checkpoint(tmp_path) == ("adapter", tmp_path / "step_000010" / "adapter")
    full = tmp_path / "full"
    full.mkdir()
    (full / "model.safetensors").write_bytes(b"")
    (full / "trainer_state.json").write_text("{}")
    assert resolve_checkpoint(full) == ("full", full / "model.safetensors")


def test_a_checkpoint_is_solved_in_the_solve_loop_it_was_trained_in(tmp_path: Path) -> None:
    from examples.flow_grpo.solver import SolverConfig
    from examples.flow_grpo.train import load_config

    # A run directory as the training script writes it: config.json beside checkpoints/step_N/adapter.
    trained = load_config("cpu")
    adapter = tmp_path / "run" / "checkpoints" / "step_000003" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (adapter.parent / "trainer_state.json").write_text("{}")
    config_json = tmp_path / "run" / "config.json"
    config_json.write_text(json.dumps({"flow": trained.model_dump(), "grpo": {}}, default=str), encoding="utf-8")

    expected = SolverConfig(**trained.solver.model_dump())
    assert expected != SolverConfig()  # the defaults are not what the cpu planner was trained with
    for given in (tmp_path / "run" / "checkpoints", adapter.parent, adapter):
        kind, path = resolve_checkpoint(given)
        assert (kind, path) == ("adapter", adapter)
        assert training_solver_config(path) == (expected, config_json)
    # An adapter from outside a training run: the defaults, and nothing claimed about its training.
    assert training_solver_config(tmp_path / "elsewhere") == (SolverConfig(), None)
    assert training_solver_config(None) == (SolverConfig(), None)


@pytest.mark.slow
def test_local_engine_with_a_lora_planner_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from .test_rollout import UNIVERSAL, build_answering_model

    model_dir = build_answering_model(tmp_path / "model", UNIVERSAL)
    # A freshly initialised LoRA adapter (B = 0) leaves the answers unchanged; what matters is that the planner is
    # served through it (requests name the model "planner", which only exists once the adapter is loaded) while the
    # other roles use the base model.
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(r=2, target_modules=["q_proj"]))
    lora.save_pretrained(tmp_path / "ckpt" / "step_000001" / "adapter")
    (tmp_path / "ckpt" / "step_000001" / "trainer_state.json").write_text("{}")
    code = main(
        [
            "What is 12 * 12?",
            "--model",
            str(model_dir),
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--dtype",
            "float32",
            "--max-turns",
            "1",
            "--json",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["answer"] == "144" and summary["stop_reason"] == "max_turns"
    assert summary["steps"][0]["tool_name"] == "generalist"
