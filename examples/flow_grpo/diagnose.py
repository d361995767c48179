"""Measure where the solver fails: ``python -m examples.flow_grpo.diagnose --planner greedy|sample|oracle``.

Before training a planner it is worth knowing whether the planner *can* decide success: if the fixed roles cannot
turn a right plan into a right answer, no amount of planner training helps. This script solves a split and reports
held-out success per source and where each failure happened:

* ``--planner greedy`` / ``sample``: the real planner (the base model, or ``--checkpoint``) at temperature 0 or
  ``--temperature``;
* ``--planner oracle``: a scripted planner that follows each task's reference plan (``extra_info.plan``: the
  tool and sub-goal of every step, written by the dataset generator), then stops; tasks without a plan get one step:
  the tool named for their source (``--oracle-tool SOURCE=TOOL``) with the question as sub-goal. Its success is the
  ceiling that planner training can reach with these fixed roles. With ``--planner-guide question`` it follows the
  reference plan's tools with the question as every sub-goal: the ceiling of a planner guided that way.

Failure categories (first match): ``planner_invalid`` (no valid JSON step), ``planner_unknown_tool``,
``planner_stopped_at_once`` (the stop action before any tool), ``tool_error`` (the chosen tool returned an error or
nothing), ``answer_not_copied`` (a gold answer is in a tool result but the final answer is wrong),
``wrong_result`` (the tools never produced the answer).

Examples::

    python -m examples.flow_grpo.diagnose --planner oracle
    python -m examples.flow_grpo.diagnose --planner sample --temperature 0.8 --samples 2 --json /tmp/diag.jsonl
    python -m examples.flow_grpo.diagnose --checkpoint runs/flow-grpo/cpu-.../checkpoints
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from examples.flow_grpo.agents import RoleLLM, chat_messages, is_stop_action
from examples.flow_grpo.prompts import STOP_ACTION, planner_step
from examples.flow_grpo.reward import RuleReward, gold_answers
from examples.flow_grpo.solver import FlowSolver, SolverConfig, SolveResult

__all__ = ["DEFAULT_ORACLE_TOOLS", "OraclePlanner", "classify", "main", "oracle_steps"]

DEFAULT_ORACLE_TOOLS = {"arithmetic": "calculator", "fact": "search"}
"""The oracle's tool for tasks without a reference plan, by source."""


class OraclePlanner(RoleLLM):
    """A scripted planner for one question: each ``(tool, sub_goal)`` step in turn, then the stop action.

    It answers in the planner's JSON format without calling a model, so the rest of the solver runs unchanged, and
    keeps each call's chat messages with its answer in :attr:`turns` (the planner's training conversations).
    """

    def __init__(self, steps: Sequence[Tuple[str, str]]) -> None:
        super().__init__(client=None, model="oracle")  # type: ignore[arg-type]
        self.steps = list(steps)
        self.turns: List[List[Dict[str, str]]] = []

    def chat(self, role: str, system: str, user: str, **kwargs: Any) -> str:
        """The scripted step; the prompt is recorded with it."""
        index = len(self.turns)
        tool, sub_goal = self.steps[index] if index < len(self.steps) else (STOP_ACTION, "")
        answer = planner_step(tool, sub_goal)
        messages = chat_messages(system, user, kwargs.get("examples", ()))
        self.turns.append([*messages, {"role": "assistant", "content": answer}])
        return answer

    def close(self) -> None:
        """Nothing to close."""


def oracle_steps(
    task: Mapping[str, Any], tools_by_source: Mapping[str, str], question_sub_goals: bool = False
) -> Optional[List[Tuple[str, str]]]:
    """The oracle's steps for a task: its reference plan, else its source's tool on the question; None if neither.

    With ``question_sub_goals`` every step's sub-goal is the question, as a planner guided with
    ``planner_guide: question`` writes it: the oracle then follows the reference plan's tools only.
    """
    extra = task.get("extra_info") or {}
    plan = extra.get("plan") if isinstance(extra, Mapping) else None
    if plan:
        question = str(task["question"])
        return [(str(step["tool"]), question if question_sub_goals else str(step["sub_goal"])) for step in plan]
    tool = tools_by_source.get(str(task.get("source")))
    return None if tool is None else [(tool, str(task["question"]))]


def classify(task: Mapping[str, Any], result: SolveResult, reward: float) -> str:
    """The failure category of a solve (``"success"`` when the reward is 1; see the module docstring)."""
    if reward >= 1.0:
        return "success"
    first = result.turns[0]
    if not first.plan_valid:
        return "planner_invalid"
    if is_stop_action(first.plan):
        return "planner_stopped_at_once"
    if any(t.observation is not None and not t.known_action for t in result.turns):
        return "planner_unknown_tool"
    observations = [t.observation or "" for t in result.turns if t.known_action and t.observation is not None]
    if any(g.lower() in obs.lower() for obs in observations for g in gold_answers(task)):
        return "answer_not_copied"
    if observations and all(obs.startswith(("Error", "No passage")) for obs in observations):
        return "tool_error"
    return "wrong_result"


def _parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.flow_grpo.diagnose", description="Success per source and where the solver fails."
    )
    parser.add_argument("--planner", choices=["greedy", "sample", "oracle"], default="greedy")
    parser.add_argument("--split", default="val", help="'train', 'val' or a task file (default: val).")
    parser.add_argument("--limit", type=int, default=None, help="Use the first N tasks.")
    parser.add_argument("--samples", type=int, default=1, help="Solves per task (default 1).")
    parser.add_argument("--temperature", type=float, default=0.7, help="Planner temperature with --planner sample.")
    parser.add_argument(
        "--oracle-tool",
        action="append",
        default=[],
        metavar="SOURCE=TOOL",
        help="Oracle tool for a source's tasks without a reference plan (default: arithmetic=calculator, fact=search).",
    )
    parser.add_argument("--max-turns", type=int, default=3, help="Planner turns at most (default 3).")
    parser.add_argument(
        "--planner-guide",
        choices=["none", "tools", "question"],
        default="none",
        help="Guide the planner's decoding (SolverConfig.planner_guide; default none).",
    )
    parser.add_argument("--workers", type=int, default=12, help="Questions solved concurrently (default 12).")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="Base model served locally for every role.")
    parser.add_argument("--checkpoint", type=Path, help="Planner checkpoint (as in examples.flow_grpo.solve).")
    parser.add_argument("--planner-url", help="OpenAI-compatible base URL of the planner (instead of a local model).")
    parser.add_argument("--planner-model", help="Model name at --planner-url.")
    parser.add_argument("--fixed-url", help="Base URL of the fixed model (default: --planner-url).")
    parser.add_argument("--fixed-model", help="Model name at --fixed-url (default: --planner-model).")
    parser.add_argument(
        "--dtype",
        default="auto",
        help="Local engine dtype (default auto: bfloat16 where the CPU multiplies it natively, else float32).",
    )
    parser.add_argument("--threads", type=int, default=None, help="Local engine CPU threads.")
    parser.add_argument("--json", type=Path, default=None, help="Write one JSON record per solve here.")
    args = parser.parse_args(argv)
    if args.split not in ("train", "val") and not Path(args.split).is_file():
        parser.error(f"--split {args.split}: not 'train', 'val' or a task file")
    for name in ("limit", "samples", "max_turns", "workers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if (args.planner_url is None) != (args.planner_model is None):
        parser.error("--planner-url and --planner-model go together")
    tools = dict(DEFAULT_ORACLE_TOOLS)
    for item in args.oracle_tool:
        source, sep, tool = item.partition("=")
        if not sep or not source or not tool:
            parser.error(f"--oracle-tool expects SOURCE=TOOL, got {item!r}")
        tools[source] = tool
    args.oracle_tools = tools
    from examples.flow_grpo.solve import resolve_checkpoint_argument

    resolve_checkpoint_argument(parser, args)
    return args


def _load_tasks(split: str, limit: Optional[int]) -> List[Dict[str, Any]]:
    from examples.flow_grpo.data import load_offline_dataset, load_tasks

    tasks = load_offline_dataset(split) if split in ("train", "val") else load_tasks(split)
    return [dict(t) for t in tasks[:limit]]


def main(argv: Optional[List[str]] = None) -> int:
    """Command-line entry point; returns the exit status (2 for bad arguments, via argparse)."""
    args = _parse_args(argv)
    tasks = _load_tasks(args.split, args.limit)
    if args.planner == "oracle":
        unknown = sorted({str(t.get("source")) for t in tasks if oracle_steps(t, args.oracle_tools) is None})
        if unknown:
            print(f"error: no --oracle-tool for source(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
    temperature = args.temperature if args.planner == "sample" else 0.0
    solver = FlowSolver(SolverConfig(max_turns=args.max_turns, planner_guide=args.planner_guide))
    reward_fn = RuleReward()
    with contextlib.ExitStack() as stack:
        from examples.flow_grpo.solve import open_endpoints

        planner_url, planner_model, fixed_url, fixed_model = open_endpoints(args, stack)

        def solve(task: Dict[str, Any]) -> Dict[str, Any]:
            fixed = RoleLLM.from_endpoint(fixed_url, fixed_model)
            planner: RoleLLM
            if args.planner == "oracle":
                steps = oracle_steps(task, args.oracle_tools, question_sub_goals=args.planner_guide == "question")
                planner = OraclePlanner(steps or [])
            else:
                planner = RoleLLM.from_endpoint(
                    planner_url, planner_model, sampling_parameters={"temperature": temperature}
                )
            try:
                result = solver.solve(task["question"], planner, fixed)
            except Exception as exc:  # an endpoint failure costs this solve only; it is reported as an error
                return _error_record(task, exc)
            finally:
                planner.close()
                fixed.close()
            reward = float(reward_fn(task, result.answer))
            return {
                "id": task.get("id"),
                "source": task.get("source"),
                "question": task["question"],
                "gold": gold_answers(task),
                "answer": result.answer,
                "reward": reward,
                "category": classify(task, result, reward),
                "first_action": result.turns[0].plan.tool_name if result.turns[0].plan_valid else "(invalid)",
                "planner_turns": result.planner_calls,
                "tool_calls": len(result.memory.actions),
                "stop_reason": result.stop_reason,
                "steps": result.memory.to_list(),
            }

        started = time.perf_counter()
        jobs = [task for task in tasks for _ in range(args.samples)]
        with ThreadPoolExecutor(args.workers) as pool:
            records = list(pool.map(solve, jobs))
        wall = time.perf_counter() - started
    _report(records, args.planner, wall)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return 0


def _error_record(task: Mapping[str, Any], exc: Exception) -> Dict[str, Any]:
    return {
        "id": task.get("id"),
        "source": task.get("source"),
        "question": task["question"],
        "gold": gold_answers(task),
        "answer": "",
        "reward": 0.0,
        "category": "error",
        "error": f"{type(exc).__name__}: {exc}",
        "first_action": "(error)",
        "planner_turns": 0,
        "tool_calls": 0,
        "stop_reason": "error",
        "steps": [],
    }


def _report(records: List[Dict[str, Any]], planner: str, wall: float) -> None:
    solved = sum(1 for r in records if r["reward"] >= 1.0)
    print(f"planner={planner}: {solved}/{len(records)} solved ({100 * solved / len(records):.1f} %) in {wall:.0f} s")
    by_source: Dict[str, List[int]] = collections.defaultdict(lambda: [0, 0])
    for record in records:
        by_source[str(record["source"])][0] += int(record["reward"] >= 1.0)
        by_source[str(record["source"])][1] += 1
    for source, (ok, total) in sorted(by_source.items()):
        actions = collections.Counter(r["first_action"] for r in records if r["source"] == source)
        common = ", ".join(f"{name} {count}" for name, count in actions.most_common(5))
        print(f"  {source}: {ok}/{total} solved; first planner action: {common}")
    categories = collections.Counter(r["category"] for r in records)
    print("  outcomes: " + ", ".join(f"{name} {count}" for name, count in categories.most_common()))
    stops = collections.Counter(r["stop_reason"] for r in records)
    turns = sum(r["planner_turns"] for r in records) / len(records)
    tools = sum(r["tool_calls"] for r in records) / len(records)
    print(
        f"  per question: {turns:.2f} planner turns, {tools:.2f} tool calls; stop reasons: "
        + ", ".join(f"{name} {count}" for name, count in stops.most_common())
    )
    by_task: Dict[Any, List[float]] = collections.defaultdict(list)
    for record in records:
        by_task[record["id"]].append(record["reward"])
    if any(len(rewards) > 1 for rewards in by_task.values()):
        mixed = sum(1 for rewards in by_task.values() if 0 < sum(r >= 1.0 for r in rewards) < len(rewards))
        print(f"  questions with both solved and failed samples (GRPO groups with signal): {mixed}/{len(by_task)}")


if __name__ == "__main__":
    raise SystemExit(main())
