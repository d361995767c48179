"""``agentbolt train CONFIG.yaml``: GRPO and SFT from one config file, ``--resume``, the registry, bad configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
import yaml
from support.interrupt import ctrl_c_when
from support.word_model import build_word_model

from agentbolt.algorithm.registry import (
    ALGORITHMS,
    UnknownAlgorithmError,
    algorithm_names,
    build_algorithm,
    register_algorithm,
)
from agentbolt.cli.train import main as train_main


def _config(tmp_path: Path, algorithm: str, **options: Any) -> Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "ping", "answer": "yes"}) + "\n")
    model = tmp_path / "word"
    if not model.exists():
        build_word_model(model)
    config: Dict[str, Any] = {
        "algorithm": algorithm,
        "options": {
            "model": str(model),
            "finetune": "full",
            "batch_size": 1,
            "max_steps": 1,
            "console": False,
            "rollout_timeout": 120,
            "checkpoint_dir": "ckpt",  # relative to the config file
            "log_dir": "logs",
            **options,
        },
        "agent": "support.word_model:ping_agent",
        "data": {"train": "tasks.jsonl", "val": "tasks.jsonl"},
        "trainer": {"n_runners": 1, "strategy": "shm"},
    }
    path = tmp_path / f"{algorithm}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _steps(tmp_path: Path) -> list:
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


@pytest.mark.parametrize(("algorithm", "options"), [("sft", {"rollouts_per_task": 4}), ("grpo", {"group_size": 4})])
def test_one_config_file_runs_grpo_or_sft_and_resume_continues(
    tmp_path: Path, capsys, algorithm: str, options: Dict[str, Any]
) -> None:
    config = _config(tmp_path, algorithm, **options)
    assert train_main([str(config)]) == 0
    assert f"agentbolt train: {algorithm} finished" in capsys.readouterr().out
    assert _steps(tmp_path) == [0, 1] and (tmp_path / "ckpt" / "step_000001").is_dir()
    # Two steps now: --resume starts after the checkpoint of step 1 (no second baseline validation).
    config = _config(tmp_path, algorithm, **options, max_steps=2)
    assert train_main([str(config), "--resume"]) == 0
    assert _steps(tmp_path) == [0, 1, 2] and (tmp_path / "ckpt" / "step_000002").is_dir()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(algorithm="dpo"), "algorithm: unknown algorithm 'dpo'; registered: grpo, sft"),
        (lambda c: c["options"].update(learning_rate=-1), "options.learning_rate: Input should be greater than 0"),
        (lambda c: c["options"].update(no_such_option=1), "options.no_such_option: Extra inputs are not permitted"),
        (lambda c: c.update(agent="support.word_model:nobody"), "support.word_model has no attribute 'nobody'"),
        (lambda c: c.update(agent="no_such_module:agent"), "cannot import no_such_module"),
        (lambda c: c.update(agent="support.word_model:WORDS"), "is not a LitAgent"),
        (lambda c: c["data"].update(train="missing.jsonl"), "data.train:"),
        (lambda c: c["data"].update(train="nosuch.txt"), "nosuch.txt: no such file (or write 'module:attribute'"),
        (lambda c: c["data"].update(val="."), "is a directory; give a .jsonl or .json file"),
        (lambda c: c["data"].update(val="support.word_model:build_word_model"), "is a function that needs arguments"),
        (lambda c: c["trainer"].update(n_runners=0), "trainer.n_runners: Input should be greater than or equal to 1"),
        (lambda c: c.pop("agent"), "agent: Field required"),
    ],
)
def test_a_bad_config_exits_2_with_one_line_naming_the_field(tmp_path: Path, capsys, edit, message: str) -> None:
    path = _config(tmp_path, "sft")
    capsys.readouterr()  # the model's building output
    config = yaml.safe_load(path.read_text())
    edit(config)
    path.write_text(yaml.safe_dump(config))
    assert train_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "ckpt").exists()


def test_files_that_are_not_configs_exit_2(tmp_path: Path, capsys) -> None:
    assert train_main([str(tmp_path / "none.yaml")]) == 2
    assert "no such config file" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("algorithm: [sft\n")
    assert train_main([str(broken)]) == 2
    assert "is not valid YAML" in capsys.readouterr().err
    listed = tmp_path / "list.yaml"
    listed.write_text("- sft\n")
    assert train_main([str(listed)]) == 2
    assert "expected a mapping" in capsys.readouterr().err
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfealgorithm")
    assert train_main([str(binary)]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err
    assert train_main([str(tmp_path)]) == 2
    assert "is a directory, not a config file" in capsys.readouterr().err


def test_a_store_port_in_use_is_named_before_anything_starts(tmp_path: Path, capsys) -> None:
    from support.servers import taken_port

    path = _config(tmp_path, "sft")
    capsys.readouterr()
    config = yaml.safe_load(path.read_text())
    with taken_port() as port:
        config["trainer"].update(strategy="cs", port=port)
        path.write_text(yaml.safe_dump(config))
        assert train_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"trainer.port {port}: cannot listen on 127.0.0.1:{port}" in err and err.count("\n") == 1


def test_resume_needs_a_checkpoint_directory(tmp_path: Path, capsys) -> None:
    path = _config(tmp_path, "sft")
    capsys.readouterr()
    config = yaml.safe_load(path.read_text())
    del config["options"]["checkpoint_dir"]
    path.write_text(yaml.safe_dump(config))
    assert train_main([str(path), "--resume"]) == 2
    assert "--resume needs options.checkpoint_dir" in capsys.readouterr().err


def test_another_algorithm_plugs_in_by_name() -> None:
    class Echo:
        def __init__(self, **options: Any) -> None:
            self.options = options

    register_algorithm("echo", Echo)
    try:
        assert "echo" in algorithm_names()
        assert build_algorithm("echo", {"rounds": 3}).options == {"rounds": 3}
        with pytest.raises(ValueError, match="already registered"):
            register_algorithm("echo", Echo)
        register_algorithm("echo", "tests_nothing.module:Echo", replace=True)
        with pytest.raises(ModuleNotFoundError):
            build_algorithm("echo")
    finally:
        ALGORITHMS.pop("echo", None)
    with pytest.raises(ValueError, match="'module:attribute'"):
        register_algorithm("bad", "no_colon")
    with pytest.raises(UnknownAlgorithmError, match="unknown algorithm 'nope'"):
        build_algorithm("nope")
    sft = build_algorithm("sft", {"max_steps": 3})
    assert type(sft).__name__ == "SFT" and sft.config.max_steps == 3


TESTS = Path(__file__).resolve().parents[2]

STALLING_AGENT = """
import asyncio
from pathlib import Path

from support.word_model import PingAgent


class StallsAfterTheFirstCheckpoint(PingAgent):
    async def rollout_async(self, task, resources, rollout):
        if Path("ckpt/step_000001").exists():  # step 2: wait for Ctrl-C
            Path("stalled").write_text("")
            await asyncio.sleep(3600)
        return await super().rollout_async(task, resources, rollout)


agent = StallsAfterTheFirstCheckpoint()
"""


def _edited(path: Path, edit) -> Path:
    config = yaml.safe_load(path.read_text())
    edit(config)
    path.write_text(yaml.safe_dump(config))
    return path


def _train_command_env() -> Dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


def _train_until_stalled_then_ctrl_c(tmp_path: Path, config: Path) -> Tuple[int, str, str]:
    """Run ``agentbolt train CONFIG`` in ``tmp_path`` until its agent writes ``stalled``, then Ctrl-C it; its exit
    code, stdout and stderr."""
    process, out, err = ctrl_c_when(
        [sys.executable, "-m", "agentbolt", "train", config.name],
        lambda: (tmp_path / "stalled").exists(),
        cwd=tmp_path,
        env=_train_command_env(),
        exit_seconds=300,
    )
    return process.returncode, out, err


@pytest.mark.parametrize("strategy", ["cs", "shm"])
def test_ctrl_c_stops_a_run_with_exit_130_and_one_line_to_resume_it(tmp_path: Path, strategy: str) -> None:
    (tmp_path / "stalling.py").write_text(STALLING_AGENT)
    path = _config(tmp_path, "sft", max_steps=3, checkpoint_interval=1, val_before_train=False)

    def edit(config: Dict[str, Any]) -> None:
        config.update(agent="stalling:agent", data={"train": "tasks.jsonl"})
        config["trainer"].update(strategy=strategy, n_runners=2, store="store.db")

    returncode, out, err = _train_until_stalled_then_ctrl_c(tmp_path, _edited(path, edit))
    assert returncode == 130, err
    resume = f"agentbolt train: interrupted at step 1/3; resume with: agentbolt train {path.name} --resume (from "
    assert resume in err and "step_000001" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "CancelledError" not in err, err
    assert "finished" not in out
    assert not (tmp_path / "store.db-wal").exists()  # the store was closed


STALLING_IN_TRAINING = """
import asyncio
from pathlib import Path

from support.word_model import PingAgent


class StallsInTraining(PingAgent):
    async def rollout_async(self, task, resources, rollout):
        if rollout.mode == "train":  # validation (step 0) runs, the first training step waits for Ctrl-C
            Path("stalled").write_text("")
            await asyncio.sleep(3600)
        return await super().rollout_async(task, resources, rollout)


agent = StallsInTraining()
"""


def test_ctrl_c_before_the_first_checkpoint_says_how_to_start_the_run_again_and_that_does(tmp_path: Path) -> None:
    (tmp_path / "stalling.py").write_text(STALLING_IN_TRAINING)
    path = _config(tmp_path, "sft", max_steps=2, val_before_train=True, val_interval=0)
    returncode, _, err = _train_until_stalled_then_ctrl_c(
        tmp_path, _edited(path, lambda c: c.update(agent="stalling:agent"))
    )
    assert returncode == 130, err
    assert "interrupted at step 0/2; no checkpoint was written to " in err
    assert f"yet: agentbolt train {path.name} --resume starts this run again from step 0" in err
    first_id = json.loads((tmp_path / "ckpt" / "run.json").read_text())["run_id"]
    assert [json.loads(line)["step"] for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()] == [0]

    _edited(path, lambda c: c.update(agent="support.word_model:ping_agent"))
    again = subprocess.run(
        [sys.executable, "-m", "agentbolt", "train", path.name, "--resume"],
        cwd=tmp_path,
        env=_train_command_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"Run {first_id} stopped before its first checkpoint" in again.stderr
    logged = [json.loads(line)["step"] for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [0, 1, 2] and not (tmp_path / "ckpt" / "run.json").exists()  # step 0 logged again, once


def test_the_store_file_holds_the_run_when_the_command_ends(tmp_path: Path, capsys) -> None:
    path = _edited(_config(tmp_path, "sft"), lambda c: c["trainer"].update(store="store.db"))
    assert train_main([str(path)]) == 0
    assert (tmp_path / "store.db").stat().st_size > 0
    assert not (tmp_path / "store.db-wal").exists()


def test_a_model_that_cannot_be_found_exits_2_before_anything_runs(tmp_path: Path, capsys) -> None:
    path = _edited(_config(tmp_path, "sft"), lambda c: c["options"].update(model="no-such-model"))
    capsys.readouterr()
    assert train_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "agentbolt: error: options.model: model 'no-such-model' is neither a registry name" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "logs").exists()


def test_a_new_run_over_another_runs_metrics_exits_2_before_anything_runs(tmp_path: Path, capsys) -> None:
    path = _config(tmp_path, "sft")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.jsonl").write_text(json.dumps({"step": 1, "update/loss": 1.0}) + "\n")
    capsys.readouterr()
    assert train_main([str(path), "--no-resume"]) == 2
    err = capsys.readouterr().err
    assert "agentbolt: error: options.log_dir: log_dir" in err and "steps 1 to 1" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "ckpt").exists()


def test_a_new_run_over_another_runs_checkpoints_exits_2_before_anything_runs(tmp_path: Path, capsys) -> None:
    path = _config(tmp_path, "sft")
    (tmp_path / "ckpt" / "step_000003").mkdir(parents=True)
    (tmp_path / "ckpt" / "step_000003" / "trainer_state.json").write_text("{}")
    capsys.readouterr()
    assert train_main([str(path), "--no-resume"]) == 2
    err = capsys.readouterr().err
    assert "agentbolt: error: options.checkpoint_dir: checkpoint_dir" in err and "(latest: step_000003)" in err
    assert err.count("\n") == 1 and not (tmp_path / "logs").exists()
