"""``agentbolt train CONFIG``: every mistake in the config file is one line naming the key and its value, exit code 2,
before the store, the runners or the model start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
import yaml

from agentbolt.cli.train import main as train_main

TESTS = Path(__file__).resolve().parents[1]
Edit = Callable[[Dict[str, Any]], None]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A valid GRPO run config (the word model is never loaded: every test stops before it)."""
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"prompt": "ping", "answer": "yes"}) + "\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    content = {
        "algorithm": "grpo",
        "options": {
            "model": str(tmp_path / "model"),
            "finetune": "full",
            "batch_size": 1,
            "max_steps": 1,
            "console": False,
            "checkpoint_dir": "ckpt",
            "log_dir": "logs",
        },
        "agent": "support.word_model:ping_agent",
        "data": {"train": "tasks.jsonl", "val": "tasks.jsonl"},
        "trainer": {"n_runners": 1, "strategy": "shm"},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(content))
    return path


def _refused(path: Path, edit: Edit, capsys: pytest.CaptureFixture[str]) -> str:
    content = yaml.safe_load(path.read_text())
    edit(content)
    path.write_text(yaml.safe_dump(content))
    assert train_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentbolt: error: ") and err.count("\n") == 1, err
    assert not (path.parent / "ckpt").exists() and not (path.parent / "logs").exists()
    return err.removeprefix("agentbolt: error: ").strip()


def _option(key: str, value: Any) -> Edit:
    return lambda c: c["options"].update({key: value})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_option("learning_rate", 0), "options.learning_rate: Input should be greater than 0, got 0"),
        (_option("batch_size", -1), "options.batch_size: Input should be greater than or equal to 1, got -1"),
        (_option("group_size", 1), "options.group_size: Input should be greater than or equal to 2, got 1"),
        (_option("max_steps", -3), "options.max_steps: Input should be greater than or equal to 0, got -3"),
        (_option("batch_size", "four"), "options.batch_size: Input should be a valid integer, unable to parse"),
        (_option("batch_size", 2.5), "options.batch_size: Input should be a valid integer, got a number with a fr"),
        (_option("console", "nope"), "options.console: Input should be a valid boolean, unable to interpret input"),
        (lambda c: c["trainer"].update(port=0), "trainer.port: Input should be greater than or equal to 1, got 0"),
    ],
)
def test_a_refused_value_is_named_with_the_key(config: Path, capsys, edit: Edit, message: str) -> None:
    assert message in _refused(config, edit, capsys)


def test_a_misspelt_option_suggests_the_option_meant(config: Path, capsys) -> None:
    message = _refused(config, _option("learing_rate", 1e-3), capsys)
    assert message == (
        "options.learing_rate: Extra inputs are not permitted (not an option of GRPO; did you mean learning_rate?)"
    )


def test_a_misspelt_key_of_a_section_suggests_the_key_meant(config: Path, capsys) -> None:
    message = _refused(config, lambda c: c["trainer"].update(n_runner=2), capsys)
    assert message.endswith("trainer.n_runner: Extra inputs are not permitted (unknown key; did you mean n_runners?)")


@pytest.mark.parametrize("key", ["tokenizer", "adapter", "config"])
def test_constructor_arguments_that_are_python_objects_are_not_options(config: Path, capsys, key: str) -> None:
    message = _refused(config, _option(key, "x"), capsys)
    assert message.startswith(f"options.{key}: Extra inputs are not permitted (not an option of GRPO")


def test_a_model_that_is_not_a_name_is_refused_as_the_model_option(config: Path, capsys) -> None:
    assert _refused(config, _option("model", 5), capsys) == "options.model: Input should be a valid string, got 5"


@pytest.mark.parametrize("key", ["max_steps", "learning_rate", "failed_rollout_reward"])
def test_a_boolean_where_a_number_goes_is_refused(config: Path, capsys, key: str) -> None:
    assert f"options.{key}: Input should be " in _refused(config, _option(key, True), capsys)


def test_an_error_of_the_whole_options_names_no_made_up_key(config: Path, capsys) -> None:
    edit: Edit = lambda c: c["options"].update(tensorboard=True, log_dir=None)  # noqa: E731
    assert _refused(config, edit, capsys) == "options: tensorboard=True needs a log_dir"


def test_a_union_option_names_the_option_not_its_member_types(config: Path, capsys) -> None:
    message = _refused(config, _option("lora_target_modules", "q_proj"), capsys)
    assert message == (
        "options.lora_target_modules: Input should be a valid list or Input should be 'all-linear', got 'q_proj'"
    )


def test_an_unknown_algorithm_is_named_with_the_other_mistakes_of_the_file(config: Path, capsys) -> None:
    def edit(content: Dict[str, Any]) -> None:
        content.update(algorithm="grpoo")
        content["options"]["learing_rate"] = 1e-3  # not checked: whose option it would be is unknown
        content["trainer"]["n_runners"] = 0
        content["data"]["tran"] = "tasks.jsonl"

    assert _refused(config, edit, capsys) == (
        f"{config}: 3 mistakes: (1) algorithm: unknown algorithm 'grpoo'; registered: grpo, sft (its options are "
        "checked once it names one of these); (2) data.tran: Extra inputs are not permitted (unknown key; did you "
        "mean train?); (3) trainer.n_runners: Input should be greater than or equal to 1, got 0"
    )


def test_an_unknown_algorithm_without_options_is_named_alone(config: Path, capsys) -> None:
    def edit(content: Dict[str, Any]) -> None:
        content.update(algorithm="dpo")
        del content["options"]

    assert _refused(config, edit, capsys) == f"{config}: algorithm: unknown algorithm 'dpo'; registered: grpo, sft"


# A user's module of agents, not named "agents": the OpenAI Agents SDK (the agents extra) is a package of that name,
# and the suite imports it when it collects the SDK's tracing tests.
AGENTS = """
def raises():
    raise RuntimeError("no key for the agent's tool")

def needs(tool):
    return None

def no_tasks():
    return []

def tasks_fail():
    raise OSError("the task server is down")
"""


@pytest.mark.parametrize(
    ("write", "edit", "message"),
    [
        (
            {"syntax.py": "def f(:\n"},
            lambda c: c.update(agent="syntax:agent"),
            "agent 'syntax:agent': importing syntax raised SyntaxError: invalid syntax",
        ),
        (
            {"fails.py": "raise RuntimeError('no GPU here')\n"},
            lambda c: c.update(agent="fails:agent"),
            "agent 'fails:agent': importing fails raised RuntimeError: no GPU here",
        ),
        (
            {"team_agents.py": AGENTS},
            lambda c: c.update(agent="team_agents:raises"),
            "agent 'team_agents:raises': calling it raised RuntimeError: no key for the agent's tool",
        ),
        (
            {"team_agents.py": AGENTS},
            lambda c: c.update(agent="team_agents:needs"),
            "agent 'team_agents:needs' needs arguments (tool)",
        ),
        (
            {"team_agents.py": AGENTS},
            lambda c: c["data"].update(train="team_agents:tasks_fail"),
            "data.train 'team_agents:tasks_fail': calling it raised OSError: the task server is down",
        ),
        (
            {"team_agents.py": AGENTS},
            lambda c: c["data"].update(train="team_agents:no_tasks"),
            "data.train: team_agents:no_tasks holds no tasks",
        ),
    ],
)
def test_an_agent_or_tasks_whose_code_fails_is_one_line(
    config: Path, capsys, monkeypatch, write: Dict[str, str], edit: Edit, message: str
) -> None:
    monkeypatch.chdir(config.parent)  # module references import from the current directory
    for name, text in write.items():
        (config.parent / name).write_text(text)
    assert message in _refused(config, edit, capsys)


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "empty.jsonl holds no tasks"), ("\n\n", "empty.jsonl holds no tasks")],
)
def test_an_empty_task_file_is_refused(config: Path, capsys, text: str, message: str) -> None:
    (config.parent / "empty.jsonl").write_text(text)
    assert message in _refused(config, lambda c: c["data"].update(val="empty.jsonl"), capsys)
    assert message in _refused(config, lambda c: c["data"].update(train="empty.jsonl"), capsys)


def test_a_malformed_task_file_names_the_line_at_fault(config: Path, capsys) -> None:
    (config.parent / "bad.jsonl").write_text('{"prompt": "ping"}\n\n{"prompt": \n')
    message = _refused(config, lambda c: c["data"].update(train="bad.jsonl"), capsys)
    assert message.endswith("bad.jsonl is not valid JSON lines (Expecting value, line 3)")


def test_training_without_tasks_is_refused(config: Path, capsys) -> None:
    message = _refused(config, lambda c: c.pop("data"), capsys)
    assert message == "data.train: GRPO needs training tasks (or options.max_steps: 0 to only validate)"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("log_dir", "afile/logs", "options.log_dir: {base}/afile/logs cannot be created: {base}/afile is a file"),
        ("log_dir", "afile", "options.log_dir: {base}/afile is a file, not a directory"),
        ("init_adapter", "no_adapter", "options.init_adapter: {base}/no_adapter holds no adapter_config.json"),
        ("device", "cuda:99", "options.device: device 'cuda:99' is not available"),
        ("policy_server_url", "localhost:8000/v1", "options.policy_server_url: policy_server_url must be an http"),
    ],
)
def test_an_option_that_would_fail_after_the_model_loads_is_refused_first(
    config: Path, capsys, key: str, value: str, message: str
) -> None:
    (config.parent / "afile").write_text("x")
    lora = {} if key == "log_dir" or key == "device" else {"finetune": "lora"}
    edit: Edit = lambda c: c["options"].update({key: value, **lora})  # noqa: E731
    assert message.format(base=config.parent) in _refused(config, edit, capsys)


def test_an_adapter_directory_under_a_file_is_refused(config: Path, capsys) -> None:
    (config.parent / "afile").write_text("x")
    edit: Edit = lambda c: c["options"].update(  # noqa: E731
        finetune="lora", adapter_dir="afile/adapters", policy_server_url="http://127.0.0.1:9/v1"
    )
    assert _refused(config, edit, capsys).startswith("options.adapter_dir: ")


def test_an_init_adapter_of_another_rank_is_refused(config: Path, capsys) -> None:
    adapter = config.parent / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 32}))
    edit: Edit = lambda c: c["options"].update(finetune="lora", init_adapter="adapter")  # noqa: E731
    assert "has rank 16 and alpha 32, but lora_r is 8" in _refused(config, edit, capsys)


def test_a_metrics_sink_that_is_not_installed_is_refused(config: Path, capsys) -> None:
    pytest.importorskip("torch")
    if __import__("importlib.util").util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    message = _refused(config, _option("wandb_project", "runs"), capsys)
    assert message == "options.wandb_project: 'runs' needs Weights & Biases: pip install 'agentbolt[wandb]'"


def test_a_store_host_nothing_can_listen_on_is_refused(config: Path, capsys) -> None:
    edit: Edit = lambda c: c["trainer"].update(strategy="cs", host="256.1.1.1")  # noqa: E731
    assert _refused(config, edit, capsys).startswith("trainer.host: cannot listen on '256.1.1.1'")


def test_a_model_directory_is_found_relative_to_the_config_file(config: Path, capsys, monkeypatch, tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (config.parent / "afile").write_text("x")
    # The model directory next to the file is found; the check after the model's (checkpoint_dir) is what fails.
    message = _refused(config, lambda c: c["options"].update(model="model", checkpoint_dir="afile/ckpt"), capsys)
    assert message.startswith("options.checkpoint_dir: ")


def test_the_command_prints_no_traceback_for_a_failing_agent_module(config: Path) -> None:
    (config.parent / "fails.py").write_text("raise RuntimeError('no GPU here')\n")
    content = yaml.safe_load(config.read_text())
    content["agent"] = "fails:agent"
    config.write_text(yaml.safe_dump(content))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "agentbolt", "train", config.name],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == "agentbolt: error: agent 'fails:agent': importing fails raised RuntimeError: no GPU here\n"


def test_help_says_where_resume_defaults_from() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agentbolt", "train", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0
    assert "options.resume" in " ".join(result.stdout.replace("│", " ").split())
