"""``examples.flow_grpo.warmstart``: reference-plan solves become planner conversations, the warm start's cache key,
and (with the tiny model) SFT on those conversations producing the adapter GRPO starts from.

The fixed roles are a scripted server (a model that could play them does not fit in a fast test)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from examples.flow_grpo import warmstart
from examples.flow_grpo.data import load_offline_dataset
from examples.flow_grpo.diagnose import oracle_steps
from examples.flow_grpo.train import build_grpo_config, build_solver, load_config
from examples.flow_grpo.warmstart import (
    collect_reference_turns,
    ensure_warm_start,
    fixed_endpoint,
    summarize,
    take_by_source,
    warm_start_dir,
    warm_start_sft_options,
    write_turns,
)

from .scripted_llm import ScriptedLLM

ANALYSIS = '{"summary": "s", "tools": []}'


def _two_step_task() -> Dict[str, Any]:
    return next(dict(t) for t in load_offline_dataset("train") if t["source"] == "calc_lookup")


def _script(task: Dict[str, Any], answer: str) -> Dict[str, List[str]]:
    """Fixed roles that carry out the reference plan: the executor copies each sub-goal."""
    steps = oracle_steps(task, {}) or []
    return {
        "query_analyzer": [ANALYSIS],
        "executor": [json.dumps({"tool_input": sub_goal}) for _, sub_goal in steps],
        "verifier": ['{"stop": false}'],
        "solution_generator": [json.dumps({"answer": answer})],
    }


def _fixed(llm: ScriptedLLM) -> Dict[str, Any]:
    return {"base_url": llm.base_url, "model": "fixed", "api_key": None}


def test_a_solved_task_gives_one_conversation_per_planner_turn(tmp_path: Path) -> None:
    task = _two_step_task()
    config = load_config("cpu-warmstart")
    with ScriptedLLM(_script(task, str(task["result"]))) as llm:
        (solve,) = collect_reference_turns([task], _fixed(llm), build_solver(config), workers=1)
        assert "planner" not in {role for role, _ in llm.requests}  # the reference plan needs no planner model
    assert solve.reward == 1.0 and solve.error is None
    steps = oracle_steps(task, {}) or []
    assert len(solve.turns) == len(steps) + 1  # each step, then the stop action
    for turn, (tool, _) in zip(solve.turns, steps, strict=False):
        assert [m["role"] for m in turn][-1] == "assistant" and turn[0]["role"] == "system"
        assert json.loads(turn[-1]["content"])["tool_name"] == tool
    assert write_turns([solve], tmp_path / "turns.jsonl") == len(solve.turns)
    record = json.loads((tmp_path / "turns.jsonl").read_text().splitlines()[0])
    assert record["source"] == "calc_lookup" and record["messages"] == solve.turns[0]


def test_a_planner_guided_to_the_question_learns_the_plans_tools_with_the_question(tmp_path: Path) -> None:
    task = _two_step_task()
    config = load_config("cpu-warmstart", {"solver": {"planner_guide": "question"}})
    script = _script(task, str(task["result"]))
    script["executor"] = [json.dumps({"tool_input": sub_goal}) for _, sub_goal in oracle_steps(task, {}) or []]
    with ScriptedLLM(script) as llm:
        (solve,) = collect_reference_turns([task], _fixed(llm), build_solver(config), workers=1)
    steps = [json.loads(turn[-1]["content"]) for turn in solve.turns]
    assert [step["tool_name"] for step in steps[:-1]] == [tool for tool, _ in oracle_steps(task, {}) or []]
    assert {step["sub_goal"] for step in steps[:-1]} == {task["question"]} and steps[-1]["sub_goal"] == ""


def test_failed_solves_are_counted_but_give_no_training_data(tmp_path: Path) -> None:
    task = _two_step_task()
    with ScriptedLLM(_script(task, "a wrong answer")) as llm:
        solves = collect_reference_turns([task], _fixed(llm), build_solver(load_config("cpu-warmstart")), workers=1)
    assert solves[0].reward == 0.0 and solves[0].turns
    assert write_turns(solves, tmp_path / "turns.jsonl") == 0
    summary = summarize(solves, 1.0)
    assert (summary.tasks, summary.solved, summary.turns) == (1, 0, 0)
    assert summary.by_source == {"calc_lookup": {"tasks": 1, "solved": 0, "turns": 0}}


def test_tasks_without_a_reference_plan_are_refused() -> None:
    task = {"id": 7, "question": "Who wrote Hamlet?", "source": "no-such-source", "result": "Shakespeare"}
    with pytest.raises(ValueError, match="without a reference plan: \\[7\\]"):
        collect_reference_turns([task], {"base_url": "http://127.0.0.1:1/v1", "model": "m"}, None)  # type: ignore[arg-type]


def test_the_cache_key_follows_what_shapes_the_adapter_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = [{"id": 1, "question": "Who wrote Hamlet?", "source": "multihop", "extra_info": {"ground_truth": ["x"]}}]
    base = load_config("cpu-warmstart", {"warm_start": {"cache_dir": str(tmp_path)}})
    same = load_config("cpu-warmstart", {"warm_start": {"cache_dir": str(tmp_path), "workers": 3}})
    same.data.val_limit = 10  # held-out data never shapes the warm start
    key = warm_start_dir(base, "/m", tasks)
    assert warm_start_dir(same, "/m", tasks) == key
    packed = load_config("cpu-warmstart", {"warm_start": {"cache_dir": str(tmp_path), "packing": "prefix"}})
    assert warm_start_dir(packed, "/m", tasks) == key  # every layout trains the same adapter
    assert key.parent == tmp_path
    for changed in (
        load_config("cpu-warmstart", {"warm_start": {"cache_dir": str(tmp_path), "epochs": 5}}),
        load_config("cpu-warmstart", {"warm_start": {"cache_dir": str(tmp_path)}, "grpo": {"lora_r": 4}}),
        load_config("cpu-warmstart", {"warm_start": {"cache_dir": str(tmp_path)}, "solver": {"max_turns": 2}}),
    ):
        assert warm_start_dir(changed, "/m", tasks) != key
    assert warm_start_dir(base, "/other", tasks) != key
    assert warm_start_dir(base, "/m", [{**tasks[0], "question": "Who wrote Macbeth?"}]) != key  # other tasks
    monkeypatch.setattr(warmstart, "_SOLVE_LOOP_MODULES", ("prompts",))
    assert warm_start_dir(base, "/m", tasks) != key  # other solve-loop code (prompts, roles, tools, reward)
    without = load_config("cpu-warmstart", {"warm_start": None})
    with pytest.raises(ValueError, match="no warm_start section"):
        warm_start_dir(without, "/m", tasks)


def test_the_warm_start_trains_with_its_section_and_the_grpo_lora_shape() -> None:
    shipped = load_config("cpu-warmstart").warm_start
    assert shipped is not None and shipped.packing == "prefix"
    config = load_config("cpu-warmstart", {"warm_start": {"packing": "rows", "epochs": 2}})
    options = warm_start_sft_options(config)
    assert options["packing"] == "rows" and options["epochs"] == 2 and options["lr_scheduler"] == "constant"
    assert (options["lora_r"], options["lora_alpha"]) == (config.grpo["lora_r"], config.grpo["lora_alpha"])
    assert options["threads"] == config.grpo["update_threads"] and options["dtype"] == config.dtype
    with pytest.raises(ValueError, match="'none', 'rows' or 'prefix'"):
        load_config("cpu-warmstart", {"warm_start": {"packing": "tree"}})
    with pytest.raises(ValueError, match="no warm_start section"):
        warm_start_sft_options(load_config("cpu-warmstart", {"warm_start": None}))


def test_fixed_endpoint_reads_the_gateway_entry() -> None:
    entry = {"model_name": "fixed", "litellm_params": {"model": "agentbolt/fixed", "api_base": "http://h:1/v1"}}
    assert fixed_endpoint(entry) == {"base_url": "http://h:1/v1", "model": "fixed", "api_key": None}


def test_the_warm_start_trains_an_adapter_grpo_loads_and_is_reused(tmp_path: Path) -> None:
    from agentbolt.models.tiny import create_tiny_model

    # The tiny model's tokenizer spends a token per few characters: planner prompts need a long context.
    tiny_model_dir = create_tiny_model(tmp_path / "tiny", seed=0, max_position_embeddings=16384)
    task = _two_step_task()
    config = load_config(
        "cpu",
        {
            "warm_start": {"cache_dir": str(tmp_path / "cache"), "epochs": 1, "workers": 1, "train_batch_size": 2},
            "grpo": {"lora_r": 4, "lora_alpha": 8.0},
        },
    )
    entry = {"model_name": "fixed", "litellm_params": {"model": "hosted_vllm/fixed", "api_base": ""}}
    with ScriptedLLM(_script(task, str(task["result"]))) as llm:
        entry["litellm_params"]["api_base"] = llm.base_url
        built = ensure_warm_start(config, str(tiny_model_dir), entry, [task])
    assert not built.reused and built.collect["solved"] == 1 and built.sft["optimizer_steps"] >= 1
    adapter = json.loads((built.adapter_dir / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8.0
    again = ensure_warm_start(config, str(tiny_model_dir), entry, [task])  # no server needed: nothing is rebuilt
    assert again.reused and again.adapter_dir == built.adapter_dir and again.wall_seconds == 0.0

    grpo = build_grpo_config(config, str(tiny_model_dir), tmp_path / "run", init_adapter=str(built.adapter_dir))
    import torch
    from transformers import AutoModelForCausalLM

    from agentbolt.algorithm.finetuning.trainer import ModelTrainer

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), torch_dtype=torch.float32)
    trainer = ModelTrainer(base, grpo)
    loaded = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_B" in name}
    assert loaded and any(bool(p.abs().sum() > 0) for p in loaded.values())  # trained B, not a fresh zero B
    assert all(p.requires_grad for name, p in trainer.model.named_parameters() if "lora_" in name)


def test_a_task_limit_takes_each_source_in_turn() -> None:
    tasks = [{"id": i, "source": source} for i, source in enumerate("aaaabbc")]
    assert [t["id"] for t in take_by_source(tasks, 5)] == [0, 4, 6, 1, 5]
    assert take_by_source(tasks, None) == tasks and take_by_source(tasks, 99) == tasks
