"""The SFT example: its grader against adversarial answers, its data, and its separate-processes layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.servers import REPO, free_port, start_store_process, wait_healthy
from support.split_overlap import describe, find_overlaps

from agentbolt.demo.agent import calculate
from examples.sft.agent import FEW_SHOT, SYSTEM_PROMPT, TEACHER_FEW_SHOT, prompt_messages, student_prompt
from examples.sft.data import DATA_DIR, family_of, load_split, make_splits
from examples.sft.grader import compute_reward

QUESTION = "A cinema has 23 rows with 14 seats in every row. How many seats does the cinema have?"
GOLD = 322


@pytest.mark.parametrize(
    ("reply", "reward"),
    [
        ("### 322 ###", 1.0),
        ("23 rows of 14 seats is 23 * 14.\n### 322 ###", 1.0),  # reasoning before the answer line is fine
        ("###322###", 1.0),
        ("### 322.0 ###", 1.0),
        ("### 321 ###", 0.0),
        (QUESTION, 0.0),  # the question copied back
        (f"{QUESTION}\n### 23 ###", 0.0),  # the question copied back, committing to one of its numbers
        ("### 14 ###\n### 322 ###", 0.0),  # several candidates
        ("### 322 or 323 ###", 0.0),
        ("### 14, 23, 322, 337 ###", 0.0),  # the gold among distractors
        ("### 14 ### ### 23 ### ### 322 ###", 0.0),
        ("", 0.0),
        ("   \n  ", 0.0),
        (None, 0.0),
        ("### 322 ###\nI hope this helps!", 0.0),  # the answer line must be the last one
        ("The answer is 322.", 0.0),  # right number, no answer line
        (" ".join(f"### {n} ###" for n in range(2000)), 0.0),  # very long: every candidate
        ("\n".join(str(n) for n in range(5000)), 0.0),  # very long: every number, no answer line
        ("Let me think step by step. " * 300 + "\n### 322 ###", 1.0),  # long, but one committed answer
        ("### 1,322 ###", 0.0),
    ],
)
def test_the_grader_rewards_only_one_committed_right_answer(reply, reward) -> None:
    assert compute_reward(reply, GOLD) == reward


def test_thousands_separators_are_read() -> None:
    assert compute_reward("### 1,346 ###", 1346) == 1.0 and compute_reward("### 1,34,6 ###", 1346) == 0.0


def test_the_shipped_data_is_what_the_generator_writes() -> None:
    train, val = make_splits()
    assert load_split("train") == train and load_split("val") == val
    assert (len(train), len(val)) == (400, 200)
    assert sorted(DATA_DIR.iterdir()) == [DATA_DIR / "train.jsonl", DATA_DIR / "val.jsonl"]
    for problem in train + val:
        assert calculate(problem["expression"]) == str(problem["answer"])
    assert len({p["id"] for p in train + val}) == 600


def test_no_held_out_problem_is_a_training_problem_reworded() -> None:
    train, val = make_splits()
    overlaps = find_overlaps([p["question"] for p in train], [p["question"] for p in val])
    assert overlaps == [], describe(overlaps)
    train_words = {w for p in train for w in p["question"].split()}
    assert not {"cinema", "museum", "tank", "cartons", "gardener", "chore"} & train_words  # other stories


def test_a_bad_split_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown split 'test'"):
        load_split("test")


@pytest.fixture(scope="module")
def long_context_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama with a 4096-token context: its tokenizer writes the teacher's prompt in ~2500 tokens."""
    from agentbolt.models.tiny import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("tiny-llama-4k"), seed=0, max_position_embeddings=4096)


def _tiny_run_options(model_dir: Path, **extra: object) -> list[str]:
    """``--option key=value`` arguments of a one-step SFT run on the tiny random model."""
    options = {
        "model": str(model_dir),
        "max_steps": 1,
        "batch_size": 2,
        "rollouts_per_task": 2,
        "min_reward": None,  # the random tiny model never answers right: train on every call
        "best_of_n": False,
        "gradient_checkpointing": False,
        "threads": 1,
        "console": False,
        "rollout_timeout": 300,
        **extra,
    }
    return [part for key, value in options.items() for part in ("--option", f"{key}={json.dumps(value)}")]


@pytest.mark.slow
def test_the_separate_processes_layout_trains_through_a_store_server(
    tmp_path: Path, long_context_tiny_model: Path
) -> None:
    port = free_port()
    store = start_store_process(tmp_path / "store.db", port, stderr=subprocess.DEVNULL)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    url = f"http://127.0.0.1:{port}"
    runners = None
    try:
        wait_healthy(f"{url}/v1/agl/health", store)
        runners = subprocess.Popen(
            [sys.executable, "-m", "examples.sft.runners", "--store", url, "--runners", "2"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        options = _tiny_run_options(
            long_context_tiny_model, checkpoint_dir=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "logs")
        )
        command = [sys.executable, "-m", "examples.sft.algorithm", "--store", url, "--n-val", "2", *options]
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout)
        assert summary["held_out_before"]["total"] == summary["held_out_after"]["total"] == 2
        (step,) = summary["steps"]
        assert step["selected"] > 0 and step["loss"] > 0
        assert step["student_prompts"] > 0  # the teacher's calls were learned with the deployed prompt
        assert (tmp_path / "ckpt" / "step_000001").is_dir()
    finally:
        for process in (runners, store):
            if process is not None:
                process.terminate()
                process.wait(timeout=60)


def _worked_examples(shots: list) -> list:
    """``(question, expression, tool result, answer line)`` of each worked conversation."""
    return [
        (
            shots[i]["content"],
            json.loads(shots[i + 1]["tool_calls"][0]["function"]["arguments"])["expression"],
            shots[i + 2]["content"],
            shots[i + 3]["content"],
        )
        for i in range(0, len(shots), 4)
    ]


def test_the_teacher_shows_one_right_worked_example_per_shape_from_stories_of_neither_split() -> None:
    examples = _worked_examples(TEACHER_FEW_SHOT)
    shapes = [family_of({"id": "x", "question": q, "expression": e, "answer": 0}) for q, e, _, _ in examples]
    assert sorted(shapes) == sorted({family_of(p) for p in load_split("train")})
    assert all(result == calculate(e) and answer == f"### {result} ###" for _, e, result, answer in examples)
    assert TEACHER_FEW_SHOT[: len(FEW_SHOT)] == FEW_SHOT
    # No worked example is a problem of either split reworded, or holds a problem's numbers.
    problems = [p["question"] for p in (*load_split("train"), *load_split("val"))]
    overlaps = find_overlaps([question for question, _, _, _ in examples], problems)
    assert overlaps == [], describe(overlaps)


def test_the_student_prompt_puts_a_teacher_call_back_into_the_deployed_prompt() -> None:
    question = load_split("train")[0]["question"]
    turns = [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "calculator", "arguments": '{"expression": "1 + 1"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "2"},
    ]  # fmt: skip
    for shots in (TEACHER_FEW_SHOT, FEW_SHOT):
        assert student_prompt(prompt_messages(question, shots)) == prompt_messages(question)
        assert student_prompt([*prompt_messages(question, shots), *turns]) == [*prompt_messages(question), *turns]
    assert prompt_messages(question)[0] == {"role": "system", "content": SYSTEM_PROMPT}


def test_every_problem_has_the_shape_of_its_family() -> None:
    train, val = load_split("train"), load_split("val")
    shapes = {family_of(problem) for problem in train + val}
    assert shapes == {"product", "sum", "difference", "quotient", "product minus", "product plus"}
    assert {family_of(problem) for problem in val} == {"product", "sum", "difference", "quotient", "product plus"}
    with pytest.raises(ValueError, match="no known arithmetic shape"):
        family_of({"id": "x", "question": "?", "expression": "(1 + 2) * 3", "answer": 9})


@pytest.mark.slow
def test_the_all_in_one_run_writes_a_result_file_with_per_shape_rows(
    tmp_path: Path, long_context_tiny_model: Path
) -> None:
    from examples.sft.allinone import main

    argv = ["--output-dir", str(tmp_path / "runs"), "--n-val", "6", "--runners", "2"]
    argv += ["--results-dir", str(tmp_path), "--result-name", "sft-tiny", *_tiny_run_options(long_context_tiny_model)]
    assert main(argv) == 0
    document = json.loads((tmp_path / "sft-tiny.json").read_text())
    assert document["benchmark"] == "sft_allinone" and document["command"].startswith("python -m examples.sft.allinone")
    results = document["results"]
    assert results["held_out_before"]["total"] == results["held_out_after"]["total"] == 6
    rows = {row["slice"]: row for row in results["heldout"]}
    assert rows["all"]["n"] == 6 and sum(row["n"] for name, row in rows.items() if name != "all") == 6
    assert set(rows) - {"all"} <= {"product", "sum", "difference", "quotient", "product plus"}
    assert results["peak_rss_mb"]["main"] > 0 and results["options"]["max_steps"] == 1
    (step,) = results["steps"]
    assert step["student_prompts"] > 0 and step["selected"] > 0  # the teacher's calls, learned from the deployed prompt
