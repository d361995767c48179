"""``python -m examples.flow_grpo.train``: configurations, Flow-GRPO credit on planner turns, and (slow) a short
CPU training run with the tiny model whose checkpoint ``solve`` then loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from agentbolt.algorithm.grpo.advantages import assign_advantages
from agentbolt.algorithm.grpo.samples import TokenSample, triplets_to_samples
from agentbolt.types import Triplet
from examples.flow_grpo.train import CONFIG_DIR, build_grpo_config, build_solver, load_config, load_split, main

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ configurations
def test_named_configurations_train_only_the_planner_with_trajectory_credit(tmp_path: Path) -> None:
    assert sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")) == ["cpu", "cpu-warmstart", "gpu"]
    cpu, warm, gpu = load_config("cpu"), load_config("cpu-warmstart"), load_config("gpu")
    assert cpu.runnable_here and warm.runnable_here and not gpu.runnable_here
    assert cpu.model == "smollm2-135m-instruct" and cpu.fixed.url is None  # the same base model, no adapter
    assert cpu.warm_start is not None and warm.warm_start is not None
    assert cpu.solver.planner_guide == "question" and warm.solver.planner_guide == "none"
    assert gpu.fixed.url is not None and gpu.fixed.model and gpu.grpo["policy_server_url"].endswith("/v1")
    for config in (cpu, warm, gpu):
        grpo = build_grpo_config(config, "/models/base", tmp_path / "run", console=False)
        assert grpo.agent_match == "planner" and grpo.credit == "final" and grpo.finetune == "lora"
        assert grpo.model == "/models/base" and grpo.served_model_name == "planner"
        assert grpo.checkpoint_dir == str(tmp_path / "run" / "checkpoints")
        assert grpo.log_dir == str(tmp_path / "run" / "logs")
        assert grpo.val_before_train and grpo.resume is False and grpo.console is False
        assert grpo.val_sampling_parameters["temperature"] == 0.0
    assert build_grpo_config(cpu, "m", tmp_path).dtype == cpu.dtype == "float32"


@pytest.mark.parametrize("name", ["cpu", "cpu-warmstart", "gpu"])
def test_every_shipped_configuration_runs_a_multi_turn_loop(name: str) -> None:
    # A planner that never stops and a verifier that always continues: the solver the training script builds from
    # the configuration must call the planner once per turn, more than once (a one-turn loop trains no planning).
    from examples.flow_grpo import RoleLLM
    from examples.flow_grpo.tools import Document, SearchTool

    from .scripted_llm import ScriptedLLM

    config = load_config(name)
    solver = build_solver(config)
    solver.search = SearchTool([Document("d1", "Garford", "Garford was founded in 1345.")])
    question = "In what year was Garford founded?"
    step = (
        json.dumps({"tool_name": "search", "sub_goal": question})
        if config.solver.planner_guide != "none"
        else ('{"sub_goal": "Find when Garford was founded", "tool_name": "search"}')
    )
    script = {
        "query_analyzer": ['{"summary": "look up", "tools": ["search"]}'],
        "planner": [step],
        "executor": ['{"tool_input": "Garford founded"}'],
        "verifier": ['{"analysis": "not yet", "stop": false}'],
        "solution_generator": ['{"answer": "1345"}'],
    }
    with ScriptedLLM(script) as llm:
        planner = RoleLLM.from_endpoint(llm.base_url, "planner")
        fixed = RoleLLM.from_endpoint(llm.base_url, "fixed")
        result = solver.solve(question, planner, fixed)
    assert config.solver.max_turns > 1
    assert result.planner_calls == config.solver.max_turns and result.stop_reason == "max_turns"
    assert llm.roles().count("planner") == config.solver.max_turns


def test_overrides_replace_fields_and_merge_into_the_grpo_section() -> None:
    config = load_config("cpu", {"model": "/tmp/other", "runners": 2, "grpo": {"max_steps": 3}})
    assert config.model == "/tmp/other" and config.runners == 2
    assert config.grpo["max_steps"] == 3 and config.grpo["group_size"] == load_config("cpu").grpo["group_size"]


def test_untrained_baseline_validates_the_base_planner_with_its_examples_and_trains_nothing() -> None:
    from examples.flow_grpo.train import _overrides, _parse_args

    shipped = load_config("cpu")
    config = load_config("cpu", _overrides(_parse_args(["--untrained"])))
    assert config.warm_start is None and config.solver.planner_examples is True and config.grpo["max_steps"] == 0
    # Everything else is the configuration's: same held-out questions, same solve loop otherwise.
    assert config.data == shipped.data and config.solver.max_turns == shipped.solver.max_turns
    assert config.grpo["val_sampling_parameters"] == shipped.grpo["val_sampling_parameters"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "expected a mapping"),
        ("name: x\nmodel: m\ngrpo: {log_dir: /tmp/x}\n", "grpo.log_dir is set by the training script"),
        ("name: x\nmodel: m\ngrpo: {group_size: 1}\n", "group_size"),
        ("name: x\nmodel: m\ngrpo: {no_such_option: 1}\n", "no_such_option"),
        ("name: x\nmodel: m\nfixed: {url: 'http://127.0.0.1:1/v1'}\n", "fixed.url needs fixed.model"),
        ("name: x\nmodel: m\nsolver: {max_turns: 0}\n", "max_turns"),
        ("name: x\nmodel: m\ntrain_format_bonus: 1.5\n", "train_format_bonus"),
        ("name: x\nmodel: m\nunknown_section: 1\n", "unknown_section"),
        ("name: x\n", "model"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_invalid_configurations_are_rejected_with_the_field_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_config(path)


def test_cli_reports_a_bad_configuration_with_exit_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "no-such-config", "--output-dir", str(tmp_path / "run")]) == 2
    assert "no configuration 'no-such-config'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--steps", "-1"])
    assert exc.value.code == 2
    assert not (tmp_path / "run").exists()


def test_cli_refuses_an_adapter_folder_without_an_adapter_and_with_untrained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--adapter", str(tmp_path), "--steps", "0"])
    assert exc.value.code == 2 and "no adapter_config.json" in capsys.readouterr().err
    (tmp_path / "adapter_config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["--adapter", str(tmp_path), "--untrained"])
    assert exc.value.code == 2 and "exclude each other" in capsys.readouterr().err


def test_data_section_filters_by_source_and_limit() -> None:
    tasks = load_split("val", ["multihop"], 5)
    assert len(tasks) == 5 and {t["source"] for t in tasks} == {"multihop"}
    every = load_split("val", None, None)
    assert [t["id"] for t in load_split("val", None, 60, 40)] == [t["id"] for t in every[40:100]]
    assert load_split("val", None, None, 95) == every[95:]
    with pytest.raises(ValueError, match="no task"):
        load_split("val", ["no-such-source"], None)


# --------------------------------------------------------------------------------------------------------- credit
def _rollout_triplets(roles: List[str], reward: float, start: int) -> List[Triplet]:
    """The triplets :class:`~agentbolt.adapter.LlmProxyTraceToTriplet` makes of one Flow-GRPO rollout.

    Each LLM call becomes a triplet named by its role; the agent emits the trajectory reward once per planner call
    after solving, and the adapter gives each reward to the latest earlier planner call without one (that adapter
    side is exercised on real traces in ``test_rollout.py``). Token ids are distinct per call.
    """
    triplets = []
    for i, role in enumerate(roles):
        token = start + i
        triplets.append(
            Triplet(
                prompt={"token_ids": [token, token + 100]},
                response={"token_ids": [token + 200], "logprobs": [-0.5]},
                reward=reward if role == "planner" else None,
                metadata={"agent_name": role, "sequence_id": i + 1},
            )
        )
    return triplets


TURN = ["planner", "executor", "generalist", "verifier"]
# Same question, three rollouts: solved in two planner turns, failed in one, failed after an invalid step.
ROLLOUTS: List[Tuple[str, List[str], float]] = [
    ("ro-solved", ["query_analyzer", *TURN, *TURN, "solution_generator"], 1.0),
    ("ro-failed", ["query_analyzer", *TURN, "solution_generator"], 0.0),
    ("ro-invalid", ["query_analyzer", "planner", "verifier", "planner", "verifier", "solution_generator"], 0.0),
]


def _samples(agent_match: str, credit: str) -> Tuple[List[TokenSample], int]:
    samples: List[TokenSample] = []
    excluded = 0
    for index, (rollout_id, roles, reward) in enumerate(ROLLOUTS):
        found, stats = triplets_to_samples(
            _rollout_triplets(roles, reward, start=1000 * index),
            rollout_id=rollout_id,
            group_id="question-7",
            final_reward=reward,
            credit=credit,  # type: ignore[arg-type]
            agent_match=agent_match,
        )
        samples.extend(found)
        excluded += stats.other_agents
    return samples, excluded


def test_every_planner_turn_carries_its_trajectory_reward_and_other_roles_are_excluded() -> None:
    grpo = build_grpo_config(load_config("cpu"), "m", Path("/tmp/unused"), console=False)
    samples, excluded = _samples(str(grpo.agent_match), grpo.credit)

    assert [s.agent_name for s in samples] == ["planner"] * 5
    assert excluded == sum(len(roles) for _, roles, _ in ROLLOUTS) - 5
    by_rollout = {rid: [s.reward for s in samples if s.rollout_id == rid] for rid, _, _ in ROLLOUTS}
    assert by_rollout == {"ro-solved": [1.0, 1.0], "ro-failed": [0.0], "ro-invalid": [0.0, 0.0]}
    # Each sample is one planner call in its own context: its own prompt and response tokens only.
    planner_positions = [i for i, role in enumerate(ROLLOUTS[0][1]) if role == "planner"]
    solved = [s for s in samples if s.rollout_id == "ro-solved"]
    assert [s.prompt_ids[0] for s in solved] == planner_positions
    assert [s.response_ids for s in solved] == [[p + 200] for p in planner_positions]

    kept, stats = assign_advantages(samples, mode=grpo.advantage_mode, eps=grpo.advantage_eps)
    # The group's members are the three rollouts, each counted once however many turns it took:
    # rewards (1, 0, 0): mean 1/3, population std sqrt(2)/3.
    std = (2**0.5) / 3
    expected = {"ro-solved": (2 / 3) / (std + grpo.advantage_eps), "ro-failed": (-1 / 3) / (std + grpo.advantage_eps)}
    expected["ro-invalid"] = expected["ro-failed"]
    assert stats.groups == 1 and stats.zero_variance_groups == 0 and len(kept) == 5
    for sample in kept:
        assert sample.advantage == pytest.approx(expected[sample.rollout_id])


def test_without_agent_match_every_role_would_be_trained() -> None:
    # The counterfactual that agent_match prevents: the fixed roles' calls would become samples too.
    samples, excluded = _samples(agent_match=None, credit="final")  # type: ignore[arg-type]
    assert excluded == 0 and len(samples) == sum(len(roles) for _, roles, _ in ROLLOUTS)


def test_a_group_whose_rollouts_all_fail_gives_no_planner_sample() -> None:
    samples, _ = _samples("planner", "final")
    failed = [s for s in samples if s.reward == 0.0]
    kept, stats = assign_advantages(failed)
    assert kept == [] and stats.zero_variance_groups == 1


# ------------------------------------------------------------------------------------------------ end to end (slow)
@pytest.mark.slow
def test_short_cpu_training_with_the_tiny_model_checkpoints_and_solve_loads_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from agentbolt.models.tiny import create_tiny_model

    # About one token per character with the tiny tokenizer: the prompts with worked examples need > 2048 positions.
    model_dir = create_tiny_model(tmp_path / "tiny", seed=0, max_position_embeddings=8192)
    config = tmp_path / "tiny.yaml"
    config.write_text(
        f"name: tiny\nmodel: {model_dir}\ndtype: float32\nthreads: 1\nrunners: 2\n"
        "solver: {max_turns: 2, planner_max_tokens: 16}\n"
        "data: {train_limit: 4, val_limit: 2}\n"
        "grpo: {batch_size: 1, group_size: 2, max_steps: 5, lora_r: 4, lora_alpha: 8.0, rollout_timeout: 300}\n",
        encoding="utf-8",
    )
    run_dir, summary_path = tmp_path / "run", tmp_path / "summary.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "examples.flow_grpo.train", "--config", str(config), "--steps", "2"]
    command += ["--output-dir", str(run_dir), "--summary-json", str(summary_path), "--quiet"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Flow-GRPO training (tiny)" in done.stdout

    summary = json.loads(summary_path.read_text())
    assert {"baseline_val_success", "final_val_success", "steps", "wall_seconds"} <= set(summary)
    assert summary["steps"] == 2 and summary["val_questions"] == 2 and summary["train_rollouts"] == 4
    assert 0.0 <= summary["baseline_val_success"] <= 1.0 and summary["wall_seconds"] > 0
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    # The fixed roles' calls are in the trace (their own gateway) and only agent_match kept them out of training.
    records = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/reward_mean" in r]
    assert [r["step"] for r in records] == [0, 1, 2] and len(train) == 2
    for record in train:
        assert record["samples/other_agents"] > 0 and record["samples/missing_tokens"] == 0
        assert record["samples/calls"] - record["samples/other_agents"] >= 2  # >= 1 planner turn per rollout
    assert summary["planner_samples"] == sum(r["samples/trained"] for r in train)  # what was trained, not seen
    checkpoint = Path(summary["checkpoint"])
    assert checkpoint == run_dir / "checkpoints" / "step_000002"
    assert (checkpoint / "adapter" / "adapter_config.json").is_file()

    # A second run into the same directory is refused rather than mixed with the first.
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds a run" in again.stderr

    solve = [sys.executable, "-m", "examples.flow_grpo.solve", "What is 2 + 3?", "--model", str(model_dir)]
    solve += ["--checkpoint", str(run_dir / "checkpoints"), "--max-turns", "1", "--dtype", "float32", "--json"]
    solved = subprocess.run(solve, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert solved.returncode == 0, solved.stderr[-3000:]
    result = json.loads(solved.stdout.strip().splitlines()[-1])
    assert result["question"] == "What is 2 + 3?" and result["planner_calls"] == 1
