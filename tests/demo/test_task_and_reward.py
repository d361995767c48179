"""The demo's data, calculator, answer parsing and reward, and the agent's conversation against a real server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from agentbolt.demo.agent import (
    FEW_SHOT,
    CalculatorError,
    Episode,
    RewardConfig,
    calculate,
    run_episode,
    score,
)
from agentbolt.demo.run import DemoConfig, new_run_dir, run_demo, step_time_split
from agentbolt.demo.task import DEMONSTRATIONS, make_splits, parse_answer, question_key


def test_splits_are_deterministic_disjoint_and_correct() -> None:
    train, val = make_splits(200, 50, seed=3)
    assert (train, val) == make_splits(200, 50, seed=3)
    assert make_splits(200, 50, seed=4) != (train, val)
    assert len(train) == 200 and len(val) == 50
    expressions = [t["expression"] for t in train + val]
    assert len(set(expressions)) == len(expressions)
    for task in train + val:
        assert task["expression"] in task["question"] and "ANSWER: <number>" in task["question"]
        assert int(calculate(task["expression"])) == task["answer"]
    assert {t["id"] for t in val} == {f"val-{i}" for i in range(50)}
    # The validation split does not depend on the training split's size.
    assert make_splits(10, 50, seed=3)[1] == val


def test_split_sizes_are_validated() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        make_splits(-1, 5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ANSWER: 444", 444),
        ("The result is 444.\nANSWER:  -12", -12),
        ("ANSWER: 1 then ANSWER: 2", None),
        ("answer: 444", None),
        ("444", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_answer(text: Any, expected: Any) -> None:
    assert parse_answer(text) == expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [("37 * 12", "444"), ("(2 + 3) * -4", "-20"), ("7 / 2", "3.5"), ("3 x 4", "12"), ("3X4", "12"), ("10x0", "0")],
)
def test_calculator(expression: str, expected: str) -> None:
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "2 ** 8",
        "1 / 0",
        "abc",
        "9" * 20,
        "",
        "[1]",
        pytest.param("9" * 5000, id="literal beyond int conversion limit"),
        pytest.param("-" * 100_000 + "1", id="deeply nested signs"),
        pytest.param("+".join(["1"] * 100_000), id="very long sum"),
        pytest.param("0x10", id="hexadecimal or zero times ten"),
        pytest.param("0X1f", id="upper-case hexadecimal"),
        pytest.param("0b11 + 1", id="binary"),
        pytest.param("2 * 0o17", id="octal"),
    ],
)
def test_calculator_rejects_non_arithmetic(expression: str) -> None:
    with pytest.raises(CalculatorError):
        calculate(expression)


def test_reward_is_strict_for_correct_answers_and_credits_format_below_one() -> None:
    task = make_splits(0, 1)[1][0]
    right = Episode(tool_calls=[task["expression"]], tool_results=[str(task["answer"])], answer=task["answer"])
    wrong_format_only = Episode(answer=task["answer"] + 1)
    tool_only = Episode(tool_calls=["1 + 1"], tool_results=["2"])
    broken_tool = Episode(tool_calls=[""], tool_results=["error: missing 'expression'"])
    credit = RewardConfig(tool_credit=0.2, format_credit=0.1)
    assert score(right, task) == score(right, task, credit) == 1.0
    assert score(wrong_format_only, task) == 0.0 and score(wrong_format_only, task, credit) == pytest.approx(0.1)
    assert score(tool_only, task, credit) == pytest.approx(0.2)
    assert score(broken_tool, task, credit) == 0.0
    both = Episode(tool_calls=["1"], tool_results=["1"], answer=task["answer"] + 1)
    assert score(both, task, credit) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("tool_credit", "format_credit"),
    [(0.6, 0.6), (0.25, 0.25), (0.5, 0.0), (-0.1, 0.0), (0.0, float("nan")), (float("inf"), 0.0), (True, 0.0)],
)
def test_credits_a_wrong_answer_could_earn_half_a_correct_ones_reward_are_refused(
    tool_credit: float, format_credit: float
) -> None:
    with pytest.raises(ValueError, match="credit"):
        RewardConfig(tool_credit=tool_credit, format_credit=format_credit)


def test_a_demo_with_credits_out_of_range_fails_before_it_creates_a_run_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"below 0\.5"):
        run_demo(DemoConfig(output_dir=tmp_path / "runs", tool_credit=0.3, format_credit=0.3))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("seed", range(300))
def test_no_generated_question_is_a_worked_example(seed: int) -> None:
    demonstrated = {question_key(t) for t in DEMONSTRATIONS}
    train, val = make_splits(256, 48, seed=seed)
    assert not demonstrated & {question_key(t) for t in train + val}


def test_split_sizes_beyond_the_distinct_questions_are_refused() -> None:
    with pytest.raises(ValueError, match="distinct"):
        make_splits(10**6, 48)


def test_few_shot_demonstrations_are_consistent() -> None:
    calls = [m for m in FEW_SHOT if m.get("tool_calls")]
    results = [m for m in FEW_SHOT if m["role"] == "tool"]
    answers = [parse_answer(m["content"]) for m in FEW_SHOT if m["role"] == "assistant" and not m.get("tool_calls")]
    assert len(calls) == len(results) == len(answers) == 2
    for call, result, answer in zip(calls, results, answers, strict=True):
        expression = json.loads(call["tool_calls"][0]["function"]["arguments"])["expression"]
        assert calculate(expression) == result["content"] == str(answer)
        assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    # The demonstrations never reuse a generated question.
    train, val = make_splits(500, 100)
    assert not {"11 * 13", "250 + 375"} & {t["expression"] for t in train + val}


def test_step_time_split_sums_training_steps(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "val/accuracy": 0.1},
        {"step": 1, "time/rollout_seconds": 3.0, "time/update_seconds": 1.0, "time/step_seconds": 4.5},
        {"step": 2, "time/rollout_seconds": 5.0, "time/update_seconds": 1.0, "time/step_seconds": 6.5},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    split = step_time_split(path)
    assert split["steps"] == 2 and split["rollout_seconds"] == 8.0 and split["update_seconds"] == 2.0
    assert split["step_seconds"] == 11.0 and split["rollout_fraction"] == pytest.approx(0.8)


class _ScriptedChat(BaseHTTPRequestHandler):
    """A real HTTP endpoint speaking the OpenAI chat API with scripted replies.

    It stands in for a model only to pin down the agent's conversation protocol; the model-backed path is covered
    by the end-to-end demo test.
    """

    replies: List[Dict[str, Any]] = []
    requests: List[Dict[str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        message = type(self).replies[len(type(self).requests) - 1]
        payload = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", **message},
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def scripted_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


async def test_agent_runs_the_tool_and_reads_the_answer(scripted_server: str) -> None:
    from openai import AsyncOpenAI

    task = make_splits(0, 1)[1][0]
    call = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": ""}}
    call["function"]["arguments"] = json.dumps({"expression": task["expression"]})
    _ScriptedChat.replies = [{"content": "", "tool_calls": [call]}, {"content": f"ANSWER: {task['answer']}"}]
    _ScriptedChat.requests = []
    async with AsyncOpenAI(base_url=scripted_server, api_key="unused", max_retries=0) as client:
        episode = await run_episode(client, "m", task, sampling_parameters={"temperature": 0.5})
    assert episode.tool_calls == [task["expression"]] and episode.tool_results == [str(task["answer"])]
    assert episode.answer == task["answer"] and episode.turns == 2 and score(episode, task) == 1.0
    first, second = _ScriptedChat.requests
    assert first["tools"][0]["function"]["name"] == "calculator" and first["temperature"] == 0.5
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["system"] + [m["role"] for m in FEW_SHOT] + ["user", "assistant", "tool"]
    assert second["messages"][-3]["content"] == task["question"]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": str(task["answer"])}


async def test_agent_reports_bad_tool_calls_to_the_model(scripted_server: str) -> None:
    from openai import AsyncOpenAI

    task = make_splits(0, 1)[1][0]
    call = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": "{not json"}}
    _ScriptedChat.replies = [{"content": "", "tool_calls": [call]}, {"content": "I cannot."}]
    _ScriptedChat.requests = []
    async with AsyncOpenAI(base_url=scripted_server, api_key="unused", max_retries=0) as client:
        episode = await run_episode(client, "m", task)
    assert episode.tool_results == ["error: arguments are not JSON"] and episode.answer is None
    assert score(episode, task, RewardConfig(tool_credit=0.4)) == 0.0
    assert _ScriptedChat.requests[1]["messages"][-1]["content"] == "error: arguments are not JSON"


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param('{"expression": %s}' % ("9" * 5000), id="number beyond int conversion limit"),
        pytest.param('{"expression": "%s"}' % ("-" * 100_000 + "1"), id="deeply nested signs"),
        pytest.param("[" * 100_000, id="deeply nested JSON"),
    ],
)
async def test_hostile_tool_arguments_are_reported_to_the_model(scripted_server: str, arguments: str) -> None:
    from openai import AsyncOpenAI

    task = make_splits(0, 1)[1][0]
    call = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
    _ScriptedChat.replies = [{"content": "", "tool_calls": [call]}, {"content": f"ANSWER: {task['answer']}"}]
    _ScriptedChat.requests = []
    async with AsyncOpenAI(base_url=scripted_server, api_key="unused", max_retries=0) as client:
        episode = await run_episode(client, "m", task)
    assert len(episode.tool_results) == 1 and episode.tool_results[0].startswith("error")
    assert _ScriptedChat.requests[1]["messages"][-1]["content"] == episode.tool_results[0]


def test_cli_rejects_bad_arguments_before_loading_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentbolt.cli.app import run

    assert run(["demo", "--steps", "-1"]) == 2
    assert "--steps" in capsys.readouterr().err
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert run(["demo", "--output-dir", str(a_file)]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert run(["demo", "--output-dir", str(tmp_path / "out"), "--summary-json", str(tmp_path)]) == 2
    assert "is a directory, not a file" in capsys.readouterr().err
    assert run(["demo", "--help"]) == 0
    assert "--summary-json" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("option", "value"),
    [("--steps", "-1"), ("--steps", "two"), ("--seed", str(2**64)), ("--seed", str(-(2**63) - 1)), ("--seed", "1.5")],
)
def test_cli_rejects_numbers_out_of_range_before_loading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    from agentbolt.cli.app import run

    argv = ["demo", "--quick", "--steps", "0", "--output-dir", str(tmp_path / "runs"), option, value]
    assert run(argv) == 2
    assert f"'{option}'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        pytest.param("--output-dir", "a-file/out cannot be created: ", id="output directory under a file"),
        pytest.param("--summary-json", "a-file is a file, not a directory", id="summary file under a file"),
    ],
)
def test_cli_rejects_unwritable_outputs_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, message: str
) -> None:
    from agentbolt.cli.app import run

    (tmp_path / "a-file").write_text("")
    paths = {"--output-dir": str(tmp_path / "runs"), "--summary-json": str(tmp_path / "summary.json")}
    paths[option] = str(tmp_path / "a-file" / "out")
    argv = ["demo", "--quick", "--steps", "0", *(part for pair in paths.items() for part in pair)]
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert f"agentbolt: error: {option}" in err and message in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("option", ["--output-dir", "--summary-json"])
def test_cli_expands_a_tilde_in_output_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    from agentbolt.cli.app import run

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    (home / "a-file").write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    # "--option=~/..." reaches the command unexpanded: the shell expands a tilde only at the start of a word.
    argv = ["demo", "--quick", "--steps", "0", f"{option}=~/a-file/out"]
    assert run(argv) == 2
    assert str(home / "a-file") in capsys.readouterr().err
    assert not (cwd / "~").exists()


def test_a_demo_without_held_out_questions_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from agentbolt.demo.run import DemoConfig, run_demo

    with pytest.raises(ValueError, match="n_val"):
        run_demo(DemoConfig(n_val=0, steps=0, runners=1, output_dir=tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def _new_run_dirs_at_once(output_dir: Path, runs: int) -> Tuple[List[Path], List[BaseException]]:
    """Call ``new_run_dir(output_dir)`` from ``runs`` threads released together; the directories and the errors."""
    start = threading.Barrier(runs)
    made: List[Path] = []
    errors: List[BaseException] = []

    def make() -> None:
        start.wait()
        try:
            made.append(new_run_dir(output_dir))
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return made, errors


def test_runs_started_at_once_each_get_a_new_directory(tmp_path: Path) -> None:
    for round_ in range(10):
        made, errors = _new_run_dirs_at_once(tmp_path / f"round-{round_}", 16)
        assert errors == [] and len(set(made)) == 16
        assert all(path.is_dir() and not any(path.iterdir()) for path in made)
