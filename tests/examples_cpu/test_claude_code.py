"""The Claude Code driver and its hooks, with the CLI replaced by a stand-in executable (claude_stand_in/claude)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest
from support.fake_openai import MODEL, FakeOpenAIServer
from support.servers import free_port

import agentbolt as agl
from agentbolt.store.client_server import LightningStoreClient, LightningStoreServer
from examples.claude_code.claude_code_agent import ClaudeCodeAgent, hook_settings, load_tasks, prepare_workdir

STAND_IN = [sys.executable, str(Path(__file__).with_name("claude_stand_in") / "claude")]


async def run_task(task: Any, claude: List[str], backend_url: Optional[str] = None) -> Tuple[float, List[agl.Span]]:
    """Run one task; with ``backend_url``, the CLI calls an LLM gateway in front of that OpenAI-compatible backend."""
    server = LightningStoreServer(agl.InMemoryLightningStore(thread_safe=True), host="127.0.0.1", port=free_port())
    await server.start()
    client = LightningStoreClient(server.endpoint)
    tracer = agl.OtelTracer()
    tracer.init_worker(0, client)
    proxy = None
    if backend_url is not None:
        model_list = [
            {"model_name": "coder", "litellm_params": {"model": f"hosted_vllm/{MODEL}", "api_base": backend_url}}
        ]
        proxy = agl.LLMProxy(model_list=model_list, store=client, launch_mode="asyncio")
        await proxy.start()
    try:
        rollout = await client.start_rollout(input=task)
        gateway = {"model": "coder", "gateway_url": proxy.endpoint} if proxy is not None else {}
        agent = ClaudeCodeAgent(server.endpoint, claude_command=claude, max_turns=5, **gateway)  # type: ignore[arg-type]
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
            reward = await agent.rollout_async(task, {}, rollout)
        if proxy is not None:
            await proxy.flush()
        return reward, list(await client.query_spans(rollout.rollout_id, sort_by="sequence_id"))
    finally:
        if proxy is not None:
            await proxy.stop()
        tracer.teardown_worker(0)
        await client.close()
        await server.stop()


def test_a_session_fixes_the_task_and_its_hook_events_become_spans() -> None:
    task = load_tasks()[0]
    reward, spans = asyncio.run(run_task(task, STAND_IN))
    assert reward == 1.0
    hooks = [span for span in spans if span.name.startswith("claude_code.")]
    assert [span.name for span in hooks] == [
        "claude_code.UserPromptSubmit", "claude_code.PreToolUse", "claude_code.PostToolUse",
        "claude_code.PreToolUse", "claude_code.PostToolUse", "claude_code.Stop",
    ]  # fmt: skip
    edit = hooks[4].attributes
    assert edit["tool.name"] == "Edit" and json.loads(edit["tool.parameters"])["new_string"] == "return a + b"
    assert hooks[0].attributes["claude_code.prompt"] == task["instruction"]
    assert len({span.attributes["claude_code.session_id"] for span in hooks}) == 1
    result = next(span for span in spans if span.name == "agentlightning.object")
    assert "num_turns" in json.dumps(dict(result.attributes))


def test_through_the_gateway_the_clis_model_calls_are_spans_of_the_rollout() -> None:
    task = load_tasks()[0]
    with FakeOpenAIServer() as backend:
        reward, spans = asyncio.run(run_task(task, STAND_IN, backend.base_url))
        sent = backend.config.requests
    [call] = [span for span in spans if span.name == "agentbolt.llm_call"]
    attrs = call.attributes
    assert reward == 1.0 and sent[0]["return_token_ids"] is True and sent[0]["model"] == MODEL
    assert attrs["gen_ai.prompt.0.role"] == "system" and attrs["gen_ai.prompt.1.content"] == task["instruction"]
    assert attrs["gen_ai.request.functions.0.name"] == "Read"
    assert attrs["gen_ai.completion.0.tool_calls.0.name"] == "Read"
    assert attrs["prompt_token_ids"] and attrs["response_token_ids"]
    assert call.sequence_id < min(span.sequence_id for span in spans if span.name == "claude_code.Stop")


def test_an_unfixed_task_scores_zero(tmp_path: Path) -> None:
    # A CLI that changes nothing: the task's tests still fail.
    script = tmp_path / "idle-claude"
    script.write_text('import json\nprint(json.dumps({"type": "result", "subtype": "success", "is_error": False}))\n')
    reward, spans = asyncio.run(run_task(load_tasks()[2], [sys.executable, str(script)]))
    assert reward == 0.0 and not [span for span in spans if span.name.startswith("claude_code.")]


def test_a_session_that_rewrites_the_tests_instead_of_the_code_scores_zero(tmp_path: Path) -> None:
    # A CLI that makes the test script pass by emptying it (and breaks nothing else): the tests the task ships run.
    task = load_tasks()[0]
    script = tmp_path / "cheating-claude"
    script.write_text(
        "import json, pathlib\n"
        "pathlib.Path('test_mathutils.py').write_text(\"print('ok')\\n\")\n"
        'print(json.dumps({"type": "result", "subtype": "success", "is_error": False}))\n'
    )
    reward, _ = asyncio.run(run_task(task, [sys.executable, str(script)]))
    assert reward == 0.0


def test_the_tests_run_with_this_python_when_python_is_not_on_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `python` there: only python3 on some systems
    reward, _ = asyncio.run(run_task(load_tasks()[0], STAND_IN))
    assert reward == 1.0


def test_a_failing_cli_fails_the_rollout_with_its_message(tmp_path: Path) -> None:
    script = tmp_path / "broken-claude"
    script.write_text("import sys\nsys.stderr.write('Invalid API key')\nsys.exit(1)\n")
    with pytest.raises(RuntimeError, match="claude exited 1: Invalid API key"):
        asyncio.run(run_task(load_tasks()[1], [sys.executable, str(script)]))


def test_settings_hook_every_event_and_files_stay_in_the_working_directory(tmp_path: Path) -> None:
    settings = hook_settings("python3")
    assert set(settings["hooks"]) == {"UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"}
    assert settings["hooks"]["PreToolUse"][0]["matcher"] == "*"
    escaping = {"id": "x", "instruction": "", "files": {"../outside.py": ""}, "test_command": ["true"]}
    with pytest.raises(ValueError, match="outside the working directory"):
        prepare_workdir(escaping, tmp_path)  # type: ignore[arg-type]


def test_the_hook_reporter_never_breaks_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run([sys.executable, "-m", "examples.claude_code.hook_reporter"], input="{not json",
                            capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert result.returncode == 0 and "agentbolt hook reporter" in result.stderr


async def _run_tasks_on_a_fresh_store(claude: List[str], tasks: List[Any]) -> int:
    from examples.claude_code.claude_code_agent import run_tasks

    server = LightningStoreServer(agl.InMemoryLightningStore(thread_safe=True), host="127.0.0.1", port=free_port())
    await server.start()
    try:
        return await run_tasks(
            ClaudeCodeAgent(server.endpoint, claude_command=claude, max_turns=5), server.endpoint, tasks
        )
    finally:
        await server.stop()


def test_the_script_runs_its_tasks_to_success(capsys: pytest.CaptureFixture[str]) -> None:
    task = load_tasks()[0]
    assert asyncio.run(_run_tasks_on_a_fresh_store(STAND_IN, [task])) == 0
    assert f"{task['id']}: succeeded, reward 1.0" in capsys.readouterr().out


def test_the_script_counts_failed_rollouts(tmp_path: Path) -> None:
    script = tmp_path / "broken-claude"
    script.write_text("import sys\nsys.stderr.write('Invalid API key')\nsys.exit(1)\n")
    assert asyncio.run(_run_tasks_on_a_fresh_store([sys.executable, str(script)], load_tasks()[:1])) == 1


def test_the_script_exits_2_naming_a_missing_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from examples.claude_code.claude_code_agent import main

    missing = str(tmp_path / "no-such-claude")
    assert main(["--claude", missing, "--store", f"http://127.0.0.1:{free_port()}"]) == 2
    assert f"the Claude Code CLI {missing!r} was not found" in capsys.readouterr().err
