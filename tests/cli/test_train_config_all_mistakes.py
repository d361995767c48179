"""``agentbolt train CONFIG`` names every mistake of the config file in one run: one line, exit code 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from agentbolt.cli.train import main as train_main


def _valid_config(tmp_path: Path) -> Dict[str, Any]:
    """A valid GRPO run config (the word model is never loaded: every test stops before it)."""
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"prompt": "ping", "answer": "yes"}) + "\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return {
        "algorithm": "grpo",
        "options": {"model": str(tmp_path / "model"), "batch_size": 1, "max_steps": 1, "console": False},
        "agent": "support.word_model:ping_agent",
        "data": {"train": "tasks.jsonl"},
        "trainer": {"n_runners": 1, "strategy": "shm"},
    }


def _error(path: Path, content: Dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    path.write_text(yaml.safe_dump(content))
    assert train_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentbolt: error: ") and err.count("\n") == 1, err
    return err.removeprefix("agentbolt: error: ").strip()


def test_mistakes_in_several_sections_are_all_named_in_one_run(tmp_path: Path, capsys) -> None:
    content = _valid_config(tmp_path)
    content["trainer"]["n_runners"] = 0  # a value out of range
    content["data"]["tran"] = "tasks.jsonl"  # an unknown key
    content["options"]["batch_size"] = "four"  # a wrong type
    content["options"]["learing_rate"] = 1e-3  # a misspelt option
    path = tmp_path / "run.yaml"
    message = _error(path, content, capsys)
    assert message.startswith(f"{path}: 4 mistakes: (1) ")
    for mistake in (
        "data.tran: Extra inputs are not permitted (unknown key; did you mean train?)",
        "trainer.n_runners: Input should be greater than or equal to 1, got 0",
        "options.batch_size: Input should be a valid integer, unable to parse",
        "options.learing_rate: Extra inputs are not permitted (not an option of GRPO; did you mean learning_rate?)",
    ):
        assert mistake in message, message


def test_several_wrong_options_are_all_named(tmp_path: Path, capsys) -> None:
    content = _valid_config(tmp_path)
    content["options"].update(batch_size=-1, group_size=1, max_steps=-3)
    message = _error(tmp_path / "run.yaml", content, capsys)
    assert "3 mistakes" in message
    assert "options.batch_size: Input should be greater than or equal to 1, got -1" in message
    assert "options.group_size: Input should be greater than or equal to 2, got 1" in message
    assert "options.max_steps: Input should be greater than or equal to 0, got -3" in message


def test_one_mistake_is_reported_alone(tmp_path: Path, capsys) -> None:
    content = _valid_config(tmp_path)
    content["trainer"]["n_runners"] = 0
    path = tmp_path / "run.yaml"
    assert _error(path, content, capsys) == (
        f"{path}: trainer.n_runners: Input should be greater than or equal to 1, got 0"
    )


def test_options_that_are_not_a_mapping_are_one_mistake(tmp_path: Path, capsys) -> None:
    content = _valid_config(tmp_path)
    content["options"] = ["batch_size", 1]
    path = tmp_path / "run.yaml"
    assert _error(path, content, capsys).startswith(f"{path}: options: Input should be a valid dictionary")
