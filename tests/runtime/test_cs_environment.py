"""The client-server strategy and the Trainer configured through AGL_* variables (§11, §12, §17).

A malformed value, or settings that contradict each other, is one ``ValueError`` naming the variable, raised when the
strategy (or the Trainer) is built, or when ``execute`` starts: before any process, server or bundle starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from support.servers import STORE_HEALTH_PATH, free_port, wait_healthy

import agentbolt as agl
from agentbolt.execution import ClientServerExecutionStrategy, ExecutionEvent
from agentbolt.store.memory import InMemoryLightningStore

VARIABLES = ("AGL_CURRENT_ROLE", "AGL_SERVER_HOST", "AGL_SERVER_PORT", "AGL_MANAGED_STORE")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield


def _set(monkeypatch: pytest.MonkeyPatch, env: Dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)


MALFORMED = [
    {"AGL_CURRENT_ROLE": "wizard"},
    {"AGL_CURRENT_ROLE": ""},
    {"AGL_SERVER_PORT": "http"},
    {"AGL_SERVER_PORT": ""},
    {"AGL_SERVER_PORT": "99999"},
    {"AGL_SERVER_PORT": "-1"},
    {"AGL_SERVER_HOST": ""},
    {"AGL_SERVER_HOST": "   "},
    {"AGL_MANAGED_STORE": "maybe"},
    {"AGL_MANAGED_STORE": ""},
]


@pytest.mark.parametrize("env", MALFORMED, ids=lambda env: "-".join(f"{k}={v!r}" for k, v in env.items()))
def test_a_malformed_variable_is_one_error_naming_it_when_the_strategy_is_built(
    monkeypatch: pytest.MonkeyPatch, env: Dict[str, str]
) -> None:
    _set(monkeypatch, env)
    (name,) = env
    with pytest.raises(ValueError, match=name):
        ClientServerExecutionStrategy()


@pytest.mark.parametrize("env", MALFORMED, ids=lambda env: "-".join(f"{k}={v!r}" for k, v in env.items()))
def test_a_malformed_variable_is_one_error_naming_it_when_the_trainer_is_built(
    monkeypatch: pytest.MonkeyPatch, env: Dict[str, str]
) -> None:
    _set(monkeypatch, env)
    (name,) = env
    with pytest.raises(ValueError, match=name):
        agl.Trainer(n_runners=1)


def test_surrounding_whitespace_and_the_case_of_a_role_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(
        monkeypatch,
        {"AGL_CURRENT_ROLE": " Runner\n", "AGL_SERVER_HOST": " 127.0.0.1 ", "AGL_SERVER_PORT": " 4848 "},
    )
    strategy = ClientServerExecutionStrategy()
    assert (strategy.role, strategy.server_host, strategy.server_port) == ("runner", "127.0.0.1", 4848)


@pytest.mark.parametrize("role", ["algorithm", "runner"])
def test_port_zero_from_the_environment_with_a_split_role_names_both_variables(
    monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    _set(monkeypatch, {"AGL_CURRENT_ROLE": role, "AGL_SERVER_PORT": "0"})
    with pytest.raises(ValueError, match=r"AGL_SERVER_PORT=0 .*AGL_CURRENT_ROLE"):
        ClientServerExecutionStrategy()
    with pytest.raises(ValueError, match=r"AGL_SERVER_PORT=0 .*AGL_CURRENT_ROLE"):
        agl.Trainer()


def test_main_process_runner_with_a_role_from_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _set(monkeypatch, {"AGL_CURRENT_ROLE": "algorithm"})
    with pytest.raises(ValueError, match=r"main_process='runner'.*AGL_CURRENT_ROLE='algorithm'"):
        ClientServerExecutionStrategy(main_process="runner")
    with pytest.raises(ValueError, match=r"main_process='runner'.*AGL_CURRENT_ROLE='algorithm'"):
        agl.Trainer(strategy={"type": "cs", "main_process": "runner"})


def test_arguments_win_over_the_environment_even_a_malformed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(
        monkeypatch,
        {"AGL_CURRENT_ROLE": "wizard", "AGL_SERVER_HOST": "", "AGL_SERVER_PORT": "http", "AGL_MANAGED_STORE": "?"},
    )
    strategy = ClientServerExecutionStrategy(
        role="algorithm", server_host="127.0.0.1", server_port=4848, managed_store=True
    )
    assert (strategy.role, strategy.server_host, strategy.server_port, strategy.managed_store) == (
        "algorithm",
        "127.0.0.1",
        4848,
        True,
    )


def test_the_trainer_port_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, {"AGL_SERVER_PORT": "5151"})
    assert agl.Trainer(port=6161).strategy.server_port == 6161  # type: ignore[attr-defined]
    assert agl.Trainer(strategy="cs", port=6161).strategy.server_port == 6161  # type: ignore[attr-defined]
    assert agl.Trainer().strategy.server_port == 5151  # type: ignore[attr-defined]


@pytest.mark.parametrize("role", ["algorithm", "runner"])
def test_the_trainer_port_zero_is_refused_for_a_split_role_strategy_instance(role: str) -> None:
    strategy = ClientServerExecutionStrategy(role=role, server_port=4848)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"port=0 .*role"):
        agl.Trainer(strategy=strategy, port=0)
    assert strategy.server_port == 4848


# ---------------------------------------------------------------------------------------------------------------
# AGL_MANAGED_STORE=false with a store that lives in this process


async def _algorithm(store: Any, event: ExecutionEvent) -> None:
    raise AssertionError("must not start")


async def _runner(store: Any, worker_id: int, event: ExecutionEvent) -> None:
    raise AssertionError("must not start")


@pytest.mark.parametrize("role", ["algorithm", "runner", "both"])
def test_an_unmanaged_store_that_cannot_be_shared_is_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    _set(monkeypatch, {"AGL_MANAGED_STORE": "false", "AGL_CURRENT_ROLE": role})
    strategy = ClientServerExecutionStrategy(server_host="127.0.0.1", n_runners=2 if role != "algorithm" else 1)
    with pytest.raises(ValueError, match=r"AGL_MANAGED_STORE=false .*InMemoryLightningStore"):
        strategy.execute(_algorithm, _runner, InMemoryLightningStore())


def test_a_trainer_with_an_unmanaged_in_memory_store_fails_before_the_agent_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _set(monkeypatch, {"AGL_MANAGED_STORE": "0"})
    ran: List[Any] = []

    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        ran.append(task)
        return 1.0

    trainer = agl.Trainer(strategy={"type": "cs", "server_host": "127.0.0.1"})
    with pytest.raises(ValueError, match=r"AGL_MANAGED_STORE=false"):
        trainer.dev(agent, [1, 2])
    assert ran == []


# ---------------------------------------------------------------------------------------------------------------
# One run split across two processes: the algorithm role and the runner role, configured by the environment only

SPLIT_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    import agentbolt as agl

    role, started = sys.argv[1], sys.argv[2]

    @agl.rollout
    async def agent(task, prompt_template: agl.PromptTemplate) -> float:
        with agl.operation(name="work"):  # a span of the rollout's own
            pass
        if task == "wait":
            open(started, "w").write("1")
            await asyncio.sleep(3600)
        return 1.0

    trainer = agl.Trainer(
        runner={"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.1, "heartbeat_interval": 1.0},
        initial_resources={"p": agl.PromptTemplate(template="x", engine="f-string")},
    )
    strategy = trainer.strategy
    print("strategy", strategy.role, strategy.server_host, strategy.server_port, flush=True)
    if role == "algorithm":
        trainer.dev(agent, sys.argv[3:], progress=False)
    else:
        trainer.fit(agent)
    print("returned", role, flush=True)
    """
)


def split_role_environment(role: str, port: int, server_id: Optional[str] = None) -> Dict[str, str]:
    """This process's environment, plus the variables that start :data:`SPLIT_SCRIPT` as ``role`` on ``port``."""
    env = {**os.environ, "AGL_CURRENT_ROLE": role, "AGL_SERVER_HOST": "127.0.0.1", "AGL_SERVER_PORT": str(port)}
    if server_id is not None:
        env["AGENTBOLT_STORE_SERVER_ID"] = server_id
    return env


def _start_role(
    role: str, port: int, started: Path, *tasks: str, server_id: Optional[str] = None
) -> subprocess.Popen[str]:
    env = split_role_environment(role, port, server_id)
    return subprocess.Popen(
        [sys.executable, "-c", SPLIT_SCRIPT, role, str(started), *tasks],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _interrupted(process: subprocess.Popen[str]) -> Tuple[int, str, str]:
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    return process.returncode, stdout, stderr


def _wait_until_exists(path: Path, *processes: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        for process in processes:
            assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path.name} was never written"
        time.sleep(0.1)


def test_an_algorithm_and_a_runner_started_with_the_variables_find_each_other_and_the_runner_stops_on_ctrl_c(
    tmp_path: Path,
) -> None:
    port = free_port()
    started = tmp_path / "started"
    runner = _start_role("runner", port, started, server_id="run-1")
    algorithm = _start_role("algorithm", port, started, "a", "b", "wait", server_id="run-1")
    try:
        _wait_until_exists(started, algorithm, runner)  # the runner ran "a" and "b" and is in "wait"
        code, stdout, stderr = _interrupted(runner)
        assert code == 0, stderr
        assert f"strategy runner 127.0.0.1 {port}" in stdout
        assert "returned runner" in stdout and "Traceback" not in stderr, stderr
        # The runner recorded its interrupted rollout as failed: the algorithm has every outcome and ends by itself.
        stdout, stderr = algorithm.communicate(timeout=120)
        assert algorithm.returncode == 0, stderr
        assert f"strategy algorithm 127.0.0.1 {port}" in stdout
        assert "returned algorithm" in stdout and "Traceback" not in stderr, stderr
    finally:
        for process in (algorithm, runner):
            if process.poll() is None:
                process.kill()
                process.communicate()


def test_the_algorithm_role_stops_on_ctrl_c_while_it_waits_for_runners(tmp_path: Path) -> None:
    port = free_port()
    algorithm = _start_role("algorithm", port, tmp_path / "started", "a")
    try:
        # Once its store server answers, the algorithm is waiting for a runner that never comes.
        wait_healthy(f"http://127.0.0.1:{port}{STORE_HEALTH_PATH}", timeout=120)
        code, stdout, stderr = _interrupted(algorithm)
        assert code == 0, stderr
        assert "returned algorithm" in stdout and "Traceback" not in stderr, stderr
    finally:
        if algorithm.poll() is None:
            algorithm.kill()
            algorithm.communicate()


@pytest.mark.parametrize("env", [{"AGL_CURRENT_ROLE": "wizard"}, {"AGL_CURRENT_ROLE": "runner"}])
def test_the_demo_refuses_the_variables_before_it_resolves_or_loads_the_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: Dict[str, str]
) -> None:
    from agentbolt.demo.run import GrpoRunConfig, fit_grpo

    _set(monkeypatch, env)
    # An empty model name fails as soon as the model is resolved: the variables must be refused before that.
    with pytest.raises(ValueError, match="AGL_CURRENT_ROLE"):
        fit_grpo(GrpoRunConfig(model=""), object(), [], [], tmp_path)


@pytest.mark.parametrize("strategy", ["cs", "ray"])
def test_every_strategy_refuses_a_blank_server_host_and_ignores_spaces_around_one(
    monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    from agentbolt.execution.ray import RayExecutionStrategy

    make = ClientServerExecutionStrategy if strategy == "cs" else RayExecutionStrategy
    _set(monkeypatch, {"AGL_SERVER_HOST": "   "})
    with pytest.raises(ValueError, match="AGL_SERVER_HOST must be a host name"):
        make()
    _set(monkeypatch, {"AGL_SERVER_HOST": " 127.0.0.1 "})
    assert make().server_host == "127.0.0.1"


def test_a_split_role_runner_given_a_server_id_never_works_for_a_store_with_another(tmp_path: Path) -> None:
    port = free_port()
    started = tmp_path / "started"
    algorithm = _start_role("algorithm", port, started, "wait", server_id="run-1")
    runner = _start_role("runner", port, started, server_id="run-2")
    try:
        assert runner.stderr is not None
        deadline = time.monotonic() + 120
        line = ""
        while "belongs to another run" not in line:
            assert time.monotonic() < deadline and runner.poll() is None, runner.communicate()
            line = runner.stderr.readline()
        assert "(id run-1)" in line
        time.sleep(1.0)
        assert not started.exists()  # the other run's rollout was never handed to this runner
    finally:
        for process in (algorithm, runner):
            if process.poll() is None:
                process.kill()
                process.communicate()


@pytest.mark.parametrize("value", ["", "two words", "x" * 129])
def test_a_server_id_that_cannot_name_a_store_is_refused_when_the_strategy_is_built(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTBOLT_STORE_SERVER_ID", value)
    with pytest.raises(ValueError, match=r"AGENTBOLT_STORE_SERVER_ID=.* cannot name a store server"):
        ClientServerExecutionStrategy(role="runner")
    ClientServerExecutionStrategy(role="both")  # a run with both roles makes its own
