"""Claude Code as an agent: each rollout runs the ``claude`` CLI on a coding task, with hooks that record its steps.

For a task (a few files, an instruction, a test command) the agent

1. writes the files into a fresh working directory and, in it, a ``.claude/settings.json`` whose hooks run
   ``examples.claude_code.hook_reporter`` on ``UserPromptSubmit``, ``PreToolUse``, ``PostToolUse`` and ``Stop``:
   each event becomes a span of the rollout, sent to the store server (``AGENTBOLT_STORE_URL``);
2. runs ``claude -p INSTRUCTION --output-format json --permission-mode acceptEdits`` there (``--model`` and
   ``--max-turns`` when given), with ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY`` passed on when configured, so
   the CLI can talk to Anthropic or to any Anthropic-compatible endpoint. Given an LLM gateway (``gateway_url``),
   ``ANTHROPIC_BASE_URL`` is the gateway's URL for this rollout's attempt, so every model call of the session is
   recorded as an LLM-call span of the rollout (with token ids when the model is served by agentbolt or vLLM);
3. writes the task's test scripts (its files the test command names) again as shipped, so a session that edits the
   tests instead of the code gains nothing, and runs the test command in the directory: the reward is 1.0 when it
   exits 0, else 0.0; the CLI's JSON result (turns, cost, session id) is recorded as a span too.

Run it on the shipped tasks (needs the ``claude`` CLI, ``npm install -g @anthropic-ai/claude-code``, and a store)::

    agl store --port 4747
    ANTHROPIC_API_KEY=sk-ant-... python -m examples.claude_code.claude_code_agent --store http://127.0.0.1:4747
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TypedDict

import agentbolt as agl
from examples.claude_code.hook_reporter import ENV_ATTEMPT, ENV_ROLLOUT, ENV_STORE
from examples.common.arguments import count
from examples.common.environment import require_reachable

REPO_ROOT = Path(__file__).resolve().parents[2]
TASKS = Path(__file__).with_name("tasks.jsonl")
HOOK_EVENTS = ("UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop")


class CodingTask(TypedDict):
    id: str
    instruction: str
    files: Dict[str, str]
    test_command: List[str]


def load_tasks(path: Path = TASKS) -> List[CodingTask]:
    """The shipped coding tasks."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def hook_settings(python: str = sys.executable) -> Dict[str, Any]:
    """Claude Code settings whose hooks report every event of :data:`HOOK_EVENTS` to the store."""
    command = f"{shlex.quote(python)} -m examples.claude_code.hook_reporter"
    hook = {"type": "command", "command": command, "timeout": 30}
    hooks: Dict[str, Any] = {}
    for event in HOOK_EVENTS:
        entry: Dict[str, Any] = {"hooks": [hook]}
        if event in ("PreToolUse", "PostToolUse"):
            entry["matcher"] = "*"
        hooks[event] = [entry]
    return {"hooks": hooks}


def shipped_tests(task: CodingTask) -> List[str]:
    """The task's files its test command names (the test scripts): the session must pass them, not edit them."""
    return [name for name in task["files"] if name in task["test_command"]]


def tests_command(task: CodingTask) -> List[str]:
    """The task's test command, a leading ``python`` or ``python3`` being the Python running this agent (the one
    ``python`` on the PATH may be missing or another)."""
    command = list(task["test_command"])
    if command and command[0] in ("python", "python3"):
        command[0] = sys.executable
    return command


def write_files(task: CodingTask, directory: Path, names: Sequence[str]) -> None:
    """Write the task's files ``names`` into ``directory`` as the task ships them.

    Raises:
        ValueError: A file would land outside ``directory``.
    """
    for name in names:
        target = (directory / name).resolve()
        if not target.is_relative_to(directory.resolve()):
            raise ValueError(f"task {task['id']}: file {name!r} is outside the working directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(task["files"][name], encoding="utf-8")


def prepare_workdir(task: CodingTask, directory: Path) -> Path:
    """Write the task's files and the hook settings; returns the settings file."""
    write_files(task, directory, list(task["files"]))
    settings = directory / ".claude" / "settings.json"
    settings.parent.mkdir(exist_ok=True)
    settings.write_text(json.dumps(hook_settings(), indent=2), encoding="utf-8")
    return settings


class ClaudeCodeAgent(agl.LitAgent[CodingTask]):
    """Runs the Claude Code CLI on one task per rollout (see the module docstring).

    Args:
        store_url: The store server the hooks report to (the one the runner uses).
        claude_command: The CLI (``["claude"]``; tests pass a stand-in executable).
        model: ``--model`` for the CLI (None: its default).
        max_turns: ``--max-turns`` (None: no limit).
        timeout: Seconds the CLI may run before it is stopped (the rollout then fails).
        anthropic_base_url: Endpoint the CLI calls (default: ``$ANTHROPIC_BASE_URL``, else Anthropic's).
        gateway_url: An agentbolt LLM gateway (``LLMProxy.endpoint``) the CLI calls through instead, at the URL of
            the rollout's attempt, so its calls are recorded in the rollout. ``model`` must then be a model name the
            gateway serves; it is also the CLI's small-model choice, so background calls go to the same backend.
    """

    def __init__(
        self,
        store_url: str,
        *,
        claude_command: Sequence[str] = ("claude",),
        model: Optional[str] = None,
        max_turns: Optional[int] = 10,
        timeout: float = 1800.0,
        anthropic_base_url: Optional[str] = None,
        gateway_url: Optional[str] = None,
    ) -> None:
        super().__init__()
        if anthropic_base_url and gateway_url:
            raise ValueError("give either anthropic_base_url or gateway_url, not both")
        self.store_url = store_url
        self.claude_command = list(claude_command)
        self.model = model
        self.max_turns = max_turns
        self.timeout = timeout
        self.anthropic_base_url = anthropic_base_url
        self.gateway_url = gateway_url.rstrip("/") if gateway_url else None

    def command(self, instruction: str, settings: Path) -> List[str]:
        """The CLI's arguments for one task."""
        argv = [*self.claude_command, "-p", instruction, "--output-format", "json", "--settings", str(settings)]
        argv += ["--permission-mode", "acceptEdits"]
        if self.model:
            argv += ["--model", self.model]
        if self.max_turns is not None:
            argv += ["--max-turns", str(self.max_turns)]
        return argv

    def environment(self, rollout: agl.Rollout) -> Dict[str, str]:
        """The CLI's environment: the hook reporter's variables, the repository importable, the endpoint."""
        env = dict(os.environ)
        env.update(
            {ENV_STORE: self.store_url, ENV_ROLLOUT: rollout.rollout_id, ENV_ATTEMPT: rollout.attempt.attempt_id}
        )
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        if self.anthropic_base_url:
            env["ANTHROPIC_BASE_URL"] = self.anthropic_base_url
        if self.gateway_url:
            attempt = f"/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}"
            env["ANTHROPIC_BASE_URL"] = self.gateway_url + attempt
            if self.model:
                env["ANTHROPIC_SMALL_FAST_MODEL"] = env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] = self.model
        return env

    async def rollout_async(self, task: CodingTask, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        with tempfile.TemporaryDirectory(prefix=f"claude-code-{task['id']}-") as folder:
            directory = Path(folder)
            settings = prepare_workdir(task, directory)
            process = await asyncio.create_subprocess_exec(
                *self.command(task["instruction"], settings), cwd=directory, env=self.environment(rollout),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            try:
                stdout, stderr = await asyncio.wait_for(process.communicate(), self.timeout)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
                raise RuntimeError(f"task {task['id']}: claude did not finish within {self.timeout:g} s") from None
            if process.returncode != 0:
                raise RuntimeError(f"task {task['id']}: claude exited {process.returncode}: {stderr.decode()[-500:]}")
            result = json.loads(stdout.decode() or "{}")
            agl.emit_object(
                {key: result.get(key) for key in ("subtype", "is_error", "num_turns", "total_cost_usd", "session_id")}
            )
            write_files(task, directory, shipped_tests(task))  # an edited test proves nothing: run the shipped one
            test = subprocess.run(tests_command(task), cwd=directory, capture_output=True, timeout=120)
            return 1.0 if test.returncode == 0 and not result.get("is_error") else 0.0


def main(argv: Optional[List[str]] = None) -> int:
    """Run the shipped tasks; returns 0 when every rollout succeeded, 1 when one did not, 2 without the CLI (and exits 2
    when the store or the gateway does not answer)."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.claude_code.claude_code_agent", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--store", default="http://127.0.0.1:4747", help="a running agl store")
    parser.add_argument("--claude", default="claude", help="the Claude Code CLI command")
    parser.add_argument("--model", default=None)
    parser.add_argument("--max-turns", type=count(1), default=10)
    parser.add_argument("--gateway", default=None, help="an agentbolt LLM gateway recording the CLI's model calls")
    args = parser.parse_args(argv)
    claude_command = shlex.split(args.claude)
    if not claude_command or shutil.which(claude_command[0]) is None:
        print(
            f"error: the Claude Code CLI {args.claude!r} was not found; install it "
            "(npm install -g @anthropic-ai/claude-code) or give its command with --claude",
            file=sys.stderr,
        )
        return 2
    require_reachable(
        parser,
        args.store,
        service="the store",
        configure="start one (agl store --port PORT) and give its URL with --store",
    )
    if args.gateway is not None:
        require_reachable(
            parser,
            args.gateway,
            service="the LLM gateway",
            configure="start one (agentbolt proxy --config models.yaml --store URL --port PORT) or drop --gateway",
        )
    agl.setup_logging("INFO")
    agent = ClaudeCodeAgent(
        args.store,
        claude_command=claude_command,
        model=args.model,
        max_turns=args.max_turns,
        gateway_url=args.gateway,
    )
    failed = asyncio.run(run_tasks(agent, args.store, load_tasks()))
    if failed:
        print(f"error: {failed} of the rollouts did not succeed; see the log above", file=sys.stderr)
        return 1
    return 0


async def run_tasks(agent: ClaudeCodeAgent, store_url: str, tasks: List[CodingTask]) -> int:
    """Enqueue the tasks in the store and run them with one runner; prints each rollout's status and reward.

    Returns the number of rollouts that did not succeed.
    """
    store = agl.LightningStoreClient(store_url)
    runner = agl.LitAgentRunner(agl.AgentOpsTracer(), max_rollouts=len(tasks))
    try:
        # The agent needs no resource (the CLI picks its model), but a runner only starts rollouts that have some.
        resources = await store.add_resources({})
        ids = [
            (await store.enqueue_rollout(input=task, resources_id=resources.resources_id)).rollout_id  # type: ignore[arg-type]
            for task in tasks
        ]
        with runner.run_context(agent=agent, store=store):
            await runner.iter()
        failed = 0
        for rollout_id, task in zip(ids, tasks, strict=True):
            [rollout] = await store.query_rollouts(rollout_id_in=[rollout_id])
            reward = agl.find_final_reward(await store.query_spans(rollout_id, "latest"))
            print(f"{task['id']}: {rollout.status}, reward {reward}")
            failed += rollout.status != "succeeded"
        return failed
    finally:
        await store.close()


if __name__ == "__main__":
    raise SystemExit(main())
